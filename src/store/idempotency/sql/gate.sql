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
