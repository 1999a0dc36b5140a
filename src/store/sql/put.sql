-- The fenced write: fenced.sql, then this. One statement, so the check, the write (or the
-- refusal and its audit row) and the pruning commit together.
--
-- Parameters after fenced.sql's: $9 ETag, $10 size, $11 content type, $12 body (or, for an
-- uploaded body, the connection's upload table in its place), $13 versions to keep.
--
-- `head` bumps the key's version counter and sets
-- its ETag on the row `cur` locked, so versions are gapless however many writers race; `stored`
-- inserts the body under that version; `pruned` drops the version that falls out of the
-- retention window.
head AS (
    UPDATE leases SET snapshot_version = leases.snapshot_version + 1, snapshot_etag = $9
    FROM verdict WHERE leases.key = $1 AND verdict.outcome = 'accepted'
    RETURNING leases.snapshot_version AS version),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body)
    SELECT $1, head.version, $2, $9, $10, $11, now(), $12 FROM head
    RETURNING version, updated_at),
pruned AS (
    DELETE FROM snapshot_versions v USING head
    WHERE v.key = $1 AND v.version <= head.version - $13)
SELECT verdict.outcome, verdict.highest_token, verdict.created, refused.id AS audit_id,
    stored.version, stored.updated_at
FROM verdict LEFT JOIN refused ON true LEFT JOIN stored ON true
