-- Of the leases ($1 keys, $2 tokens) the relay looked at, the ones that are still to expire:
-- renewed since, skipped while a hot statement held them, or not yet past expires_at by the
-- database clock. Run after expire.sql, as a statement of its own, so that it sees what a
-- renewal that committed meanwhile wrote. A key granted again is not listed: its grant's event
-- brings the new lease.
-- Each lease and its report looked up by key (LATERAL, LIMIT: an index probe each, whatever the
-- planner guesses of a young table; joined, its generic plan read all of leases).
SELECT l.key, l.token, l.expires_at
FROM unnest($1::text[], $2::bigint[]) AS d (key, token)
CROSS JOIN LATERAL (
    SELECT l.key, l.token, l.expires_at FROM leases l
    WHERE l.key = d.key AND l.token = d.token AND l.end_reason IS NULL LIMIT 1) AS l
LEFT JOIN LATERAL (
    SELECT true AS reported FROM expiry_reports r
    WHERE r.key = l.key AND r.token = l.token LIMIT 1) AS r ON true
WHERE r.reported IS NULL
