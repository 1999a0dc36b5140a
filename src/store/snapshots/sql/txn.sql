-- Each transaction's one answer, on its first request's row, after fenced, put and delete: all
-- written or none. Not settled when a put lost the race to create its head.
op_results AS (
    SELECT r.i, r.gi, CASE r.op
        WHEN 'put' THEN json_build_object('version', s.version, 'updated_at', s.updated_at,
            'created', v.created)
        WHEN 'delete' THEN json_build_object('deleted',
            EXISTS (SELECT FROM cleared d WHERE d.key = r.key AND d.current_etag IS NOT NULL))
        ELSE json_build_object('deleted',
            (SELECT count(*) FROM expanded x JOIN cleared d ON d.key = x.key WHERE x.prefix_i = r.i))
    END AS result
    FROM req r JOIN verdict v ON v.i = r.i LEFT JOIN stored s ON s.key = r.key),
result AS (
    SELECT v.i, v.outcome, v.highest_token,
        (SELECT f.id FROM refused f JOIN w ON w.subject = f.key WHERE w.i = v.failed_i)
            AS audit_id,
        CASE WHEN v.outcome = 'precondition_failed' THEN v.failed_i - v.gi END AS op_index,
        CASE WHEN v.outcome = 'accepted' THEN
            (SELECT json_agg(o.result ORDER BY o.i) FROM op_results o WHERE o.gi = v.gi) END
            AS results,
        (SELECT array_agg(d.key) FROM cleared d JOIN w ON w.i = d.i
            WHERE w.gi = v.gi AND d.current_etag IS NOT NULL) AS deleted_keys,
        v.outcome <> 'accepted'
            OR (SELECT count(*) FROM req r WHERE r.gi = v.gi AND r.op = 'put')
                = (SELECT count(*) FROM stored s JOIN req r ON r.key = s.key WHERE r.gi = v.gi)
            AS settled
    FROM verdict v WHERE v.i = v.gi),
