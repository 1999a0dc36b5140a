-- The retained versions of a key (by get.sql's rule), newest first, below the cursor's version.
-- One statement: the lateral join reads the versions of the head row it joins, from one
-- committed state; no lock. `has_snapshot` tells a key without a current snapshot (no rows
-- beyond the head's) from an empty page.
-- Parameters: $1 key, $2 versions kept, $3 cursor version or NULL, $4 page size + 1.
SELECT l.snapshot_etag IS NOT NULL AS has_snapshot,
    v.version, v.token, v.etag, v.size, v.content_type, v.updated_at
FROM leases l LEFT JOIN LATERAL (
    SELECT * FROM snapshot_versions sv
    WHERE sv.key = l.key AND l.snapshot_etag IS NOT NULL
      AND sv.version > l.snapshot_version - $2
      AND sv.version < coalesce($3, 9223372036854775807)
    ORDER BY sv.version DESC LIMIT $4) v ON true
WHERE l.key = $1
