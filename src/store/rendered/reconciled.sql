-- src/store/rendered/reconciled.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The requests of the batch (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal, $4
-- key_id, $5 key, $6 token, $7 request_id, $8 remote_addr
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.request_id, r.remote_addr, r.i
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[], $6::bigint[],
        $7::text[], $8::text[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, request_id, remote_addr, i)),
-- The first part of every changing statement after its requests (`req`, which
-- src/store/engine/statement.rs writes from the statement's columns; acquire.sql, renew.sql,
-- end.sql and fenced.sql follow it, and remember.sql ends each): per request (`i`), whether it may run at all
-- (`gate`), and the stored answer of its Idempotency-Key (`prior`). Every change that follows
-- is conditioned on its request's `gate.verdict = 'run'`.
--
-- Every statement is over a batch of requests: arrays bound as $1, $2, …, one element per
-- request, unnested into `req` with their position `i`. A batch never holds two requests for one
-- key or one Idempotency-Key (src/store/engine/batch/ defers the second to the next batch), so each
-- request is decided on its own, as if it were alone, and a refusal of one changes nothing for
-- another. Every request's `req` row has `idem` (the Idempotency-Key, NULL when none was sent),
-- `fp` (the request's fingerprint), `principal` (NULL without authentication) and `key_id` (its
-- API key's id, NULL likewise).
--
-- Verdicts: `revoked` when the API key was revoked before this statement ran (however early the
-- request's headers came); `run` without an Idempotency-Key; `replay` when the key has a record
-- (remember.sql answers it instead of the change); `run` when this statement takes the key's
-- transaction-level advisory lock, which only one statement at a time can hold; `in_progress`
-- when another statement holds it.
--
-- `prior` looks each request's record up by its primary key, in a subquery of its own (LIMIT
-- keeps the planner from making it a join): the hot connections keep one generic plan for their
-- life, and a join planned while the table was nearly empty read all of it for every batch.
--
-- Race-freedom: two requests with one key never both change something. The lock admits one at a
-- time. A second one that takes the lock after the first committed, but whose snapshot is older
-- than that commit, finds no record in `prior` and runs; its record's INSERT (remember.sql)
-- then meets the first one's row in the primary key, the statement fails with a unique
-- violation and is rolled back whole, and the batch is run again, now seeing the record.
prior AS (
    SELECT r.i, p.fingerprint, p.answer
    FROM req r CROSS JOIN LATERAL (
        SELECT fingerprint, answer FROM idempotency_records
        WHERE principal = coalesce(r.principal, '') AND key = r.idem LIMIT 1) p
    WHERE r.idem IS NOT NULL),
gate AS (
    SELECT r.i, CASE
        WHEN r.key_id IS NOT NULL
            AND NOT EXISTS (SELECT FROM api_keys WHERE id = r.key_id AND revoked_at IS NULL)
            THEN 'revoked'
        WHEN r.idem IS NULL THEN 'run'
        WHEN EXISTS (SELECT FROM prior WHERE prior.i = r.i) THEN 'replay'
        WHEN pg_try_advisory_xact_lock(hashtextextended(r.idem, hashtext(coalesce(r.principal, ''))))
            THEN 'run'
        ELSE 'in_progress'
    END AS verdict
    FROM req r),
-- Confirm a reconciliation (v1.2), for each request of the batch: the holder of the key's live
-- lease says the leftovers of the record its reconciling grant kept no longer conflict, so the
-- record leaves the row (`kept_*` cleared, migrations/20261204200000_reconciling.sql) and moves
-- to the audit log (`confirmed`, operation `reconciled`), and the lease goes on unchanged. One
-- UPDATE with renew.sql's live-lease condition, on the rows `locked` locked first in key order
-- (the order every batched statement locks in): the lock yields the row's newest version, so
-- the record read in `locked` is the one the UPDATE clears, a confirmation racing a takeover
-- either lands first or finds another token (no row: lease_lost, nothing changed), and one
-- racing its own lease's expiry report is lease_lost once the report is in. A second
-- confirmation of the same lease finds no record kept: it changes no value, writes no audit row
-- and notes no change, and answers the lease (confirming is idempotent, as a retry without an
-- Idempotency-Key needs). The requests (`req`: key, token, request_id, remote_addr) and gate.sql come first, remember.sql last.
locked AS (
    SELECT r.i, l.key, l.kept_reason, l.kept_owner, l.kept_token, l.kept_acquired_at,
        l.kept_ended_at, l.kept_metadata
    FROM req r JOIN gate g ON g.i = r.i AND g.verdict = 'run'
    JOIN leases l ON l.key = r.key
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET kept_reason = NULL, kept_owner = NULL, kept_token = NULL,
        kept_acquired_at = NULL, kept_ended_at = NULL, kept_metadata = NULL
    FROM locked k JOIN req r ON r.i = k.i
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
    FROM changed c JOIN locked k ON k.i = c.i JOIN req r ON r.i = c.i
    WHERE k.kept_token IS NOT NULL),
-- The watch's change of a confirmation that dropped a kept record
-- (migrations/20261205000000_change_log.sql).
reconciled_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner, reason, record_token)
    SELECT 'lease.reconciled', c.key, c.token, now(), c.owner, k.kept_reason, k.kept_token
    FROM changed c JOIN locked k ON k.i = c.i WHERE k.kept_token IS NOT NULL ORDER BY c.key),
-- The answers: the lease, or null (lease_lost).
result AS (
    SELECT r.i, (SELECT to_json(c) FROM changed c WHERE c.i = r.i) AS lease, true AS settled
    FROM req r),
-- The last part of every changing statement (gate.sql begins it), after the statement's own
-- `result`: one row per request (`i`) that is its answer, with a column `settled` that is false
-- only when the request will be sent again (acquire's lost race for a new key).
--
-- `remembered` stores each answer under its request's Idempotency-Key, in this statement, so the
-- record commits exactly when the change does (or the refusal's audit row). Without ON CONFLICT:
-- a racing record makes the whole statement fail and roll back (see gate.sql). The statement
-- answers, per request, the gate's verdict, the stored fingerprint of a replay, and the answer:
-- the stored one on a replay, this statement's own otherwise (JSON null for a request with no
-- answer of its own: a transaction's ops after its first).
remembered AS (
    INSERT INTO idempotency_records (principal, key, fingerprint, answer)
    SELECT coalesce(r.principal, ''), r.idem, r.fp, to_json(res)
    FROM result res JOIN req r ON r.i = res.i JOIN gate g ON g.i = res.i
    WHERE g.verdict = 'run' AND r.idem IS NOT NULL AND res.settled)
SELECT g.i, g.verdict AS gate, p.fingerprint AS prior_fingerprint,
    coalesce(p.answer, (SELECT to_json(res) FROM result res WHERE res.i = g.i), 'null') AS answer
FROM gate g LEFT JOIN prior p ON p.i = g.i
