-- Whether any change committed since the newest epoch's snapshot.
SELECT EXISTS (
    SELECT FROM (SELECT snap FROM change_epochs ORDER BY last_id DESC LIMIT 1) e
    CROSS JOIN LATERAL epoch_changes(e.snap, pg_current_snapshot()) c)
