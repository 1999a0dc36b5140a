-- Drops up to $2 epochs older than $1 ms with their changes and moves the horizon past them. The
-- newest epoch's row stays: the next starts from it.
WITH cut AS (
    SELECT first_id, last_id, snap FROM change_epochs
    WHERE made_at < clock_timestamp() - $1 * interval '1 millisecond'
    ORDER BY last_id LIMIT $2),
top AS (
    SELECT last_id, snap FROM cut ORDER BY last_id DESC LIMIT 1),
epochs_gone AS (
    DELETE FROM change_epochs e USING cut
    WHERE e.first_id = cut.first_id AND e.last_id < (SELECT max(last_id) FROM change_epochs)),
changes_gone AS (
    DELETE FROM change_log c USING top
    WHERE c.xid < pg_snapshot_xmax(top.snap) AND pg_visible_in_snapshot(c.xid, top.snap))
UPDATE change_horizon SET pruned_through = greatest(pruned_through, top.last_id)
FROM top
