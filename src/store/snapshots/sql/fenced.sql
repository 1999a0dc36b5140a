-- The first part of every fenced statement (put.sql, delete_head.sql and precheck.sql follow
-- it), for each request of the batch: the fencing rule, in this one place, and the audit row of
-- a refusal (`refused`), written by the same statement so that it commits with the verdict.
--
-- The requests (`req`: key, token, has_if_match, tags, request_id, remote_addr, operation, and for
-- a write etag, size, content_type, body and keep; src/store/snapshots/mod.rs names them) and
-- gate.sql come before it (nothing of a request is checked, refused or written unless its gate
-- verdict is `run`), and remember.sql after the statement that follows it. `{{stale_below}}`
-- is what a lower token is stale against: the key's newest granted token (`r.token < c.token
-- OR`); only the fault tests' negative control fills it otherwise.
--
-- Locks: `cur` takes each key's lease row FOR NO KEY UPDATE, in key order (the order every
-- batched statement locks in), the lock every grant, renewal, release and fenced write of the
-- key takes, so the verdict is made on the row as the last of them left it and nothing can
-- change it until this statement's transaction ends. A grant that commits first is seen (its
-- token is the newest: a lower one is stale); one that comes after waits, and then sees what this
-- statement did. A key with no row has nothing to lock: it never had a lease, so every token is
-- unknown for it. Race-free under READ COMMITTED with any number of instances.
cur AS (
    SELECT r.i, l.key, l.token, l.owner, l.end_reason, l.snapshot_version, l.snapshot_etag,
        l.versions_pruned_through
    FROM req r JOIN gate g ON g.i = r.i AND g.verdict = 'run' JOIN leases l ON l.key = r.key
    ORDER BY l.key FOR NO KEY UPDATE OF l),
verdict AS (
    SELECT r.i, r.key, CASE
        WHEN g.verdict <> 'run' THEN g.verdict
        WHEN c.key IS NULL OR r.token > c.token THEN 'unknown_token'
        WHEN {{stale_below}} c.end_reason IS NOT NULL THEN 'stale_token'
        WHEN r.has_if_match AND (c.snapshot_etag IS NULL
                     OR NOT (r.tags IS NULL OR c.snapshot_etag = ANY(r.tags)))
            THEN 'precondition_failed'
        ELSE 'accepted'
    END AS outcome,
    c.token AS highest_token, c.owner AS holder,
    c.snapshot_etag IS NULL AS created, c.snapshot_version,
    c.versions_pruned_through AS pruned_through
    FROM req r JOIN gate g ON g.i = r.i LEFT JOIN cur c ON c.i = r.i),
refused AS (
    INSERT INTO rejections (key, reason, presented_token, highest_token, holder,
        operation, request_id, remote_addr, principal)
    SELECT r.key, v.outcome, r.token, v.highest_token, v.holder, r.operation, r.request_id,
        r.remote_addr, r.principal
    FROM verdict v JOIN req r ON r.i = v.i WHERE v.outcome IN ('stale_token', 'unknown_token')
    RETURNING id, key, at, reason, presented_token, highest_token, holder, operation),
-- The watch's change of each refusal (`write.refused`, migrations/20261205000000_change_log.sql).
refusals_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner, reason, audit_id, operation,
        highest_token)
    SELECT 'write.refused', f.key, f.presented_token, f.at, f.holder, f.reason, f.id,
        f.operation, f.highest_token
    FROM refused f ORDER BY f.id),
