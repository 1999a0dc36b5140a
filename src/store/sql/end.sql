-- Release, abandon or require-recovery ($7: 'released', 'abandoned' or 'recovery_required'):
-- one UPDATE with renew.sql's live-lease condition, and race-free for the same reason. Release
-- and abandon end the lease now; require-recovery leaves it live and marks it, so that its end
-- leaves a recovery record. gate.sql comes first, remember.sql last.
-- Parameters after gate.sql's: $5 key, $6 token, $7 the ending.
changed AS (
    UPDATE leases l SET
        end_reason = CASE WHEN $7 = 'recovery_required' THEN l.end_reason ELSE $7 END,
        ended_at = CASE WHEN $7 = 'recovery_required' THEN l.ended_at ELSE now() END,
        recovery_required = l.recovery_required OR $7 = 'recovery_required'
    FROM gate
    WHERE l.key = $5 AND l.token = $6 AND l.end_reason IS NULL AND l.expires_at > now()
        AND gate.verdict = 'run'
    RETURNING l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
-- The answer: the lease as changed, or null (lease_lost).
result AS (SELECT (SELECT to_json(changed) FROM changed) AS lease, true AS settled),
