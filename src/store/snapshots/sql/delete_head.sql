-- The fenced delete's first statement: fenced.sql, then this (a batch of one). `head` marks the
-- key as having no current snapshot, on the row `cur` locked. The versions go in
-- delete_versions.sql, in the same transaction, while the lock is held. No requests' columns
-- beyond fenced.sql's.
head AS (
    UPDATE leases SET snapshot_etag = NULL
    FROM verdict v
    WHERE leases.key = v.key AND v.outcome = 'accepted'
    RETURNING v.i, leases.key, leases.token),
-- The watch's change, when there was a snapshot to delete (migrations/20261205000000_change_log.sql).
deleted_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag)
    SELECT 'snapshot.deleted', h.key, h.token, now(), c.snapshot_version, c.snapshot_etag
    FROM head h JOIN cur c ON c.i = h.i WHERE c.snapshot_etag IS NOT NULL ORDER BY h.key),
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        NULL::bigint AS version, NULL::timestamptz AS updated_at, true AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key),
