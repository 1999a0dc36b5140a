-- The requests of a batch of acquires (gate.sql follows, then acquire.sql): $1 Idempotency-Keys,
-- $2 fingerprints, $3 principals, $4 API key ids (gate.sql's), $5 keys, $6 owners, $7 TTLs in ms,
-- $8 metadata (JSON text or NULL), $9 crash_recovery, $10 reconciled, $11 request ids, $12 remote
-- addresses, $13 reconciling (v1.2). No request of this batch is a waiter (`waiter` NULL, `last_try` true: a `held`
-- verdict is its answer); acquire_wait_in.sql is the same for waiting requests.
WITH req AS (
    SELECT r.*, NULL::bigint AS waiter, true AS last_try
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[], $6::text[],
        $7::bigint[], $8::text[], $9::boolean[], $10::boolean[], $11::text[], $12::text[],
        $13::boolean[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, owner, ttl_ms, metadata,
        crash_recovery, reconciled, request_id, remote_addr, reconciling, i)),
