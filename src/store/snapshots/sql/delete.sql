-- Fenced deletes after fenced.sql: `cleared` marks each accepted head (locked by `heads`) as having
-- no snapshot; delete_versions.sql removes versions under the same lock.
cleared AS (
    UPDATE snapshot_heads h SET etag = NULL, written_token = greatest(h.written_token, v.token)
    FROM verdict v
    WHERE h.key = v.key AND v.outcome = 'accepted' AND v.has_head AND v.op = 'delete'
    RETURNING v.i, v.gi, h.key, v.token, v.fence, v.version, v.current_etag, v.txn_size),
deleted_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag, fencing_key, txn_size)
    SELECT 'snapshot.deleted', d.key, d.token, now(), d.version, d.current_etag, d.fence,
        d.txn_size
    FROM cleared d WHERE d.current_etag IS NOT NULL ORDER BY d.key),
