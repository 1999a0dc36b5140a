-- Where a watch without `since` starts: from one snapshot, the snapshot itself, the highest id
-- given, and whether a visible change lacks an id yet.
SELECT pg_current_snapshot()::text AS snap,
    (SELECT max(last_id) FROM change_epochs) AS top,
    EXISTS (
        SELECT FROM (SELECT snap FROM change_epochs ORDER BY last_id DESC LIMIT 1) e
        CROSS JOIN LATERAL epoch_changes(e.snap, pg_current_snapshot()) c) AS pending
