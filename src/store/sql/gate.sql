-- The first part of every changing statement (acquire.sql, renew.sql, end.sql, fenced.sql
-- follow it, and remember.sql ends each): whether it may run at all (`gate`), and the stored
-- answer of its Idempotency-Key (`prior`). Every change of the statement that follows is
-- conditioned on `gate.verdict = 'run'`.
--
-- Parameters: $1 the Idempotency-Key (NULL: none sent), $2 the request's fingerprint, $3 the
-- principal (NULL without authentication), $4 its API key's id (NULL likewise). The statement
-- that follows numbers its own from $5.
--
-- Verdicts: `revoked` when the API key was revoked before this statement ran (however early the
-- request's headers came); `run` without an Idempotency-Key; `replay` when the key has a record
-- (remember.sql answers it instead of the change); `run` when this statement takes the key's
-- transaction-level advisory lock, which only one statement at a time can hold; `in_progress`
-- when another statement holds it.
--
-- Race-freedom: two requests with one key never both change something. The lock admits one at a
-- time. A second one that takes the lock after the first committed, but whose snapshot is older
-- than that commit, finds no record in `prior` and runs; its record's INSERT (remember.sql)
-- then meets the first one's row in the primary key, the statement fails with a unique
-- violation and is rolled back whole, and the caller runs it again, now seeing the record.
WITH prior AS (
    SELECT fingerprint, answer FROM idempotency_records
    WHERE $1::text IS NOT NULL AND principal = coalesce($3, '') AND key = $1),
gate AS (
    SELECT CASE
        WHEN $4::bigint IS NOT NULL
            AND NOT EXISTS (SELECT FROM api_keys WHERE id = $4 AND revoked_at IS NULL)
            THEN 'revoked'
        WHEN $1::text IS NULL THEN 'run'
        WHEN EXISTS (SELECT FROM prior) THEN 'replay'
        WHEN pg_try_advisory_xact_lock(hashtextextended($1, hashtext(coalesce($3, '')))) THEN 'run'
        ELSE 'in_progress'
    END AS verdict),
