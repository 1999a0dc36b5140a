-- Whether any change committed since the newest epoch's snapshot: the relay's check while it
-- has nothing else to do (reads only; an epoch is written only when this is true).
SELECT EXISTS (
    SELECT FROM (SELECT snap FROM change_epochs ORDER BY last_id DESC LIMIT 1) e
    CROSS JOIN LATERAL epoch_changes(e.snap, pg_current_snapshot()) c)
