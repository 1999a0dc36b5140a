-- The fenced write's check before its body is read, for each request of the batch: fenced.sql,
-- then this (between gate.sql and remember.sql). A stale or unknown token is refused and audited
-- at once by fenced.sql's `refused`, so an upload that can only be refused is never received;
-- an acceptable token changes nothing here, and the write's own statement (put.sql) decides
-- again, under the row lock, once the body is in. Only a refusal is `settled` (and so recorded
-- under the Idempotency-Key). No requests' columns beyond fenced.sql's.
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        NULL::bigint AS version, NULL::timestamptz AS updated_at,
        v.outcome IN ('stale_token', 'unknown_token') AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key),
