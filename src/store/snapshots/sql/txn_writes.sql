-- Transactions' writes, each decided by its first request's gate (`gi`, bound by txn.rs): each
-- op, a delete_prefix as a keyless write (so its fence is checked), and each matching snapshot up to
-- `prefix_limit` + 1 (`over_limit`). Matches are numbered from 1,000,000 × op so refusals name the
-- first key in op order; fenced.sql locks their heads after the fence.
expanded AS (
    SELECT p.i AS prefix_i, p.gi, m.key, p.i * 1000000 + row_number() OVER (PARTITION BY p.i ORDER BY m.key) AS n
    FROM gate p CROSS JOIN LATERAL (
        SELECT h.key FROM snapshot_heads h
        WHERE h.key >= p.prefix AND h.key < p.prefix_end AND h.etag IS NOT NULL
            AND (h.key = p.fence OR starts_with(h.key, p.fence || '/'))
        ORDER BY h.key LIMIT p.prefix_limit + 1) m
    WHERE p.op = 'delete_prefix'),
bound AS (
    SELECT r.gi, coalesce(count(x.key) > max(r.prefix_limit), false) AS over_limit,
        min(r.verdict) FILTER (WHERE r.i = r.gi) AS verdict
    FROM gate r LEFT JOIN expanded x ON x.prefix_i = r.i GROUP BY r.gi),
w AS (
    SELECT r.i, r.gi, r.op, r.key, coalesce(r.key, r.prefix) AS subject, r.fence,
        r.token, r.has_if_match, r.tags, r.if_none_match, r.operation, r.request_id,
        r.remote_addr, r.principal, r.etag, r.size, r.content_type, r.keep, r.metadata,
        r.stale_below, b.over_limit, b.verdict
    FROM gate r JOIN bound b ON b.gi = r.gi
    UNION ALL
    SELECT x.n, x.gi, 'delete', x.key, x.key, r.fence, r.token, false, NULL, false, r.operation,
        r.request_id, r.remote_addr, r.principal, NULL, NULL, NULL, r.keep, NULL,
        r.stale_below, b.over_limit, b.verdict
    FROM expanded x JOIN gate r ON r.i = x.prefix_i JOIN bound b ON b.gi = x.gi),
