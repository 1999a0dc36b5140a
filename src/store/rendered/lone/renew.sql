-- src/store/rendered/lone/renew.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The one request of a batch of one (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal,
-- $4 key_id, $5 key, $6 token, $7 ttl_ms
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.ttl_ms, r.i
    FROM (SELECT ($1::text[])[1] AS idem, ($2::bytea[])[1] AS fp, ($3::text[])[1] AS principal,
        ($4::int8[])[1] AS key_id, ($5::text[])[1] AS key, ($6::int8[])[1] AS token, ($7::int8[])[1]
        AS ttl_ms, 1::int8 AS i) r),
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
-- Renew per request: one UPDATE requiring the token to be the key's live lease, on rows `locked`
-- locks in key order. The lock yields the newest row, so a renewal racing a takeover lands first or
-- finds another token (lease_lost). Liveness is checked by clock_timestamp() after the lock: the
-- relay reports an expiry under a share lock once expires_at passed by that clock, so no renewal
-- revives a lease watchers heard expire.
locked AS (
    SELECT r.i, l.key FROM gate r JOIN leases l ON l.key = r.key
    WHERE r.verdict = 'run'
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET ttl_ms = coalesce(r.ttl_ms, l.ttl_ms),
        expires_at = now() + coalesce(r.ttl_ms, l.ttl_ms) * interval '1 millisecond'
    FROM locked k JOIN gate r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
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
