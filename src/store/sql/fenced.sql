-- The first part of every fenced statement (put.sql and delete_head.sql follow it): the fencing
-- rule, in this one place, and the audit row of a refusal (`refused`), written by the same
-- statement so that it commits with the verdict.
--
-- gate.sql comes before it (nothing is checked, refused or written unless its verdict is `run`),
-- and remember.sql after the statement that follows it.
--
-- Parameters after gate.sql's: $5 key, $6 presented token, $7 whether If-Match was sent, $8 its
-- strong tags (NULL for `*`); for the audit row of a refusal, $9 request id, $10 remote address
-- and $11 the operation (`put` or `delete`), with gate.sql's $3, the principal. The statement
-- that follows numbers its own from $12.
--
-- Locks: `cur` takes the key's lease row FOR NO KEY UPDATE, the lock every grant, renewal,
-- release and fenced write of the key takes, so the verdict is made on the row as the last of
-- them left it and nothing can change it until this statement's transaction ends. A grant that
-- commits first is seen (its token is the newest: a lower one is stale); one that comes after
-- waits, and then sees what this statement did. A key with no row has nothing to lock: it never
-- had a lease, so every token is unknown for it. Race-free under READ COMMITTED with any number
-- of instances.
cur AS (
    SELECT key, token, owner, end_reason, snapshot_version, snapshot_etag
    FROM leases, gate WHERE key = $5 AND gate.verdict = 'run' FOR NO KEY UPDATE OF leases),
verdict AS (
    SELECT CASE
        WHEN gate.verdict <> 'run' THEN gate.verdict
        WHEN cur.key IS NULL OR $6 > cur.token THEN 'unknown_token'
        WHEN $6 < cur.token OR cur.end_reason IS NOT NULL THEN 'stale_token'
        WHEN $7 AND (cur.snapshot_etag IS NULL
                     OR NOT ($8::text[] IS NULL OR cur.snapshot_etag = ANY($8::text[])))
            THEN 'precondition_failed'
        ELSE 'accepted'
    END AS outcome,
    cur.token AS highest_token, cur.owner AS holder,
    cur.snapshot_etag IS NULL AS created, cur.snapshot_version
    FROM gate LEFT JOIN cur ON true),
refused AS (
    INSERT INTO rejections (key, reason, presented_token, highest_token, holder,
        operation, request_id, remote_addr, principal)
    SELECT $5, verdict.outcome, $6, verdict.highest_token, verdict.holder, $11, $9, $10, $3
    FROM verdict WHERE verdict.outcome IN ('stale_token', 'unknown_token')
    RETURNING id),
