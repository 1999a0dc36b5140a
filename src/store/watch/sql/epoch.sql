-- The relay's epoch (migrations/20261205000000_change_log.sql): the changes committed since
-- the newest epoch's snapshot, as seen by this statement's snapshot, get the next ids; nothing
-- is written when there are none. Two relays (a paused one and its successor) cannot both
-- number: both would insert the same first_id, and the primary key lets one commit. Returns the
-- new epoch's last id and its grants, whose expiries the relay then expects.
WITH prev AS (
    SELECT last_id, snap FROM change_epochs ORDER BY last_id DESC LIMIT 1),
taken AS (
    SELECT pg_current_snapshot() AS snap),
fresh AS (
    SELECT c.kind, c.key, c.token, c.expires_at
    FROM prev CROSS JOIN taken CROSS JOIN LATERAL epoch_changes(prev.snap, taken.snap) c),
made AS (
    INSERT INTO change_epochs (first_id, last_id, after_snap, snap)
    SELECT prev.last_id + 1, prev.last_id + n.count, prev.snap, taken.snap
    FROM prev CROSS JOIN taken CROSS JOIN (SELECT count(*) AS count FROM fresh) n
    WHERE n.count > 0
    RETURNING last_id)
SELECT m.last_id, g.keys, g.tokens, g.expiries
FROM made m CROSS JOIN (
    SELECT array_agg(key) AS keys, array_agg(token) AS tokens, array_agg(expires_at) AS expiries
    FROM fresh WHERE kind = 'lease.granted') g
