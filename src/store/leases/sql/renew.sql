-- Renew per request: one UPDATE requiring the token to be the key's live lease, on rows `locked`
-- locks in key order. The lock yields the newest row, so a renewal racing a takeover lands first or
-- finds another token (lease_lost). Liveness is checked by clock_timestamp() after the lock: the
-- relay reports an expiry under a share lock once expires_at passed by that clock, so no renewal
-- revives a lease watchers heard expire.
locked AS (
    SELECT r.i, l.key FROM gate r JOIN leases l ON l.key = r.key
    WHERE r.verdict = 'run'
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET ttl_ms = coalesce(r.ttl_ms, l.ttl_ms),
        expires_at = now() + coalesce(r.ttl_ms, l.ttl_ms) * interval '1 millisecond'
    FROM locked k JOIN gate r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
result AS (
    SELECT r.i, (SELECT to_json(c) FROM changed c WHERE c.i = r.i) AS lease, true AS settled
    FROM gate r),
