-- The first part of every fenced statement (put.sql and delete_head.sql follow it): the fencing
-- rule, in this one place, and the audit row of a refusal (`refused`), written by the same
-- statement so that it commits with the verdict.
--
-- Parameters: $1 key, $2 presented token, $3 whether If-Match was sent, $4 its strong tags
-- (NULL for `*`); for the audit row of a refusal, $5 request id, $6 remote address, $7 principal
-- and $8 the operation (`put` or `delete`). The statement that follows numbers its own from $9.
--
-- Locks: `cur` takes the key's lease row FOR NO KEY UPDATE, the lock every grant, renewal,
-- release and fenced write of the key takes, so the verdict is made on the row as the last of
-- them left it and nothing can change it until this statement's transaction ends. A grant that
-- commits first is seen (its token is the newest: a lower one is stale); one that comes after
-- waits, and then sees what this statement did. A key with no row has nothing to lock: it never
-- had a lease, so every token is unknown for it. Race-free under READ COMMITTED with any number
-- of instances.
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
    SELECT $1, verdict.outcome, $2, verdict.highest_token, verdict.holder, $8, $5, $6, $7
    FROM verdict WHERE verdict.outcome IN ('stale_token', 'unknown_token')
    RETURNING id),
