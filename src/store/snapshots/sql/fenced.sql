-- The fencing rules, in this one place, for every write (writes.sql, txn_writes.sql), with the
-- audit row of each refused group in the same statement. A write under lease `fence` with `token`
-- is accepted only if (1) the token is the fence's newest and not given up, and (2) it is at least
-- the highest that wrote the key. Rule (1)'s bound is the fence's token unless `stale_below` (a
-- `req` column, NULL but in the fault tests' negative control) gives another.
--
-- Locks: `cur` takes the fences' lease rows FOR NO KEY UPDATE in key order, as every grant and
-- ending does, so no grant slips between verdict and commit; only then does `heads` lock the heads
-- in key order. Lease rows always before heads, so no cycle. A missing head is inserted ON CONFLICT
-- DO NOTHING; the loser runs again.
cur AS (
    SELECT w.i, l.key, l.token, l.owner, l.end_reason
    FROM w JOIN leases l ON l.key = w.fence WHERE w.verdict = 'run'
    ORDER BY l.key FOR NO KEY UPDATE OF l),
heads AS (
    SELECT w.i, h.key, h.version, h.etag, h.pruned_through, h.written_token
    FROM w JOIN snapshot_heads h ON h.key = w.key
    WHERE w.verdict = 'run' AND (SELECT count(*) FROM cur) >= 0
    ORDER BY h.key FOR NO KEY UPDATE OF h),
checked AS (
    SELECT w.i, w.gi, w.key, w.op, w.operation = 'txn' AS in_txn, c.token AS fence_token,
        c.owner AS holder, h.written_token,
        h.key IS NOT NULL AS has_head, h.etag AS current_etag, coalesce(h.version, 0) AS version,
        coalesce(h.pruned_through, 0) AS pruned_through, CASE
        WHEN w.verdict <> 'run' THEN w.verdict
        WHEN c.key IS NULL OR w.token > c.token THEN 'unknown_token'
        WHEN w.token < coalesce(w.stale_below, c.token) OR c.end_reason IS NOT NULL
            THEN 'stale_token'
        WHEN w.token < h.written_token THEN 'stale_written'
        WHEN w.over_limit THEN 'too_many_keys'
        WHEN w.has_if_match AND (h.etag IS NULL
                     OR NOT (w.tags IS NULL OR h.etag = ANY(w.tags)))
            THEN 'precondition_failed'
        WHEN w.if_none_match AND h.etag IS NOT NULL THEN 'precondition_failed'
        ELSE 'accepted'
    END AS rule,
        -- The write itself, carried on: a join of two CTEs is a nested loop in the generic plan.
        w.subject, w.fence, w.token, w.operation, w.request_id, w.remote_addr, w.principal,
        w.etag, w.size, w.content_type, w.keep, w.metadata
    FROM w LEFT JOIN cur c ON c.i = w.i LEFT JOIN heads h ON h.i = w.i),
-- A group (a request, or a transaction) is decided by its first failing write, the first of its
-- rows in `g`'s order (`f_*`): all of it is written, or none. Rule (2)'s refusal is
-- `stale_token`. `txn_size` counts a transaction's changes for the watch.
verdict AS (
    SELECT k.i, k.gi, k.key, k.holder, k.has_head, k.current_etag, k.version,
        k.pruned_through, k.current_etag IS NULL AS created,
        CASE WHEN k.f_rule <> 'accepted' THEN k.f_i END AS failed_i,
        CASE WHEN k.in_txn THEN k.changes END AS txn_size,
        CASE k.f_rule WHEN 'stale_written' THEN 'stale_token' ELSE k.f_rule END AS outcome,
        CASE k.f_rule WHEN 'accepted' THEN NULL WHEN 'stale_written' THEN k.f_written_token
            ELSE k.f_fence_token END AS highest_token,
        k.op, k.subject, k.fence, k.token, k.operation, k.request_id, k.remote_addr,
        k.principal, k.etag, k.size, k.content_type, k.keep, k.metadata
    FROM (
        SELECT k.*, first_value(k.i) OVER g AS f_i, first_value(k.rule) OVER g AS f_rule,
            first_value(k.written_token) OVER g AS f_written_token,
            first_value(k.fence_token) OVER g AS f_fence_token,
            count(*) FILTER (WHERE k.op = 'put' OR k.current_etag IS NOT NULL) OVER g AS changes
        FROM checked k
        WINDOW g AS (PARTITION BY k.gi ORDER BY k.rule = 'accepted', CASE k.rule
            WHEN 'precondition_failed' THEN 2 WHEN 'too_many_keys' THEN 1 ELSE 0 END, k.i
            ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)) k),
refused AS (
    INSERT INTO rejections (key, reason, presented_token, highest_token, holder,
        operation, request_id, remote_addr, principal, fencing_key)
    SELECT v.subject, v.outcome, v.token, v.highest_token, v.holder, v.operation,
        v.request_id, v.remote_addr, v.principal, v.fence
    FROM verdict v
    WHERE v.i = v.failed_i AND v.outcome IN ('stale_token', 'unknown_token')
    ORDER BY v.gi
    RETURNING id, key, at, reason, presented_token, highest_token, holder, operation,
        fencing_key),
refusals_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner, reason, audit_id, operation,
        highest_token, fencing_key)
    SELECT 'write.refused', f.key, f.presented_token, f.at, f.holder, f.reason, f.id,
        f.operation, f.highest_token, f.fencing_key
    FROM refused f ORDER BY f.id),
