-- A page of the keys that have a current snapshot, each with that snapshot's head (as
-- versions.sql lists a version): a keyset scan of the heads' primary key over [$1, $2) after
-- the cursor $3 (before it, with $5 'desc', scanning the index backwards), skipping keys whose
-- snapshot was deleted, with a probe of snapshot_versions' primary key for each key listed (a
-- subquery of its own, so that the planner keeps the index order). One statement, so each head
-- and its version come from one committed state; no lock.
-- Parameters: $1 prefix, $2 its upper bound, $3 the cursor's key (NULL for the first page),
-- $4 page size + 1, $5 'asc' or 'desc'.
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
