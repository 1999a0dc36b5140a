-- One turn of the relay, in one statement: keeps the role ($2 = true: only while its time has
-- not run out by the database clock, so a relay that was paused past it keeps nothing) or takes
-- it ($2 = false: only when the holder's time ran out); $1 is the instance's name, $3 how long
-- the role lasts, in milliseconds. The role's row lock makes two takers, or a taker and a late
-- keeper, take turns; the loser finds the row changed, gets no row, and numbers nothing.
--
-- With the role, the changes committed since the newest epoch's snapshot, as this statement's
-- snapshot sees them, become an epoch with the next ids (migrations/20261205000000_change_log.sql),
-- and the instances are told (`snapfence_changes`, with the new last id); nothing is written
-- when there are none. Two relays could not number the same changes even so: both would insert
-- the same first_id, and the primary key lets one commit. Returns the database clock, and the
-- new epoch's last id and grants (whose expiries the relay then expects), if one was made.
WITH role AS (
    UPDATE change_relay SET holder = $1, expires_at = now() + $3 * interval '1 millisecond'
    WHERE CASE WHEN $2 THEN holder = $1 AND expires_at > now() ELSE expires_at <= now() END
    RETURNING now() AS clock),
prev AS (
    SELECT last_id, snap FROM change_epochs ORDER BY last_id DESC LIMIT 1),
taken AS (
    SELECT pg_current_snapshot() AS snap),
fresh AS (
    SELECT c.kind, c.key, c.token, c.expires_at
    FROM role CROSS JOIN prev CROSS JOIN taken
    CROSS JOIN LATERAL epoch_changes(prev.snap, taken.snap) c),
made AS (
    INSERT INTO change_epochs (first_id, last_id, after_snap, snap)
    SELECT prev.last_id + 1, prev.last_id + n.count, prev.snap, taken.snap
    FROM prev CROSS JOIN taken CROSS JOIN (SELECT count(*) AS count FROM fresh) n
    WHERE n.count > 0
    RETURNING last_id),
told AS (
    SELECT pg_notify('snapfence_changes', last_id::text) FROM made)
SELECT r.clock, m.last_id, g.keys, g.tokens, g.expiries, (SELECT count(*) FROM told) AS told
FROM role r LEFT JOIN made m ON true CROSS JOIN (
    SELECT array_agg(key) AS keys, array_agg(token) AS tokens, array_agg(expires_at) AS expiries
    FROM fresh WHERE kind = 'lease.granted') g
