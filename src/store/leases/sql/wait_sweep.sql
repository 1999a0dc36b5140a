-- Removes waiters that no longer wait ($1 this instance, $2 the ids it holds): those of dead
-- instances, and this instance's unheld rows once no enqueue can still answer them. Acquires
-- already skip dead waiters; this frees rows and wakes next waiters through the trigger.
--
-- Answers this instance's waiters whose rows another sweep removed while it was frozen: each makes
-- one last try.
WITH swept AS (
    DELETE FROM lease_waiters
    WHERE (instance <> $1 AND NOT waiter_instance_alive(instance))
        OR (instance = $1 AND id <> ALL($2::bigint[]) AND at < now() - interval '30 seconds'))
SELECT h.id FROM unnest($2::bigint[]) AS h(id)
WHERE NOT EXISTS (SELECT FROM lease_waiters w WHERE w.id = h.id)
