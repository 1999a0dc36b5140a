-- A snapshot read: the current version ($3 NULL) or one retained version, with its body only
-- when $4 (a HEAD reads none from storage). Only versions of a key that has a current snapshot,
-- within the retention window of $2 versions, so a version that a later write pruned, or that a
-- delete removed, is gone even if its row lingers. One statement, so the head and the body it
-- points at come from one committed state; it takes no lock.
-- Parameters: $1 key, $2 versions kept, $3 version or NULL, $4 whether to read the body.
SELECT v.version, v.token, v.etag, v.size, v.content_type, v.updated_at,
    CASE WHEN $4 THEN v.body END AS body
FROM leases l JOIN snapshot_versions v ON v.key = l.key
WHERE l.key = $1 AND l.snapshot_etag IS NOT NULL AND v.version > l.snapshot_version - $2
  AND v.version = coalesce($3, l.snapshot_version)
