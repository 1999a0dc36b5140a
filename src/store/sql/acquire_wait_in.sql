-- The requests of a batch of waiting acquires (contract v1.1, "Waiting acquire"; gate.sql
-- follows, then acquire.sql): acquire_in.sql's $1 to $13, then $14 each request's row in
-- lease_waiters (its place in the key's queue), and $15 whether this is its last try (its wait
-- is over, so a `held` verdict is its answer). A waiter's try that is not its last and finds the
-- key held answers `held` without settling: nothing is remembered under its Idempotency-Key and
-- it stays queued. Any settled answer takes it out of the queue (acquire.sql's `dequeued`).
WITH req AS (
    SELECT * FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[],
        $6::text[], $7::bigint[], $8::text[], $9::boolean[], $10::boolean[], $11::text[],
        $12::text[], $13::boolean[], $14::bigint[], $15::boolean[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, owner, ttl_ms, metadata,
        crash_recovery, reconciled, request_id, remote_addr, reconciling, waiter, last_try, i)),
