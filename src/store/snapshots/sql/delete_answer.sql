result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        NULL::bigint AS version, NULL::timestamptz AS updated_at, true AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key),
