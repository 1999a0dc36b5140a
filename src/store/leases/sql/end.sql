-- Release, abandon or require-recovery per request (`ending`): one UPDATE with renew.sql's
-- live-lease condition on rows locked in key order, race-free for the same reason. Require-recovery
-- leaves the lease live, marked to leave a record when it ends.
locked AS (
    SELECT r.i, l.key, l.recovery_required FROM gate r JOIN leases l ON l.key = r.key
    WHERE r.verdict = 'run'
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET
        end_reason = CASE WHEN r.ending = 'recovery_required' THEN l.end_reason ELSE r.ending END,
        ended_at = CASE WHEN r.ending = 'recovery_required' THEN l.ended_at ELSE now() END,
        recovery_required = l.recovery_required OR r.ending = 'recovery_required'
    FROM locked k JOIN gate r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
ended_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner)
    SELECT CASE WHEN r.ending = 'recovery_required' THEN 'lease.recovery_required'
            ELSE 'lease.' || r.ending END,
        c.key, c.token, coalesce(c.ended_at, now()), c.owner
    FROM changed c JOIN gate r ON r.i = c.i JOIN locked k ON k.i = c.i
    WHERE r.ending <> 'recovery_required' OR NOT k.recovery_required
    ORDER BY c.key),
result AS (
    SELECT r.i, (SELECT to_json(c) FROM changed c WHERE c.i = r.i) AS lease, true AS settled
    FROM gate r),
