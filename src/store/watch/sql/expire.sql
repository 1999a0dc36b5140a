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
-- The mark: one upsert, whose every row is a probe of the primary key (a grant's report, in
-- acquire.sql, is an UPDATE where it finds the row, since most of its marks change nothing; here
-- each changes the row). Planned as a join on `due` instead, the UPDATE read all of
-- expiry_reports at each report once its plan was made on a small table (bench/README.md,
-- seventh pass). The change rows come from what was marked, with the lease as `due` read it.
marked AS (
    INSERT INTO expiry_reports AS r (key, token)
    SELECT key, token FROM due ORDER BY key
    ON CONFLICT (key) DO UPDATE SET token = excluded.token WHERE r.token < excluded.token
    RETURNING r.key)
INSERT INTO change_log (kind, key, token, at, owner)
SELECT 'lease.expired', d.key, d.token, d.expires_at, d.owner
FROM due d JOIN marked USING (key)
ORDER BY d.key
