-- Snapshot reads, a batch of them: for each request (`i`), the current version (its version
-- NULL) or one retained version, with its body only when asked (a HEAD reads none from
-- storage) and only when the version's ETag is not among the request's If-None-Match tags
-- (a `304` sends no body, so a conditional GET of an unchanged snapshot reads none either).
-- Only versions of a key that has a current snapshot, within its retention window, so a
-- version that a later write pruned, or that a delete removed, is gone even if its row
-- lingers. One statement, so each head and the body it points at come from one committed state; it takes no lock. A request with no such version has no row. Each request's version
-- is looked up by key in a subquery of its own (LIMIT keeps the planner from making it a join):
-- the hot connections keep one generic plan for their life, and a join planned while the
-- tables were nearly empty scanned the heads for every batch (tests/api/plans.rs).
-- The requests (`req`): key, version (or NULL), with_body, keep (versions kept), unless (the
-- If-None-Match tags as a JSON array of stored ETags, `"*"` for any; NULL when none was sent);
-- `jsonb ? text` is the weak comparison, since stored ETags are strong.
got AS (
SELECT r.i, v.version, v.token, v.etag, v.size, v.content_type, v.updated_at, v.fencing_key,
    v.metadata, v.body
FROM req r
CROSS JOIN LATERAL (
    SELECT v.version, v.token, v.etag, v.size, v.content_type, v.updated_at,
        coalesce(v.fencing_key, v.key) AS fencing_key, v.metadata,
        CASE WHEN r.with_body AND NOT coalesce(r.unless ? v.etag OR r.unless ? '*', false)
            THEN v.body END AS body
    FROM snapshot_heads h JOIN snapshot_versions v ON v.key = h.key
    WHERE h.key = r.key AND h.etag IS NOT NULL
      AND v.version > h.version - r.keep
      AND v.version = coalesce(r.version, h.version)
    LIMIT 1) v)
SELECT * FROM got
