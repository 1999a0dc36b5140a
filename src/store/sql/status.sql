-- A key's newest lease with its recovery reason and state (by the migration's functions, at the
-- statement's now()). A plain read: the latest committed state, no lock.
-- Parameters: $1 key.
SELECT l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery, l.recovery_required,
    l.acquired_at, l.expires_at, l.ended_at,
    lease_recovery_reason(l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required, now())
        AS recovery_reason,
    lease_state(l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required, now()) AS state
FROM leases l WHERE l.key = $1
