-- Fenced deletes, after fenced.sql: `cleared` marks each accepted key as having no current
-- snapshot, on the head `heads` locked, and raises its written token. The versions go in
-- delete_versions.sql, in the same transaction, while the lock is held.
cleared AS (
    UPDATE snapshot_heads h SET etag = NULL, written_token = greatest(h.written_token, w.token)
    FROM verdict v JOIN w ON w.i = v.i
    WHERE h.key = w.key AND v.outcome = 'accepted' AND v.has_head AND w.op = 'delete'
    RETURNING v.i, h.key, w.token, w.fence, v.version, v.current_etag, v.txn_size),
-- The watch's change, when there was a snapshot to delete (migrations/20261205000000_change_log.sql).
deleted_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag, fencing_key, txn_size)
    SELECT 'snapshot.deleted', d.key, d.token, now(), d.version, d.current_etag, d.fence,
        d.txn_size
    FROM cleared d WHERE d.current_etag IS NOT NULL ORDER BY d.key),
