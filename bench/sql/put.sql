WITH cur AS (
                SELECT key, token, owner, end_reason, snapshot_version, snapshot_etag
                FROM leases WHERE key = $1 FOR NO KEY UPDATE),
            verdict AS (
                SELECT CASE
                    WHEN cur.key IS NULL OR $2 > cur.token THEN 'unknown_token'
                    WHEN $2 < cur.token OR cur.end_reason IS NOT NULL THEN 'stale_token'
                    WHEN $3 AND (cur.snapshot_etag IS NULL
                                 OR NOT ($4::text[] IS NULL OR cur.snapshot_etag = ANY($4::text[])))
                        THEN 'precondition_failed'
                    ELSE 'accepted'
                END AS outcome,
                cur.token AS highest_token, cur.owner AS holder,
                cur.snapshot_etag IS NULL AS created, cur.snapshot_version
                FROM (VALUES (1)) AS one LEFT JOIN cur ON true),
            refused AS (
                INSERT INTO rejections (key, reason, presented_token, highest_token, holder,
                    operation, request_id, remote_addr, principal)
                SELECT $1, verdict.outcome, $2, verdict.highest_token, verdict.holder, 'put', $5, $6, $7
                FROM verdict WHERE verdict.outcome IN ('stale_token', 'unknown_token')
                RETURNING id),
    head AS (
        UPDATE leases SET snapshot_version = leases.snapshot_version + 1, snapshot_etag = $8
        FROM verdict WHERE leases.key = $1 AND verdict.outcome = 'accepted'
        RETURNING leases.snapshot_version AS version),
    stored AS (
        INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body)
        SELECT $1, head.version, $2, $8, $9, $10, now(), $11 FROM head
        RETURNING version, updated_at),
    pruned AS (
        DELETE FROM snapshot_versions v USING head
        WHERE v.key = $1 AND v.version <= head.version - $12)
    SELECT verdict.outcome, verdict.highest_token, verdict.created, refused.id AS audit_id,
        stored.version, stored.updated_at
    FROM verdict LEFT JOIN refused ON true LEFT JOIN stored ON true;
