-- src/store/rendered/renew.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The requests of the batch (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal, $4
-- key_id, $5 key, $6 token, $7 ttl_ms
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.ttl_ms, r.i
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[], $6::bigint[],
        $7::bigint[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, ttl_ms, i)),
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
-- Renew, for each request of the batch: one UPDATE whose WHERE requires the request's token to
-- be the key's live lease, on the row `locked` locked first (in key order, as every batched
-- statement locks). The lock yields the row's newest version, so a renewal racing a takeover
-- either lands before it (and the takeover sees a live lease) or sees the new token and changes
-- nothing (no row: lease_lost). The lease must also be live by the database clock read after
-- the lock (clock_timestamp(), not the statement's start): the watch's relay reports an expiry
-- only under a share lock on the row once expires_at passed by that clock, so a renewal that
-- began a moment before the expiry cannot bring back a lease the watchers heard expire. The requests (`req`: key, token, ttl_ms) and gate.sql come first (nothing of a request
-- changes unless its verdict is `run`), remember.sql last.
locked AS (
    SELECT r.i, l.key FROM req r JOIN gate g ON g.i = r.i AND g.verdict = 'run'
    JOIN leases l ON l.key = r.key
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET ttl_ms = coalesce(r.ttl_ms, l.ttl_ms),
        expires_at = now() + coalesce(r.ttl_ms, l.ttl_ms) * interval '1 millisecond'
    FROM locked k JOIN req r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
-- The answers: the renewed lease, or null (lease_lost).
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
