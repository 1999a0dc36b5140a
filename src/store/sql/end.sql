-- Release, abandon or require-recovery ($3: 'released', 'abandoned' or 'recovery_required'):
-- one UPDATE with renew.sql's live-lease condition, and race-free for the same reason. Release
-- and abandon end the lease now; require-recovery leaves it live and marks it, so that its end
-- leaves a recovery record.
-- Parameters: $1 key, $2 token, $3 the ending.
UPDATE leases l SET
    end_reason = CASE WHEN $3 = 'recovery_required' THEN l.end_reason ELSE $3 END,
    ended_at = CASE WHEN $3 = 'recovery_required' THEN l.ended_at ELSE now() END,
    recovery_required = l.recovery_required OR $3 = 'recovery_required'
WHERE l.key = $1 AND l.token = $2 AND l.end_reason IS NULL AND l.expires_at > now()
RETURNING l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery, l.recovery_required,
    l.acquired_at, l.expires_at, l.ended_at
