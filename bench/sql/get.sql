SELECT v.version, v.token, v.etag, v.size, v.content_type, v.updated_at,
        CASE WHEN $4 THEN v.body END AS body
    FROM leases l JOIN snapshot_versions v ON v.key = l.key
    WHERE l.key = $1 AND l.snapshot_etag IS NOT NULL AND v.version > l.snapshot_version - $2
      AND v.version = coalesce($3, l.snapshot_version);
