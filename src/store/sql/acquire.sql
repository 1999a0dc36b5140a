-- Acquire: one statement decides (`decision`) on the key's lease row locked FOR NO KEY UPDATE
-- (`cur`), then exactly one of `granted` (an existing row, updated in place) and `inserted` (the
-- key's first grant) runs; a replaced recovery record is written to `recoveries` by the same
-- statement (`reconciled`), so the grant and its audit row commit together.
--
-- Race-freedom: on an existing key, every acquire, renew, release and write of that key waits
-- for the row lock, so `decision` sees the state the last of them left. On a new key there is no
-- row to lock: concurrent first acquires all try the INSERT, the primary key lets one win, and
-- the losers' ON CONFLICT DO NOTHING yields no row; their verdict is `insert` with no lease, and
-- the caller runs the statement again, now against the winner's row. Tokens are drawn only once
-- the row is locked (or inserted), so per key they increase in grant order; they are drawn with
-- next_fencing_token(), which secures the sequence on the server's timeline first, so a promoted
-- standby never repeats a token.
--
-- gate.sql comes first (its verdict must be `run` for anything to change) and remember.sql
-- last; `settled` is false when the caller runs the statement again.
--
-- Parameters after gate.sql's: $5 key, $6 owner, $7 TTL in ms, $8 metadata (JSON text or NULL),
-- $9 crash_recovery, $10 reconciled, $11 request id, $12 remote address (and gate.sql's $3, the
-- principal, for the audit row).
cur AS (
    SELECT l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery, l.recovery_required,
        l.acquired_at, l.expires_at, l.ended_at,
        lease_recovery_reason(l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required, now())
            AS recovery_reason,
        lease_state(l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required, now()) AS state
    FROM leases l, gate WHERE l.key = $5 AND gate.verdict = 'run' FOR NO KEY UPDATE OF l),
decision AS (
    SELECT CASE
        WHEN gate.verdict <> 'run' THEN gate.verdict
        WHEN cur.key IS NULL THEN 'insert'
        WHEN cur.state = 'held' THEN 'held'
        WHEN cur.recovery_reason IS NOT NULL AND NOT $10 THEN 'recovery_required'
        ELSE 'grant'
    END AS verdict
    FROM gate LEFT JOIN cur ON true),
granted AS (
    UPDATE leases SET token = next_fencing_token(), owner = $6, ttl_ms = $7::bigint,
        metadata = $8::json, crash_recovery = $9, recovery_required = false, acquired_at = now(),
        expires_at = now() + $7 * interval '1 millisecond', end_reason = NULL, ended_at = NULL
    FROM decision WHERE leases.key = $5 AND decision.verdict = 'grant'
    RETURNING leases.*),
inserted AS (
    INSERT INTO leases (key, token, owner, ttl_ms, metadata, crash_recovery, acquired_at, expires_at)
    SELECT $5, next_fencing_token(), $6, $7, $8::json, $9, now(), now() + $7 * interval '1 millisecond'
    FROM decision WHERE decision.verdict = 'insert'
    ON CONFLICT (key) DO NOTHING
    RETURNING *),
new_lease AS (
    SELECT key, token, owner, ttl_ms, metadata, crash_recovery, recovery_required, acquired_at,
        expires_at, ended_at FROM granted
    UNION ALL
    SELECT key, token, owner, ttl_ms, metadata, crash_recovery, recovery_required, acquired_at,
        expires_at, ended_at FROM inserted),
reconciled AS (
    INSERT INTO recoveries (key, reason, record_owner, record_token, record_acquired_at,
        record_ended_at, record_metadata, reconciled_by, new_token, request_id, remote_addr, principal)
    SELECT cur.key, cur.recovery_reason, cur.owner, cur.token, cur.acquired_at,
        coalesce(cur.ended_at, cur.expires_at), cur.metadata, new_lease.owner, new_lease.token, $11, $12, $3
    FROM cur, new_lease WHERE cur.recovery_reason IS NOT NULL),
-- The answer: the verdict, the new lease, and the row as it was found (for `held`, and for the
-- recovery record a grant replaced or a refusal names).
result AS (
    SELECT decision.verdict, to_json(n) AS granted, to_json(cur) AS current,
        decision.verdict <> 'insert' OR n.key IS NOT NULL AS settled
    FROM decision LEFT JOIN new_lease n ON true LEFT JOIN cur ON true),
