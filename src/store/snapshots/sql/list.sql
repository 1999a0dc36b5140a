-- A page of keys with a current snapshot and its head: a keyset scan over [$1, $2) after cursor $3
-- ($5 'asc' or 'desc'), $4 rows, probing versions per key. One committed state; no lock.
SELECT h.key, v.* FROM (
    (SELECT key, version FROM snapshot_heads
    WHERE $5 = 'asc' AND key >= $1 AND key < $2 AND key > coalesce($3, '') AND etag IS NOT NULL
    ORDER BY key LIMIT $4)
    UNION ALL
    (SELECT key, version FROM snapshot_heads
    WHERE $5 = 'desc' AND key >= $1 AND key < $2 AND key < coalesce($3, $2) AND etag IS NOT NULL
    ORDER BY key DESC LIMIT $4)) h
CROSS JOIN LATERAL (
    SELECT v.version, v.token, v.etag, v.size, v.content_type, v.updated_at,
        coalesce(v.fencing_key, v.key) AS fencing_key, v.metadata
    FROM snapshot_versions v WHERE v.key = h.key AND v.version = h.version LIMIT 1) v
