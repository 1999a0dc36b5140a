-- Renew: one UPDATE whose WHERE requires $2 to be the key's live lease. The row lock it takes
-- re-checks that condition on the newest version of the row, so a renewal racing a takeover
-- either lands before it (and the takeover sees a live lease) or sees the new token and changes
-- nothing (no row: lease_lost).
-- Parameters: $1 key, $2 token, $3 the new TTL in ms, or NULL to keep the lease's.
UPDATE leases l SET ttl_ms = coalesce($3, l.ttl_ms),
    expires_at = now() + coalesce($3, l.ttl_ms) * interval '1 millisecond'
WHERE l.key = $1 AND l.token = $2 AND l.end_reason IS NULL AND l.expires_at > now()
RETURNING l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery, l.recovery_required,
    l.acquired_at, l.expires_at, l.ended_at
