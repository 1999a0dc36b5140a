-- Confirms a reconciliation (v1.2): the live holder says the kept record's leftovers no longer
-- conflict, so the record moves from the row to the audit log and the lease goes on. Renew.sql's
-- live-lease condition on rows `locked` locks in key order: a confirmation racing a takeover lands
-- first or finds another token (lease_lost). A second confirmation finds no record and changes
-- nothing, so it is idempotent.
locked AS (
    SELECT r.i, l.key, l.kept_reason, l.kept_owner, l.kept_token, l.kept_acquired_at,
        l.kept_ended_at, l.kept_metadata
    FROM gate r JOIN leases l ON l.key = r.key
    WHERE r.verdict = 'run'
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET kept_reason = NULL, kept_owner = NULL, kept_token = NULL,
        kept_acquired_at = NULL, kept_ended_at = NULL, kept_metadata = NULL
    FROM locked k JOIN gate r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
confirmed AS (
    INSERT INTO recoveries (key, reason, record_owner, record_token, record_acquired_at,
        record_ended_at, record_metadata, reconciled_by, new_token, request_id, remote_addr,
        principal, operation, presented_token)
    SELECT k.key, k.kept_reason, k.kept_owner, k.kept_token, k.kept_acquired_at,
        k.kept_ended_at, k.kept_metadata, c.owner, c.token, r.request_id, r.remote_addr,
        r.principal, 'reconciled', r.token
    FROM changed c JOIN locked k ON k.i = c.i JOIN gate r ON r.i = c.i
    WHERE k.kept_token IS NOT NULL),
reconciled_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner, reason, record_token)
    SELECT 'lease.reconciled', c.key, c.token, now(), c.owner, k.kept_reason, k.kept_token
    FROM changed c JOIN locked k ON k.i = c.i WHERE k.kept_token IS NOT NULL ORDER BY c.key),
result AS (
    SELECT r.i, (SELECT to_json(c) FROM changed c WHERE c.i = r.i) AS lease, true AS settled
    FROM gate r),
