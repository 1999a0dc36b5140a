-- Renew: one UPDATE whose WHERE requires $6 to be the key's live lease. The row lock it takes
-- re-checks that condition on the newest version of the row, so a renewal racing a takeover
-- either lands before it (and the takeover sees a live lease) or sees the new token and changes
-- nothing (no row: lease_lost). gate.sql comes first (nothing changes unless its verdict is
-- `run`), remember.sql last.
-- Parameters after gate.sql's: $5 key, $6 token, $7 the new TTL in ms, or NULL to keep the
-- lease's.
changed AS (
    UPDATE leases l SET ttl_ms = coalesce($7, l.ttl_ms),
        expires_at = now() + coalesce($7, l.ttl_ms) * interval '1 millisecond'
    FROM gate
    WHERE l.key = $5 AND l.token = $6 AND l.end_reason IS NULL AND l.expires_at > now()
        AND gate.verdict = 'run'
    RETURNING l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
-- The answer: the renewed lease, or null (lease_lost).
result AS (SELECT (SELECT to_json(changed) FROM changed) AS lease, true AS settled),
