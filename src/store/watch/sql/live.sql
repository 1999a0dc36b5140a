-- Every lease whose expiry is still to be reported, for a relay that takes the role: it keeps
-- their expiry times from then on. Reads the whole table once per change of relay.
SELECT l.key, l.token, l.expires_at
FROM leases l LEFT JOIN expiry_reports r ON r.key = l.key AND r.token = l.token
WHERE l.end_reason IS NULL AND r.key IS NULL
