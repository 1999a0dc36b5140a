-- The answer of each fenced write of a batch (after put.sql). A write that lost the race to
-- create its key's head is not settled: it is sent again, and then finds the head.
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        s.version, s.updated_at, v.outcome <> 'accepted' OR s.version IS NOT NULL AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key LEFT JOIN stored s ON s.key = v.key),
