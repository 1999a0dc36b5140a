-- src/store/rendered/lone/reconciled.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The one request of a batch of one (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal,
-- $4 key_id, $5 key, $6 token, $7 request_id, $8 remote_addr
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.request_id, r.remote_addr, r.i
    FROM (SELECT ($1::text[])[1] AS idem, ($2::bytea[])[1] AS fp, ($3::text[])[1] AS principal,
        ($4::int8[])[1] AS key_id, ($5::text[])[1] AS key, ($6::int8[])[1] AS token, ($7::text[])[1]
        AS request_id, ($8::text[])[1] AS remote_addr, 1::int8 AS i) r),
-- The first part of every changing statement after `req`: each request, as every later part reads
-- it, with whether it may run (`verdict`) and its Idempotency-Key's stored answer (`prior_*`);
-- every change requires `verdict = 'run'`. A batch never holds two requests for one key or one
-- Idempotency-Key, so each is decided as if alone.
--
-- Verdicts: `revoked` (the API key was revoked), `replay` (a record exists), `run` (no key, or this
-- statement took the key's transaction-level advisory lock), `in_progress` (another holds it).
-- The record is a LIMITed subquery so the hot connections' generic plan reads by primary key.
--
-- Race-freedom: the lock admits one statement per key at a time. One whose snapshot predates the
-- first's commit finds no record and runs, but its INSERT (remember.sql) meets the first's row, the
-- statement rolls back on the unique violation, and the batch runs again.
gate AS (
    SELECT r.*, p.fingerprint AS prior_fingerprint, p.answer AS prior_answer, CASE
        WHEN r.key_id IS NOT NULL
            AND NOT EXISTS (SELECT FROM api_keys WHERE id = r.key_id AND revoked_at IS NULL)
            THEN 'revoked'
        WHEN r.idem IS NULL THEN 'run'
        WHEN p.fingerprint IS NOT NULL THEN 'replay'
        WHEN pg_try_advisory_xact_lock(hashtextextended(r.idem, hashtext(coalesce(r.principal, ''))))
            THEN 'run'
        ELSE 'in_progress'
    END AS verdict
    FROM req r LEFT JOIN LATERAL (
        SELECT fingerprint, answer FROM idempotency_records
        WHERE principal = coalesce(r.principal, '') AND key = r.idem LIMIT 1) p ON true),
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
-- The last part of every changing statement: one answer row per request, `settled` false when it
-- will be sent again. `remembered` stores each answer under its Idempotency-Key in this statement,
-- so the record commits exactly with the change; no ON CONFLICT, so a racing record rolls the
-- statement back (gate.sql). A transaction's ops after its first have JSON null.
remembered AS (
    INSERT INTO idempotency_records (principal, key, fingerprint, answer)
    SELECT coalesce(g.principal, ''), g.idem, g.fp, to_json(res)
    FROM result res JOIN gate g ON g.i = res.i
    WHERE g.verdict = 'run' AND g.idem IS NOT NULL AND res.settled)
SELECT g.i, g.verdict AS gate, g.prior_fingerprint,
    coalesce(g.prior_answer, (SELECT to_json(res) FROM result res WHERE res.i = g.i), 'null')
        AS answer
FROM gate g
