-- The relay's report of expiries: the leases ($1 keys, $2 tokens) whose expires_at has passed
-- by the database clock, still unended and unreported, are marked; the leases trigger notes
-- `lease.expired` for each (at its expires_at). Its own statement, outside the relay's
-- numbering transaction (a mark needs no fence: a second mark of a lease changes nothing), so
-- its row locks last one statement. Rows are locked in key order, the order every hot
-- statement locks in, and a row a hot statement holds is skipped, not waited for: the relay
-- tries it again at its next turn (changes_pending.sql still lists it). The lock yields the
-- row's newest version and the conditions are checked on it: a renewed lease is not expired, a
-- re-granted key has another token. renew.sql and end.sql refuse a lease once it is marked, so
-- no one brings it back after the watchers heard it expired.
WITH due AS (
    SELECT l.key FROM leases l
    JOIN unnest($1::text[], $2::bigint[]) AS d (key, token) ON l.key = d.key AND l.token = d.token
    WHERE l.end_reason IS NULL AND NOT l.expiry_reported AND l.expires_at <= now()
    ORDER BY l.key
    FOR NO KEY UPDATE OF l SKIP LOCKED)
UPDATE leases l SET expiry_reported = true FROM due WHERE l.key = due.key
