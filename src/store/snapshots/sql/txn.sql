-- A transaction's one answer after fenced, put and delete: all written or none. Not settled when a
-- put lost the race to create its head.
op_results AS (
    SELECT r.i, CASE r.op
        WHEN 'put' THEN json_build_object('version', s.version, 'updated_at', s.updated_at,
            'created', v.created)
        WHEN 'delete' THEN json_build_object('deleted',
            EXISTS (SELECT FROM cleared d WHERE d.key = r.key AND d.current_etag IS NOT NULL))
        ELSE json_build_object('deleted',
            (SELECT count(*) FROM expanded x JOIN cleared d ON d.key = x.key WHERE x.prefix_i = r.i))
    END AS result
    FROM req r JOIN verdict v ON v.i = r.i LEFT JOIN stored s ON s.key = r.key),
result AS (
    SELECT v.i, v.outcome, v.highest_token, (SELECT f.id FROM refused f) AS audit_id,
        CASE WHEN v.outcome = 'precondition_failed' THEN v.failed_i - 1 END AS op_index,
        CASE WHEN v.outcome = 'accepted'
            THEN (SELECT json_agg(o.result ORDER BY o.i) FROM op_results o) END AS results,
        (SELECT array_agg(d.key) FROM cleared d WHERE d.current_etag IS NOT NULL) AS deleted_keys,
        v.outcome <> 'accepted'
            OR (SELECT count(*) FROM req r WHERE r.op = 'put') = (SELECT count(*) FROM stored)
            AS settled
    FROM verdict v WHERE v.i = 1),
