-- Where a watch without `since` starts (src/store/watch/mod.rs, `Opening`): this statement's
-- snapshot, the highest id given, and whether a change it sees has no id yet (committed since
-- the newest epoch's snapshot: the relay numbers it at its next turn; waiting.sql is the relay's
-- own check, which needs no snapshot beside it). All three from the one
-- snapshot, so when nothing is pending every change it sees is at or below `top`.
SELECT pg_current_snapshot()::text AS snap,
    (SELECT max(last_id) FROM change_epochs) AS top,
    EXISTS (
        SELECT FROM (SELECT snap FROM change_epochs ORDER BY last_id DESC LIMIT 1) e
        CROSS JOIN LATERAL epoch_changes(e.snap, pg_current_snapshot()) c) AS pending
