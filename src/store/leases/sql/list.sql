-- A page of keys: a keyset scan of the primary key index over [$1, $2) after the cursor $3, so a
-- page costs the same on the first and the millionth key; optionally only keys in state $4. Each
-- key's `waiters` is status.sql's.
-- A plain read, no lock.
-- Parameters: $1 prefix, $2 its upper bound, $3 the cursor's key ('' for the first page),
-- $4 state or NULL, $5 page size + 1.
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
