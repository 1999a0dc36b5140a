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
