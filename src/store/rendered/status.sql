-- src/store/rendered/status.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- Key $1's newest lease with its state and recovery reason, a kept record (v1.2), and the live
-- waiters acquire.sql defers to, so a plain acquire is granted exactly when this shows the key free
-- with none. No lock.
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
