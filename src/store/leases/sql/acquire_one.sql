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
