-- Of the leases ($1 keys, $2 tokens) the relay looked at, the ones that are still to expire:
-- renewed since, skipped while a hot statement held them, or not yet past expires_at by the
-- database clock. Run after expire.sql, as a statement of its own, so that it sees what a
-- renewal that committed meanwhile wrote. A key granted again is not listed: its grant's event
-- brings the new lease.
SELECT l.key, l.token, l.expires_at
FROM unnest($1::text[], $2::bigint[]) AS d (key, token)
JOIN leases l ON l.key = d.key AND l.token = d.token
LEFT JOIN expiry_reports r ON r.key = l.key AND r.token = l.token
WHERE l.end_reason IS NULL AND r.key IS NULL
