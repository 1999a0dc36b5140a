-- Fenced writes after fenced.sql, in one statement so checks, writes or refusals, and pruning
-- commit together. `stored` reads each body by its request's place in `positional` (the bound
-- bodies, or the connection's upload: put_uploaded derives it), so no other part copies a body
-- along. `put_old` bumps the version on the locked head (gapless under any race), `put_new`
-- creates a head; `pruned` drops versions out of the window above `pruned_through`.
put_old AS (
    UPDATE snapshot_heads h SET version = h.version + 1, etag = v.etag,
        pruned_through = greatest(h.pruned_through, h.version + 1 - v.keep),
        written_token = greatest(h.written_token, v.token)
    FROM verdict v
    WHERE h.key = v.key AND v.outcome = 'accepted' AND v.has_head AND v.op = 'put'
    RETURNING v.i, h.key, h.version, v.pruned_through, v.token, v.etag, v.size,
        v.content_type, v.keep, v.fence, v.metadata, v.txn_size),
put_new AS (
    INSERT INTO snapshot_heads (key, version, etag, written_token)
    SELECT v.key, 1, v.etag, v.token
    FROM verdict v
    WHERE v.outcome = 'accepted' AND NOT v.has_head AND v.op = 'put'
    ORDER BY v.key
    ON CONFLICT (key) DO NOTHING
    RETURNING key),
-- The heads made, as one array: a put that lost the race to make its head is not written.
made AS MATERIALIZED (
    SELECT coalesce(array_agg(n.key), '{}') AS keys FROM put_new n),
written AS (
    SELECT * FROM put_old
    UNION ALL
    SELECT v.i, v.key, 1, 0, v.token, v.etag, v.size, v.content_type, v.keep, v.fence,
        v.metadata, v.txn_size
    FROM verdict v CROSS JOIN made m
    WHERE v.outcome = 'accepted' AND NOT v.has_head AND v.op = 'put' AND v.key = ANY(m.keys)),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at,
        body, fencing_key, metadata)
    SELECT h.key, h.version, h.token, h.etag, h.size, h.content_type, now(), p.body[h.i],
        h.fence, h.metadata::json
    FROM written h CROSS JOIN positional p
    RETURNING key, version, updated_at),
written_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag, fencing_key, txn_size)
    SELECT 'snapshot.written', h.key, h.token, now(), h.version, h.etag, h.fence, h.txn_size
    FROM written h ORDER BY h.key),
pruned AS (
    DELETE FROM snapshot_versions sv
    USING written h
    WHERE sv.key = h.key AND sv.version > h.pruned_through AND sv.version <= h.version - h.keep),
