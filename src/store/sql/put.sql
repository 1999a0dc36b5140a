-- The fenced write: fenced.sql, then this. One statement, so the check, the write (or the
-- refusal and its audit row) and the pruning commit together.
--
-- Parameters after fenced.sql's: $12 ETag, $13 size, $14 content type, $15 body (or, for an
-- uploaded body, the connection's upload table in its place), $16 versions to keep.
--
-- `head` bumps the key's version counter and sets
-- its ETag on the row `cur` locked, so versions are gapless however many writers race; `stored`
-- inserts the body under that version; `pruned` drops the version that falls out of the
-- retention window.
head AS (
    UPDATE leases SET snapshot_version = leases.snapshot_version + 1, snapshot_etag = $12
    FROM verdict WHERE leases.key = $5 AND verdict.outcome = 'accepted'
    RETURNING leases.snapshot_version AS version),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body)
    SELECT $5, head.version, $6, $12, $13, $14, now(), $15 FROM head
    RETURNING version, updated_at),
pruned AS (
    DELETE FROM snapshot_versions v USING head
    WHERE v.key = $5 AND v.version <= head.version - $16),
result AS (
    SELECT verdict.outcome, verdict.highest_token, verdict.created, refused.id AS audit_id,
        stored.version, stored.updated_at, true AS settled
    FROM verdict LEFT JOIN refused ON true LEFT JOIN stored ON true),
