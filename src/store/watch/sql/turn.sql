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
-- the same first_id, and the primary key lets one commit. Returns the database clock and, if an
-- epoch was made, its changes with their ids (one row each), in the columns of read.sql: the
-- relay's own instance hands them to its watchers without reading them again (their ids are
-- their rank by seq, as read.sql gives them), and the relay expects the grants' expiries.
WITH role AS (
    UPDATE change_relay SET holder = $1, expires_at = now() + $3 * interval '1 millisecond'
    WHERE CASE WHEN $2 THEN holder = $1 AND expires_at > now() ELSE expires_at <= now() END
    RETURNING now() AS clock),
-- The role as one row (it is at most one, the table's): what follows reads this, so that a
-- generic plan, which cannot tell how many rows the UPDATE's condition keeps, does not guess
-- hundreds, look dearer than planning each call, and have the turn planned at every call
-- (bench/README.md, seventh pass).
held AS (
    SELECT clock FROM role LIMIT 1),
prev AS (
    SELECT last_id, snap FROM change_epochs ORDER BY last_id DESC LIMIT 1),
taken AS (
    SELECT pg_current_snapshot() AS snap),
fresh AS (
    SELECT c.*
    FROM held CROSS JOIN prev CROSS JOIN taken
    CROSS JOIN LATERAL epoch_changes(prev.snap, taken.snap) c),
made AS (
    INSERT INTO change_epochs (first_id, last_id, after_snap, snap)
    SELECT prev.last_id + 1, prev.last_id + n.count, prev.snap, taken.snap
    FROM prev CROSS JOIN taken CROSS JOIN (SELECT count(*) AS count FROM fresh) n
    WHERE n.count > 0
    RETURNING first_id, last_id),
told AS (
    SELECT pg_notify('snapfence_changes', last_id::text) FROM made)
SELECT r.clock, (SELECT count(*) FROM told) AS told, m.first_id, m.last_id,
    m.last_id AS newest, x.id, x.kind, x.key, x.token, x.at, x.owner, x.expires_at, x.version,
    x.etag, x.reason, x.audit_id, x.operation, x.highest_token, x.record_token, x.fencing_key,
    x.txn, x.txn_size
FROM held r LEFT JOIN made m ON true LEFT JOIN LATERAL (
    SELECT n.*, CASE WHEN n.txn_size IS NOT NULL
        THEN min(n.id) OVER (PARTITION BY n.xid, n.txn_size IS NOT NULL) END AS txn
    FROM (SELECT m.first_id - 1 + row_number() OVER (ORDER BY f.seq) AS id, f.*
        FROM fresh f) n) x ON true
ORDER BY x.id
