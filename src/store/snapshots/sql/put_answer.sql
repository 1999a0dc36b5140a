-- Answers per write; one that lost the race to create its head is not settled and runs again.
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        s.version, s.updated_at, v.outcome <> 'accepted' OR s.version IS NOT NULL AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key LEFT JOIN stored s ON s.key = v.key),
