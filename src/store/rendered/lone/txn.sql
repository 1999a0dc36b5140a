-- src/store/rendered/lone/txn.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The one request of a batch of one (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal,
-- $4 key_id, $5 key, $6 fence, $7 token, $8 if_none_match, $9 op, $10 prefix, $11 prefix_end, $12
-- prefix_limit, $13 has_if_match, $14 tags, $15 request_id, $16 remote_addr, $17 operation, $18
-- etag, $19 size, $20 content_type, $21 body, $22 keep, $23 metadata, $24 gi
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.fence, r.token, r.if_none_match, r.op,
        r.prefix, r.prefix_end, r.prefix_limit, r.has_if_match, CASE WHEN r.tags IS NOT NULL THEN
        ARRAY(SELECT json_array_elements_text(r.tags::json)) END AS tags, r.request_id,
        r.remote_addr, r.operation, r.etag, r.size, r.content_type, r.keep, r.metadata, r.gi,
        NULL::bigint AS stale_below, r.i
    FROM (SELECT ($1::text[])[1] AS idem, ($2::bytea[])[1] AS fp, ($3::text[])[1] AS principal,
        ($4::int8[])[1] AS key_id, ($5::text[])[1] AS key, ($6::text[])[1] AS fence, ($7::int8[])[1]
        AS token, ($8::bool[])[1] AS if_none_match, ($9::text[])[1] AS op, ($10::text[])[1] AS
        prefix, ($11::text[])[1] AS prefix_end, ($12::int8[])[1] AS prefix_limit, ($13::bool[])[1]
        AS has_if_match, ($14::text[])[1] AS tags, ($15::text[])[1] AS request_id, ($16::text[])[1]
        AS remote_addr, ($17::text[])[1] AS operation, ($18::text[])[1] AS etag, ($19::int8[])[1] AS
        size, ($20::text[])[1] AS content_type, ($22::int8[])[1] AS keep, ($23::text[])[1] AS
        metadata, ($24::int8[])[1] AS gi, 1::int8 AS i) r),
-- Columns kept out of `req`, each the batch's array: request i's is p.name[i].
positional AS (
    SELECT $21::bytea[] AS body),
-- The first part of every changing statement after `req`: each request, as every later part reads
-- it, with whether it may run (`verdict`) and its Idempotency-Key's stored answer (`prior_*`);
-- every change requires `verdict = 'run'`. A batch never holds two requests for one key or one
-- Idempotency-Key, so each is decided as if alone.
--
-- Verdicts: `revoked` (the API key was revoked), `replay` (a record exists), `run` (no key, or this
-- statement took the key's transaction-level advisory lock), `in_progress` (another holds it).
-- The record is a LIMITed subquery so the hot connections' generic plan reads by primary key.
--
-- Race-freedom: the lock admits one statement per key at a time. One whose snapshot predates the
-- first's commit finds no record and runs, but its INSERT (remember.sql) meets the first's row, the
-- statement rolls back on the unique violation, and the batch runs again.
gate AS (
    SELECT r.*, p.fingerprint AS prior_fingerprint, p.answer AS prior_answer, CASE
        WHEN r.key_id IS NOT NULL
            AND NOT EXISTS (SELECT FROM api_keys WHERE id = r.key_id AND revoked_at IS NULL)
            THEN 'revoked'
        WHEN r.idem IS NULL THEN 'run'
        WHEN p.fingerprint IS NOT NULL THEN 'replay'
        WHEN pg_try_advisory_xact_lock(hashtextextended(r.idem, hashtext(coalesce(r.principal, ''))))
            THEN 'run'
        ELSE 'in_progress'
    END AS verdict
    FROM req r LEFT JOIN LATERAL (
        SELECT fingerprint, answer FROM idempotency_records
        WHERE principal = coalesce(r.principal, '') AND key = r.idem LIMIT 1) p ON true),
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
-- Fenced writes after fenced.sql, in one statement so checks, writes or refusals, and pruning
-- commit together. `stored` reads each body by its request's place in `positional` (the bound
-- bodies, or the connection's upload: put_uploaded derives it), so no other part copies a body
-- along. `put_old` bumps the version on the locked head (gapless under any race), `put_new`
-- creates a head; `pruned` drops versions out of the window above `pruned_through`.
put_old AS (
    UPDATE snapshot_heads h SET version = h.version + 1, etag = v.etag,
        pruned_through = greatest(h.pruned_through, h.version + 1 - v.keep),
        written_token = greatest(h.written_token, v.token)
    FROM verdict v
    WHERE h.key = v.key AND v.outcome = 'accepted' AND v.has_head AND v.op = 'put'
    RETURNING v.i, h.key, h.version, v.pruned_through, v.token, v.etag, v.size,
        v.content_type, v.keep, v.fence, v.metadata, v.txn_size),
put_new AS (
    INSERT INTO snapshot_heads (key, version, etag, written_token)
    SELECT v.key, 1, v.etag, v.token
    FROM verdict v
    WHERE v.outcome = 'accepted' AND NOT v.has_head AND v.op = 'put'
    ORDER BY v.key
    ON CONFLICT (key) DO NOTHING
    RETURNING key),
-- The heads made, as one array: a put that lost the race to make its head is not written.
made AS MATERIALIZED (
    SELECT coalesce(array_agg(n.key), '{}') AS keys FROM put_new n),
written AS (
    SELECT * FROM put_old
    UNION ALL
    SELECT v.i, v.key, 1, 0, v.token, v.etag, v.size, v.content_type, v.keep, v.fence,
        v.metadata, v.txn_size
    FROM verdict v CROSS JOIN made m
    WHERE v.outcome = 'accepted' AND NOT v.has_head AND v.op = 'put' AND v.key = ANY(m.keys)),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at,
        body, fencing_key, metadata)
    SELECT h.key, h.version, h.token, h.etag, h.size, h.content_type, now(), p.body[h.i],
        h.fence, h.metadata::json
    FROM written h CROSS JOIN positional p
    RETURNING key, version, updated_at),
written_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag, fencing_key, txn_size)
    SELECT 'snapshot.written', h.key, h.token, now(), h.version, h.etag, h.fence, h.txn_size
    FROM written h ORDER BY h.key),
pruned AS (
    DELETE FROM snapshot_versions sv
    USING written h
    WHERE sv.key = h.key AND sv.version > h.pruned_through AND sv.version <= h.version - h.keep),
-- Fenced deletes after fenced.sql: `cleared` marks each accepted head (locked by `heads`) as having
-- no snapshot; delete_versions.sql removes versions under the same lock.
cleared AS (
    UPDATE snapshot_heads h SET etag = NULL, written_token = greatest(h.written_token, v.token)
    FROM verdict v
    WHERE h.key = v.key AND v.outcome = 'accepted' AND v.has_head AND v.op = 'delete'
    RETURNING v.i, v.gi, h.key, v.token, v.fence, v.version, v.current_etag, v.txn_size),
deleted_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag, fencing_key, txn_size)
    SELECT 'snapshot.deleted', d.key, d.token, now(), d.version, d.current_etag, d.fence,
        d.txn_size
    FROM cleared d WHERE d.current_etag IS NOT NULL ORDER BY d.key),
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
-- The last part of every changing statement: one answer row per request, `settled` false when it
-- will be sent again. `remembered` stores each answer under its Idempotency-Key in this statement,
-- so the record commits exactly with the change; no ON CONFLICT, so a racing record rolls the
-- statement back (gate.sql). A transaction's ops after its first have JSON null.
remembered AS (
    INSERT INTO idempotency_records (principal, key, fingerprint, answer)
    SELECT coalesce(g.principal, ''), g.idem, g.fp, to_json(res)
    FROM result res JOIN gate g ON g.i = res.i
    WHERE g.verdict = 'run' AND g.idem IS NOT NULL AND res.settled)
SELECT g.i, g.verdict AS gate, g.prior_fingerprint,
    coalesce(g.prior_answer, (SELECT to_json(res) FROM result res WHERE res.i = g.i), 'null')
        AS answer
FROM gate g
