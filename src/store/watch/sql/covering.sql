-- The last id of the first epoch above $2 holding every change snapshot $1 sees, or NULL: one whose
-- snapshot reaches $1's xmax and saw running no transaction $1 sees ended. Later epochs hold them
-- too.
SELECT min(last_id) AS last_id
FROM change_epochs
WHERE last_id > $2
    AND pg_snapshot_xmax(snap) >= pg_snapshot_xmax($1::pg_snapshot)
    AND NOT EXISTS (
        SELECT FROM pg_snapshot_xip(snap) AS running (xid)
        WHERE running.xid < pg_snapshot_xmax($1::pg_snapshot)
            AND running.xid <> ALL (ARRAY(SELECT pg_snapshot_xip($1::pg_snapshot))))
