-- The fenced delete's first statement: fenced.sql, then this. `head` marks the key as having no
-- current snapshot, on the row `cur` locked. The versions go in delete_versions.sql, in the same
-- transaction, while the lock is held. No parameters beyond fenced.sql's.
head AS (
    UPDATE leases SET snapshot_etag = NULL
    FROM verdict WHERE leases.key = $5 AND verdict.outcome = 'accepted'),
result AS (
    SELECT verdict.outcome, verdict.highest_token, verdict.created, refused.id AS audit_id,
        NULL::bigint AS version, NULL::timestamptz AS updated_at, true AS settled
    FROM verdict LEFT JOIN refused ON true),
