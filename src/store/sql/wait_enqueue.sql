-- Waiting acquires take their places at the end of their keys' queues, a batch at a time: $1 the
-- keys, in the order the requests arrived at this instance, $2 this instance's id (the objid of
-- its liveness lock). Answers each request's (`i`) waiter id, its place in the queue: ids are
-- drawn in the batch's order (nextval in the target list runs after the ORDER BY), so waiters
-- that reach one instance one after the other are queued in that order.
--
-- One autocommit statement: the rows are visible to every acquire that starts after it commits,
-- and each waiter's first try (acquire_wait_in.sql) runs only after that, so a release that
-- commits after a waiter's first try saw the key held finds the row and wakes it (the trigger on
-- leases), and one that committed before is seen by that try.
WITH r AS (
    SELECT q.i, q.key, nextval(pg_get_serial_sequence('lease_waiters', 'id')) AS id
    FROM unnest($1::text[]) WITH ORDINALITY AS q(key, i)
    ORDER BY q.i),
queued AS (
    INSERT INTO lease_waiters (id, key, instance) OVERRIDING SYSTEM VALUE
    SELECT id, key, $2 FROM r)
SELECT i, id FROM r
