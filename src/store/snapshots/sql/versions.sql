-- Key $1's retained versions ($2 kept) newest first below cursor $3, $4 rows, from one committed
-- state. `has_snapshot` tells a key without a snapshot from an empty page.
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
