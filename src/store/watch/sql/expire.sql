-- The relay reports the expiries of leases ($1 keys, $2 tokens) past expires_at by the clock after
-- the lock, unended and unreported. A share lock in key order, skipping rows a hot statement holds:
-- once it commits, renew.sql and end.sql (which check clock_timestamp() after their lock) cannot
-- touch the lease. LATERAL keeps each lookup an index probe on a young table.
WITH due AS (
    SELECT l.key, l.token, l.owner, l.expires_at
    -- The relay may expect a lease twice; an upsert must not meet a key twice.
    FROM (SELECT DISTINCT key, token FROM unnest($1::text[], $2::bigint[]) AS u (key, token)
        ORDER BY key) AS d
    CROSS JOIN LATERAL (
        SELECT l.key, l.token, l.owner, l.expires_at FROM leases l
        WHERE l.key = d.key AND l.token = d.token
            AND l.end_reason IS NULL AND l.expires_at <= clock_timestamp()
        FOR SHARE SKIP LOCKED) AS l),
-- One upsert, each row a primary-key probe (a join plan read the whole table once planned small).
marked AS (
    INSERT INTO expiry_reports AS r (key, token)
    SELECT key, token FROM due ORDER BY key
    ON CONFLICT (key) DO UPDATE SET token = excluded.token WHERE r.token < excluded.token
    RETURNING r.key)
INSERT INTO change_log (kind, key, token, at, owner)
SELECT 'lease.expired', d.key, d.token, d.expires_at, d.owner
FROM due d JOIN marked USING (key)
ORDER BY d.key
