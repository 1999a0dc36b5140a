-- The last id of the first epoch above $2 that holds every change the snapshot $1 sees (a
-- watch's opening, opening.sql), or NULL while the relay has made none. An epoch holds them
-- once its own snapshot sees all that $1 sees: it reaches as far (`xmax`), and no transaction
-- it still saw running had ended by $1 (one that had is visible in $1 and would be missing
-- from the epoch). Snapshots only grow, so every later epoch holds them too.
SELECT min(last_id) AS last_id
FROM change_epochs
WHERE last_id > $2
    AND pg_snapshot_xmax(snap) >= pg_snapshot_xmax($1::pg_snapshot)
    AND NOT EXISTS (
        SELECT FROM pg_snapshot_xip(snap) AS running (xid)
        WHERE running.xid < pg_snapshot_xmax($1::pg_snapshot)
            AND running.xid <> ALL (ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot))))
