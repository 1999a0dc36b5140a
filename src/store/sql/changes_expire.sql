-- The relay's report of expiries: the leases ($1 keys, $2 tokens) whose expires_at has passed
-- by the database clock, still unended and unreported, are marked; the leases trigger notes
-- `lease.expired` for each (at its expires_at). The row lock waits for a renewal or a grant in
-- flight on the same row, and the conditions are checked again on the row it left: a renewed
-- lease is not expired, a re-granted key has another token. renew.sql and end.sql refuse a
-- lease once it is marked, so no one brings it back after the watchers heard it expired.
UPDATE leases l SET expiry_reported = true
FROM unnest($1::text[], $2::bigint[]) AS d (key, token)
WHERE l.key = d.key AND l.token = d.token AND l.end_reason IS NULL AND NOT l.expiry_reported
    AND l.expires_at <= now()
