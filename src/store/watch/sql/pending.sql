-- Of the leases the relay looked at, those still to expire (renewed, skipped, or not yet due), as a
-- separate statement that sees renewals committed meanwhile. LATERAL and LIMIT keep each an index
-- probe.
SELECT l.key, l.token, l.expires_at
FROM unnest($1::text[], $2::bigint[]) AS d (key, token)
CROSS JOIN LATERAL (
    SELECT l.key, l.token, l.expires_at FROM leases l
    WHERE l.key = d.key AND l.token = d.token AND l.end_reason IS NULL LIMIT 1) AS l
LEFT JOIN LATERAL (
    SELECT true AS reported FROM expiry_reports r
    WHERE r.key = l.key AND r.token = l.token LIMIT 1) AS r ON true
WHERE r.reported IS NULL
