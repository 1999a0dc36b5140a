-- A page of keys: a keyset scan over [$1, $2) after cursor $3, optionally in state $4, $5 rows;
-- `waiters` as status.sql. No lock.
SELECT l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery, l.recovery_required,
    l.acquired_at, l.expires_at, l.ended_at,
    l.kept_owner, l.kept_token, l.kept_acquired_at, l.kept_ended_at, l.kept_metadata,
    key_recovery_reason(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery,
        l.recovery_required, now()) AS recovery_reason,
    key_state(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required,
        now()) AS state,
    (SELECT count(*) FROM lease_waiters w
        WHERE w.key = l.key AND waiter_instance_alive(w.instance)) AS waiters
FROM leases l
WHERE l.key >= $1 AND l.key < $2 AND l.key > $3
  AND ($4::text IS NULL OR key_state(l.kept_reason, l.end_reason, l.expires_at,
                                     l.crash_recovery, l.recovery_required, now()) = $4)
ORDER BY l.key LIMIT $5
