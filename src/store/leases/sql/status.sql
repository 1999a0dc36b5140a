-- A key's newest lease with its recovery reason and state (by the migrations' functions, at the
-- statement's now()), the record a reconciling lease keeps (v1.2), if any, and how many live
-- acquires wait in its queue: those of instances that answer (waiter_instance_alive), the ones
-- the acquire statement defers to (acquire.sql, `decision`), so an acquire without `wait_ms` is
-- granted exactly when this shows the key free with none. An index probe of
-- lease_waiters_key_id, an empty range mostly. A plain read: the latest committed state, no lock.
-- Parameters: $1 key.
SELECT l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery, l.recovery_required,
    l.acquired_at, l.expires_at, l.ended_at,
    l.kept_owner, l.kept_token, l.kept_acquired_at, l.kept_ended_at, l.kept_metadata,
    key_recovery_reason(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery,
        l.recovery_required, now()) AS recovery_reason,
    key_state(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required,
        now()) AS state,
    (SELECT count(*) FROM lease_waiters w
        WHERE w.key = l.key AND waiter_instance_alive(w.instance)) AS waiters
FROM leases l WHERE l.key = $1
