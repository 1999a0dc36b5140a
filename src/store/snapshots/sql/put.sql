-- The fenced write, for each request of the batch: fenced.sql, then this. One statement, so the
-- checks, the writes (or the refusals and their audit rows) and the pruning commit together.
--
-- `{{body}}` is the request's bound body (`r.body`), or for a body uploaded beforehand (a batch
-- of one) the connection's upload table's; `r.keep` is the versions each key keeps.
--
-- `head` bumps each accepted key's version counter and sets its ETag on the row `cur` locked, so
-- versions are gapless however many writers race, and returns what the rest writes, so that no
-- part after it joins `req` again (each join built a hash table per batch, bench/README.md,
-- fifth pass); `stored` inserts the bodies under those versions; `pruned` drops, in one DELETE
-- for the batch, the versions that fall out of the retention window: those above the key's
-- `versions_pruned_through` (as `cur` locked it), which then moves up to the window's start, so
-- that the DELETE walks none of the index entries its earlier runs left for the vacuum
-- (migrations/20261208000000_versions_pruned_through.sql). Pruned as far as its own `keep`: an
-- instance that keeps more versions than another finds them gone, as before.
head AS (
    UPDATE leases SET snapshot_version = leases.snapshot_version + 1, snapshot_etag = r.etag,
        versions_pruned_through = greatest(leases.versions_pruned_through,
            leases.snapshot_version + 1 - r.keep)
    FROM verdict v JOIN req r ON r.i = v.i
    WHERE leases.key = r.key AND v.outcome = 'accepted'
    RETURNING leases.key, leases.snapshot_version AS version, v.pruned_through, r.token, r.etag,
        r.size, r.content_type, r.keep, {{body}} AS body),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body)
    SELECT h.key, h.version, h.token, h.etag, h.size, h.content_type, now(), h.body
    FROM head h
    RETURNING key, version, updated_at),
-- The watch's change of each write, drawn after the row lock (migrations/20261205000000_change_log.sql).
written_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag)
    SELECT 'snapshot.written', h.key, h.token, now(), h.version, h.etag
    FROM head h ORDER BY h.key),
pruned AS (
    DELETE FROM snapshot_versions sv
    USING head h
    WHERE sv.key = h.key AND sv.version > h.pruned_through AND sv.version <= h.version - h.keep),
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        s.version, s.updated_at, true AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key LEFT JOIN stored s ON s.key = v.key),
