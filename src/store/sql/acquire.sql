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
-- Parameters: $1 key, $2 owner, $3 TTL in ms, $4 metadata (JSON text or NULL), $5 crash_recovery,
-- $6 reconciled, $7 request id, $8 remote address, $9 principal.
WITH cur AS (
    SELECT l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery, l.recovery_required,
        l.acquired_at, l.expires_at, l.ended_at,
        lease_recovery_reason(l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required, now())
            AS recovery_reason,
        lease_state(l.end_reason, l.expires_at, l.crash_recovery, l.recovery_required, now()) AS state
    FROM leases l WHERE l.key = $1 FOR NO KEY UPDATE),
decision AS (
    SELECT CASE
        WHEN cur.key IS NULL THEN 'insert'
        WHEN cur.state = 'held' THEN 'held'
        WHEN cur.recovery_reason IS NOT NULL AND NOT $6 THEN 'recovery_required'
        ELSE 'grant'
    END AS verdict
    FROM (VALUES (1)) AS one LEFT JOIN cur ON true),
granted AS (
    UPDATE leases SET token = next_fencing_token(), owner = $2, ttl_ms = $3::bigint,
        metadata = $4::json, crash_recovery = $5, recovery_required = false, acquired_at = now(),
        expires_at = now() + $3 * interval '1 millisecond', end_reason = NULL, ended_at = NULL
    FROM decision WHERE leases.key = $1 AND decision.verdict = 'grant'
    RETURNING leases.*),
inserted AS (
    INSERT INTO leases (key, token, owner, ttl_ms, metadata, crash_recovery, acquired_at, expires_at)
    SELECT $1, next_fencing_token(), $2, $3, $4::json, $5, now(), now() + $3 * interval '1 millisecond'
    FROM decision WHERE decision.verdict = 'insert'
    ON CONFLICT (key) DO NOTHING
    RETURNING *),
new_lease AS (SELECT * FROM granted UNION ALL SELECT * FROM inserted),
reconciled AS (
    INSERT INTO recoveries (key, reason, record_owner, record_token, record_acquired_at,
        record_ended_at, record_metadata, reconciled_by, new_token, request_id, remote_addr, principal)
    SELECT cur.key, cur.recovery_reason, cur.owner, cur.token, cur.acquired_at,
        coalesce(cur.ended_at, cur.expires_at), cur.metadata, new_lease.owner, new_lease.token, $7, $8, $9
    FROM cur, new_lease WHERE cur.recovery_reason IS NOT NULL)
SELECT decision.verdict,
    n.key AS n_key, n.token AS n_token, n.owner AS n_owner, n.ttl_ms AS n_ttl_ms,
    n.metadata AS n_metadata, n.crash_recovery AS n_crash_recovery,
    n.recovery_required AS n_recovery_required, n.acquired_at AS n_acquired_at,
    n.expires_at AS n_expires_at, n.ended_at AS n_ended_at,
    cur.*
FROM decision LEFT JOIN new_lease n ON true LEFT JOIN cur ON true
