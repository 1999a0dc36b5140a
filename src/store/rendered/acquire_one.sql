-- src/store/rendered/acquire_one.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The requests of the batch (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal, $4
-- key_id, $5 key, $6 owner, $7 ttl_ms, $8 metadata, $9 crash_recovery, $10 reconciled, $11
-- request_id, $12 remote_addr, $13 reconciling, $14 waiter, $15 last_try
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.owner, r.ttl_ms, r.metadata,
        r.crash_recovery, r.reconciled, r.request_id, r.remote_addr, r.reconciling, r.waiter,
        r.last_try, r.i
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[], $6::text[],
        $7::bigint[], $8::text[], $9::boolean[], $10::boolean[], $11::text[], $12::text[],
        $13::boolean[], $14::bigint[], $15::boolean[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, owner, ttl_ms, metadata, crash_recovery,
        reconciled, request_id, remote_addr, reconciling, waiter, last_try, i)),
-- Acquire of a request alone in its batch (one client's, or the only one that arrived while the
-- batch before it ran): lease_acquire_one() holds the same rules as acquire.sql, run as a
-- function that takes only its request's branch, which costs a lone request about a quarter
-- less (migrations/20261209000000_lone_requests.sql says why and what holds the two forms
-- together). It settles the race for a new key itself, so its answer is always settled but for
-- a waiter's `held` that is not its last try.
acquired AS (
    SELECT r.i, a.gate, a.prior_fingerprint, a.answer
    FROM req r CROSS JOIN LATERAL lease_acquire_one(r.idem, r.fp, r.principal, r.key_id, r.key,
        r.owner, r.ttl_ms, r.metadata, r.crash_recovery, r.reconciled, r.request_id,
        r.remote_addr, r.reconciling, r.waiter, r.last_try) a)
SELECT i, gate, prior_fingerprint, answer FROM acquired
