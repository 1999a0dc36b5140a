-- Fenced writes after fenced.sql, in one statement so checks, writes or refusals, and pruning
-- commit together. `w.body` is the bound body, or the connection's upload (put_uploaded derives
-- it). `put_old` bumps the version on the locked head (gapless under any race), `put_new` creates
-- a head; `pruned` drops versions out of the window above `pruned_through`.
put_old AS (
    UPDATE snapshot_heads h SET version = h.version + 1, etag = w.etag,
        pruned_through = greatest(h.pruned_through, h.version + 1 - w.keep),
        written_token = greatest(h.written_token, w.token)
    FROM verdict v JOIN w ON w.i = v.i
    WHERE h.key = w.key AND v.outcome = 'accepted' AND v.has_head AND w.op = 'put'
    RETURNING w.i, h.key, h.version, v.pruned_through, w.token, w.etag, w.size,
        w.content_type, w.keep, w.fence, w.metadata, v.txn_size, w.body),
put_new AS (
    INSERT INTO snapshot_heads (key, version, etag, written_token)
    SELECT w.key, 1, w.etag, w.token
    FROM verdict v JOIN w ON w.i = v.i
    WHERE v.outcome = 'accepted' AND NOT v.has_head AND w.op = 'put'
    ORDER BY w.key
    ON CONFLICT (key) DO NOTHING
    RETURNING key),
written AS (
    SELECT * FROM put_old
    UNION ALL
    SELECT w.i, n.key, 1, 0, w.token, w.etag, w.size, w.content_type, w.keep, w.fence,
        w.metadata, v.txn_size, w.body
    FROM put_new n JOIN w ON w.key = n.key JOIN verdict v ON v.i = w.i),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at,
        body, fencing_key, metadata)
    SELECT h.key, h.version, h.token, h.etag, h.size, h.content_type, now(), h.body, h.fence,
        h.metadata::json
    FROM written h
    RETURNING key, version, updated_at),
written_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag, fencing_key, txn_size)
    SELECT 'snapshot.written', h.key, h.token, now(), h.version, h.etag, h.fence, h.txn_size
    FROM written h ORDER BY h.key),
pruned AS (
    DELETE FROM snapshot_versions sv
    USING written h
    WHERE sv.key = h.key AND sv.version > h.pruned_through AND sv.version <= h.version - h.keep),
