-- Renew, for each request of the batch: one UPDATE whose WHERE requires the request's token to
-- be the key's live lease, on the row `locked` locked first (in key order, as every batched
-- statement locks). The lock yields the row's newest version, so a renewal racing a takeover
-- either lands before it (and the takeover sees a live lease) or sees the new token and changes
-- nothing (no row: lease_lost). A lease whose expiry the watch has reported (expiry_reported,
-- set by the relay once expires_at passed) is over even for a renewal that began a moment
-- before it. renew_in.sql and gate.sql come first (nothing of a request
-- changes unless its verdict is `run`), remember.sql last.
locked AS (
    SELECT r.i, l.key FROM req r JOIN gate g ON g.i = r.i AND g.verdict = 'run'
    JOIN leases l ON l.key = r.key
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET ttl_ms = coalesce(r.ttl_ms, l.ttl_ms),
        expires_at = now() + coalesce(r.ttl_ms, l.ttl_ms) * interval '1 millisecond'
    FROM locked k JOIN req r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL AND l.expires_at > now()
        AND NOT l.expiry_reported
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
-- The answers: the renewed lease, or null (lease_lost).
result AS (
    SELECT r.i, (SELECT to_json(c) FROM changed c WHERE c.i = r.i) AS lease, true AS settled
    FROM req r),
