-- Each transaction's one answer, on its first request's row, after fenced, put and delete: all
-- written or none. Not settled when a put lost the race to create its head. Each stored version
-- is one `written` row, stored at now(); looked up in arrays, since the generic plan, taking
-- `written` for a row or two, would rescan it for every op. `op_results` makes every
-- transaction's results in one pass (a subquery per transaction built a hash table for each).
written_at AS MATERIALIZED (
    SELECT coalesce(array_agg(h.i), '{}') AS i, array_agg(h.version) AS version FROM written h),
op_results AS (
    SELECT r.gi, json_agg(CASE r.op
        WHEN 'put' THEN json_build_object('version', x.version[array_position(x.i, r.i)],
            'updated_at', now(), 'created', v.created)
        WHEN 'delete' THEN json_build_object('deleted',
            EXISTS (SELECT FROM cleared d WHERE d.key = r.key AND d.current_etag IS NOT NULL))
        ELSE json_build_object('deleted',
            (SELECT count(*) FROM expanded x JOIN cleared d ON d.key = x.key WHERE x.prefix_i = r.i))
    END ORDER BY r.i) AS results,
        bool_and(r.op <> 'put' OR array_position(x.i, r.i) IS NOT NULL) AS written
    FROM gate r JOIN verdict v ON v.i = r.i CROSS JOIN written_at x GROUP BY r.gi),
result AS (
    SELECT v.i, v.outcome, v.highest_token,
        (SELECT f.id FROM refused f JOIN w ON w.subject = f.key WHERE w.i = v.failed_i)
            AS audit_id,
        CASE WHEN v.outcome = 'precondition_failed' THEN v.failed_i - v.gi END AS op_index,
        CASE WHEN v.outcome = 'accepted' THEN o.results END AS results,
        (SELECT array_agg(d.key) FROM cleared d
            WHERE d.gi = v.gi AND d.current_etag IS NOT NULL) AS deleted_keys,
        v.outcome <> 'accepted' OR o.written AS settled
    FROM verdict v JOIN op_results o ON o.gi = v.gi WHERE v.i = v.gi),
