UPDATE leases l SET ttl_ms = coalesce($3, l.ttl_ms),
        expires_at = now() + coalesce($3, l.ttl_ms) * interval '1 millisecond'
    WHERE l.key = $1 AND l.token = $2 AND l.end_reason IS NULL AND l.expires_at > now()
    RETURNING l.key AS key, l.token AS token, l.owner AS owner, l.ttl_ms AS ttl_ms, l.metadata AS metadata, l.crash_recovery AS crash_recovery, l.recovery_required AS recovery_required, l.acquired_at AS acquired_at, l.expires_at AS expires_at, l.ended_at AS ended_at;
