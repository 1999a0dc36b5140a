-- A page of the keys that have a current snapshot, each with that snapshot's metadata (as
-- versions.sql lists a version): a keyset scan of the leases primary key over [$1, $2) after the
-- cursor $3, skipping keys without a snapshot (their head's ETag is NULL), with a probe of
-- snapshot_versions' primary key for each key listed. One statement, so each head and its version
-- come from one committed state; no lock. A prefix with many leased keys and few snapshots reads
-- the keys in between: an index on snapshot heads would cost every fenced write a non-HOT update.
-- Parameters: $1 prefix, $2 its upper bound, $3 the cursor's key ('' for the first page),
-- $4 page size + 1.
SELECT l.key, v.version, v.token, v.etag, v.size, v.content_type, v.updated_at
FROM leases l
JOIN snapshot_versions v ON v.key = l.key AND v.version = l.snapshot_version
WHERE l.key >= $1 AND l.key < $2 AND l.key > $3 AND l.snapshot_etag IS NOT NULL
ORDER BY l.key LIMIT $4
