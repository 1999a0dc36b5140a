-- Every lease with an unreported expiry, read once by a relay that takes the role.
SELECT l.key, l.token, l.expires_at
FROM leases l LEFT JOIN expiry_reports r ON r.key = l.key AND r.token = l.token
WHERE l.end_reason IS NULL AND r.key IS NULL
