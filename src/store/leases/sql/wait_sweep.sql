-- Takes out of the queues the waiters that no longer wait: $1 this instance's id, $2 the ids of
-- the waiters this instance holds. Those of a dead instance (waiter_instance_alive: its liveness
-- lock is free once its connection closed), and this instance's rows that none of its requests
-- holds any more (a leave that could not be sent, an enqueue whose answer was lost), once they
-- are old enough that no request can still be about to hold them (an enqueue answers within the
-- request's bound of at most a few seconds). Acquires already skip a dead instance's waiters
-- (acquire.sql), so this only frees the rows and, through the trigger on lease_waiters, wakes
-- the next waiter of a key a dead one was about to take. Each instance with waiters of its own
-- runs it twice a second, so a dead instance's waiters are gone within a second.
--
-- Answers the waiters of this instance whose rows are gone without an answer from the acquire
-- statement (another instance's sweep took them out while this one did not answer: it was
-- frozen past its --waiter-stall-bound, see 20261205200001_waiter_instances_stall.sql): they
-- were passed over, and each makes one last try. (The statement's snapshot still sees the rows
-- it deletes itself, which are never among them.)
WITH swept AS (
    DELETE FROM lease_waiters
    WHERE (instance <> $1 AND NOT waiter_instance_alive(instance))
        OR (instance = $1 AND id <> ALL($2::bigint[]) AND at < now() - interval '30 seconds'))
SELECT h.id FROM unnest($2::bigint[]) AS h(id)
WHERE NOT EXISTS (SELECT FROM lease_waiters w WHERE w.id = h.id)
