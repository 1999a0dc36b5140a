-- Waiting acquires take places at the end of their keys' queues: $1 keys in arrival order, $2
-- instance id, $3/$4 principal and Idempotency-Key, $5 owner. Ids are drawn in batch order (nextval
-- runs after ORDER BY); NULL when the same principal's Idempotency-Key already waits
-- (lease_waiters_idem).
--
-- Autocommit, and each waiter's first try runs after it, so a release committing after that try
-- finds the row and wakes it, and one before is seen by the try.
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
