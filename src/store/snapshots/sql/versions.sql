-- The retained versions of a key (by get.sql's rule), newest first, below the cursor's version.
-- One statement: the lateral join reads the versions of the head row it joins, from one
-- committed state; no lock. `has_snapshot` tells a key without a current snapshot (no rows
-- beyond the head's) from an empty page.
-- Parameters: $1 key, $2 versions kept, $3 cursor version or NULL, $4 page size + 1.
SELECT h.etag IS NOT NULL AS has_snapshot,
    v.version, v.token, v.etag, v.size, v.content_type, v.updated_at,
    coalesce(v.fencing_key, v.key) AS fencing_key, v.metadata
FROM snapshot_heads h LEFT JOIN LATERAL (
    SELECT * FROM snapshot_versions sv
    WHERE sv.key = h.key AND h.etag IS NOT NULL
      AND sv.version > h.version - $2
      AND sv.version < coalesce($3, 9223372036854775807)
    ORDER BY sv.version DESC LIMIT $4) v ON true
WHERE h.key = $1
