-- The relay's report of expiries: of the leases ($1 keys, $2 tokens) whose expires_at has
-- passed by the database clock read after the lock, unended, the ones whose expiry no one
-- reported yet (expiry_reports: the grant that replaces a lease may have) get `lease.expired`
-- (at its expires_at). No UPDATE of the lease: a share lock, taken in key order like every hot
-- statement's, and skipping a row a hot statement holds (tried again at the relay's next turn).
-- The lock is what makes the report final: renew.sql and end.sql check the lease against
-- clock_timestamp() after their own lock, so once this commits no one renews or ends it.
--
-- Each lease is looked up by its key (LATERAL: an index probe per lease, whatever the planner
-- guesses of a young table; joined, it sorted the whole table for a merge join on a database
-- without statistics yet, 6-12 ms a report under load), in key order.
WITH due AS (
    SELECT l.key, l.token, l.owner, l.expires_at
    -- DISTINCT: the relay may expect a lease twice (from its first read and from an epoch), and
    -- an upsert must not meet one key twice.
    FROM (SELECT DISTINCT key, token FROM unnest($1::text[], $2::bigint[]) AS u (key, token)
        ORDER BY key) AS d
    CROSS JOIN LATERAL (
        SELECT l.key, l.token, l.owner, l.expires_at FROM leases l
        WHERE l.key = d.key AND l.token = d.token
            AND l.end_reason IS NULL AND l.expires_at <= clock_timestamp()
        FOR SHARE SKIP LOCKED) AS l),
-- The mark: in place where the snapshot sees the key's row, else upserted (as in acquire.sql's
-- `expired`, and for the same reason: an upsert's lock is a WAL record even when it changes
-- nothing). The change rows come from what was marked, with the lease as `due` read it.
updated AS (
    UPDATE expiry_reports r SET token = d.token FROM due d
    WHERE r.key = d.key AND r.token < d.token
    RETURNING d.key, d.token, d.owner, d.expires_at),
inserted AS (
    INSERT INTO expiry_reports AS r (key, token)
    SELECT key, token FROM due d
    WHERE NOT EXISTS (SELECT FROM expiry_reports x WHERE x.key = d.key)
    ORDER BY key
    ON CONFLICT (key) DO UPDATE SET token = excluded.token WHERE r.token < excluded.token
    RETURNING r.key)
INSERT INTO change_log (kind, key, token, at, owner)
SELECT 'lease.expired', key, token, expires_at, owner
FROM (SELECT key, token, owner, expires_at FROM updated
    UNION ALL
    SELECT d.key, d.token, d.owner, d.expires_at FROM due d JOIN inserted USING (key)) m
ORDER BY key
