-- src/store/rendered/lone/get.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The one request of a batch of one (src/store/engine/statement.rs): $1 key, $2 version, $3
-- with_body, $4 keep, $5 unless
WITH req AS (
    SELECT r.key, r.version, r.with_body, r.keep, r.unless, r.i
    FROM (SELECT ($1::text[])[1] AS key, ($2::int8[])[1] AS version, ($3::bool[])[1] AS with_body,
        ($4::int8[])[1] AS keep, ($5::jsonb[])[1] AS unless, 1::int8 AS i) r),
-- Snapshot reads per request: the current or a retained version, its body only when asked and not
-- matched by If-None-Match (`jsonb ? text`, a weak comparison). Only versions within the retention
-- window of a key with a current snapshot. One statement, so a head and its body come from one
-- committed state; no lock. The LIMITed subquery keeps the generic plan a probe by key.
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
