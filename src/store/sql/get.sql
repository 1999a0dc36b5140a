-- Snapshot reads, a batch of them: for each request (`i`), the current version (its version
-- NULL) or one retained version, with its body only when asked (a HEAD reads none from
-- storage). Only versions of a key that has a current snapshot, within its retention window, so
-- a version that a later write pruned, or that a delete removed, is gone even if its row
-- lingers. One statement, so each head and the body it points at come from one committed
-- state; it takes no lock. A request with no such version has no row.
-- Parameters: $1 keys, $2 versions (or NULL), $3 whether to read the body, $4 versions kept.
SELECT r.i, v.version, v.token, v.etag, v.size, v.content_type, v.updated_at,
    CASE WHEN r.with_body THEN v.body END AS body
FROM unnest($1::text[], $2::bigint[], $3::boolean[], $4::bigint[])
    WITH ORDINALITY AS r(key, version, with_body, keep, i)
JOIN leases l ON l.key = r.key
JOIN snapshot_versions v ON v.key = l.key
WHERE l.snapshot_etag IS NOT NULL AND v.version > l.snapshot_version - r.keep
  AND v.version = coalesce(r.version, l.snapshot_version)
