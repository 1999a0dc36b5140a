-- src/store/rendered/wait_enqueue.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- Waiting acquires take their places at the end of their keys' queues, a batch at a time: $1 the
-- keys, in the order the requests arrived at this instance, $2 this instance's id (the objid of
-- its liveness lock), $3 and $4 each request's principal ('' without authentication) and
-- Idempotency-Key (NULL when none was sent), $5 each request's owner (kept beside its place in
-- lease_waiter_owners, for sql/waiters_list.sql). Answers each request's (`i`) waiter id, its place in
-- the queue: ids are drawn in the batch's order (nextval in the target list runs after the
-- ORDER BY), so waiters that reach one instance one after the other are queued in that order.
-- The id is NULL when a waiter with the same Idempotency-Key of the same principal is already
-- queued (the unique index lease_waiters_idem, 20261205200000_waiter_idempotency.sql): that
-- request is still running, and this one takes no place.
--
-- One autocommit statement: the rows are visible to every acquire that starts after it commits,
-- and each waiter's first try (acquire.sql with its `waiter`) runs only after that, so a release that
-- commits after a waiter's first try saw the key held finds the row and wakes it (the trigger on
-- leases), and one that committed before is seen by that try.
WITH r AS (
    SELECT q.i, q.key, q.principal, q.idem, q.owner,
        nextval(pg_get_serial_sequence('lease_waiters', 'id')) AS id
    FROM unnest($1::text[], $3::text[], $4::text[], $5::text[])
        WITH ORDINALITY AS q(key, principal, idem, owner, i)
    ORDER BY q.i),
queued AS (
    INSERT INTO lease_waiters (id, key, instance, principal, idem) OVERRIDING SYSTEM VALUE
    SELECT id, key, $2, CASE WHEN idem IS NOT NULL THEN principal END, idem FROM r
    ON CONFLICT (principal, idem) WHERE idem IS NOT NULL DO NOTHING
    RETURNING id),
named AS (
    INSERT INTO lease_waiter_owners (id, owner)
    SELECT r.id, r.owner FROM r JOIN queued q ON q.id = r.id)
SELECT r.i, q.id FROM r LEFT JOIN queued q ON q.id = r.id
