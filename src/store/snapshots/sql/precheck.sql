-- A fenced write's check before its body is read: a stale or unknown token is refused and audited
-- now, so a doomed upload is never received; an acceptable one changes nothing, and put.sql decides
-- again under the lock. Only a refusal is settled.
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        NULL::bigint AS version, NULL::timestamptz AS updated_at,
        v.outcome IN ('stale_token', 'unknown_token') AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key),
