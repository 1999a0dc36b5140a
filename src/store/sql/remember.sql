-- The last part of every changing statement (gate.sql begins it), after the statement's own
-- `result`: one row that is the statement's answer, with a column `settled` that is false only
-- when the caller will run the statement again (acquire's lost race for a new key).
--
-- `remembered` stores the answer under the Idempotency-Key, in this statement, so the record
-- commits exactly when the change does (or the refusal's audit row). Without ON CONFLICT: a
-- racing record makes the whole statement fail and roll back (see gate.sql). The statement
-- answers the gate's verdict, the stored fingerprint of a replay, and the answer: the stored one
-- on a replay, this statement's own otherwise.
remembered AS (
    INSERT INTO idempotency_records (principal, key, fingerprint, answer)
    SELECT coalesce($3, ''), $1, $2, to_json(result) FROM result, gate
    WHERE gate.verdict = 'run' AND $1::text IS NOT NULL AND result.settled)
SELECT gate.verdict AS gate, prior.fingerprint AS prior_fingerprint,
    coalesce(prior.answer, (SELECT to_json(result) FROM result)) AS answer
FROM gate LEFT JOIN prior ON true
