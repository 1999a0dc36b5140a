-- The relay drops up to $2 changes numbered more than $1 milliseconds ago, oldest first, and
-- moves the horizon past them: a watch resumed from before it is answered 410 compacted.
WITH gone AS (
    DELETE FROM changes
    WHERE id IN (SELECT id FROM changes
        WHERE recorded_at < clock_timestamp() - $1 * interval '1 millisecond'
        ORDER BY id LIMIT $2)
    RETURNING id)
UPDATE change_horizon SET pruned_through = greatest(pruned_through, (SELECT max(id) FROM gone))
WHERE EXISTS (SELECT FROM gone)
RETURNING (SELECT count(*) FROM gone) AS pruned
