-- The first part of every changing statement after `req`: per request, whether it may run (`gate`)
-- and its Idempotency-Key's stored answer (`prior`); every change after it requires `verdict =
-- 'run'`. A batch never holds two requests for one key or one Idempotency-Key, so each is decided
-- as if alone.
--
-- Verdicts: `revoked` (the API key was revoked), `replay` (a record exists), `run` (no key, or this
-- statement took the key's transaction-level advisory lock), `in_progress` (another holds it).
-- `prior` is a LIMITed subquery so the hot connections' generic plan reads by primary key.
--
-- Race-freedom: the lock admits one statement per key at a time. One whose snapshot predates the
-- first's commit finds no record and runs, but its INSERT (remember.sql) meets the first's row, the
-- statement rolls back on the unique violation, and the batch runs again.
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
