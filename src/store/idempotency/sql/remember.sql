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
