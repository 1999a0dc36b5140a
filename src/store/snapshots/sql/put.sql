-- The fenced write, for each request of the batch: fenced.sql, then this. One statement, so the
-- checks, the writes (or the refusals and their audit rows) and the pruning commit together.
--
-- `{{body}}` is the request's bound body (`r.body`), or for a body uploaded beforehand (a batch
-- of one) the connection's upload table's; `r.keep` is the versions each key keeps.
--
-- `head` bumps each accepted key's version counter and sets its ETag on the row `cur` locked, so
-- versions are gapless however many writers race; `stored` inserts the bodies under those
-- versions; `pruned` drops, in one DELETE for the batch, the versions that fall out of the
-- retention window.
head AS (
    UPDATE leases SET snapshot_version = leases.snapshot_version + 1, snapshot_etag = r.etag
    FROM verdict v JOIN req r ON r.i = v.i
    WHERE leases.key = r.key AND v.outcome = 'accepted'
    RETURNING r.i, leases.key, leases.snapshot_version AS version),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body)
    SELECT r.key, h.version, r.token, r.etag, r.size, r.content_type, now(), {{body}}
    FROM head h JOIN req r ON r.i = h.i
    RETURNING key, version, updated_at),
-- The watch's change of each write, drawn after the row lock (migrations/20261205000000_change_log.sql).
written_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag)
    SELECT 'snapshot.written', h.key, r.token, now(), h.version, r.etag
    FROM head h JOIN req r ON r.i = h.i ORDER BY h.key),
pruned AS (
    DELETE FROM snapshot_versions sv
    USING head h JOIN req r ON r.i = h.i
    WHERE sv.key = h.key AND sv.version <= h.version - r.keep),
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        s.version, s.updated_at, true AS settled
    FROM verdict v JOIN req r ON r.i = v.i LEFT JOIN refused f ON f.key = r.key
    LEFT JOIN stored s ON s.key = r.key),
