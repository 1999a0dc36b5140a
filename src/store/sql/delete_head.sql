-- The fenced delete's first statement: fenced.sql, then this (a batch of one). `head` marks the
-- key as having no current snapshot, on the row `cur` locked. The versions go in
-- delete_versions.sql, in the same transaction, while the lock is held. No parameters beyond
-- fenced_in.sql's.
head AS (
    UPDATE leases SET snapshot_etag = NULL
    FROM verdict v JOIN req r ON r.i = v.i
    WHERE leases.key = r.key AND v.outcome = 'accepted'),
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        NULL::bigint AS version, NULL::timestamptz AS updated_at, true AS settled
    FROM verdict v JOIN req r ON r.i = v.i LEFT JOIN refused f ON f.key = r.key),
