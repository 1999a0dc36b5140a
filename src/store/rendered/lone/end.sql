-- src/store/rendered/lone/end.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The one request of a batch of one (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal,
-- $4 key_id, $5 key, $6 token, $7 ending
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.ending, r.i
    FROM (SELECT ($1::text[])[1] AS idem, ($2::bytea[])[1] AS fp, ($3::text[])[1] AS principal,
        ($4::int8[])[1] AS key_id, ($5::text[])[1] AS key, ($6::int8[])[1] AS token, ($7::text[])[1]
        AS ending, 1::int8 AS i) r),
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
-- Release, abandon or require-recovery per request (`ending`): one UPDATE with renew.sql's
-- live-lease condition on rows locked in key order, race-free for the same reason. Require-recovery
-- leaves the lease live, marked to leave a record when it ends.
locked AS (
    SELECT r.i, l.key, l.recovery_required FROM gate r JOIN leases l ON l.key = r.key
    WHERE r.verdict = 'run'
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET
        end_reason = CASE WHEN r.ending = 'recovery_required' THEN l.end_reason ELSE r.ending END,
        ended_at = CASE WHEN r.ending = 'recovery_required' THEN l.ended_at ELSE now() END,
        recovery_required = l.recovery_required OR r.ending = 'recovery_required'
    FROM locked k JOIN gate r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
ended_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner)
    SELECT CASE WHEN r.ending = 'recovery_required' THEN 'lease.recovery_required'
            ELSE 'lease.' || r.ending END,
        c.key, c.token, coalesce(c.ended_at, now()), c.owner
    FROM changed c JOIN gate r ON r.i = c.i JOIN locked k ON k.i = c.i
    WHERE r.ending <> 'recovery_required' OR NOT k.recovery_required
    ORDER BY c.key),
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
