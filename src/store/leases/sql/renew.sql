-- Renew, for each request of the batch: one UPDATE whose WHERE requires the request's token to
-- be the key's live lease, on the row `locked` locked first (in key order, as every batched
-- statement locks). The lock yields the row's newest version, so a renewal racing a takeover
-- either lands before it (and the takeover sees a live lease) or sees the new token and changes
-- nothing (no row: lease_lost). The lease must also be live by the database clock read after
-- the lock (clock_timestamp(), not the statement's start): the watch's relay reports an expiry
-- only under a share lock on the row once expires_at passed by that clock, so a renewal that
-- began a moment before the expiry cannot bring back a lease the watchers heard expire. The requests (`req`: key, token, ttl_ms) and gate.sql come first (nothing of a request
-- changes unless its verdict is `run`), remember.sql last.
locked AS (
    SELECT r.i, l.key FROM req r JOIN gate g ON g.i = r.i AND g.verdict = 'run'
    JOIN leases l ON l.key = r.key
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET ttl_ms = coalesce(r.ttl_ms, l.ttl_ms),
        expires_at = now() + coalesce(r.ttl_ms, l.ttl_ms) * interval '1 millisecond'
    FROM locked k JOIN req r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
-- The answers: the renewed lease, or null (lease_lost).
result AS (
    SELECT r.i, (SELECT to_json(c) FROM changed c WHERE c.i = r.i) AS lease, true AS settled
    FROM req r),
