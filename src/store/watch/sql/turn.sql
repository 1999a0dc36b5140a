-- One relay turn: keeps the role ($2 true, only while its time lasts by the database clock) or
-- takes it ($2 false, only when expired); $1 the name, $3 the term in ms. The row lock serialises
-- takers and late keepers; the loser numbers nothing.
--
-- With the role, changes committed since the newest epoch become an epoch with the next ids, and
-- `snapfence_changes` is notified. Two relays could not number the same changes anyway: the primary
-- key on first_id lets one commit. Returns the clock and the epoch's changes as read.sql does.
WITH role AS (
    UPDATE change_relay SET holder = $1, expires_at = now() + $3 * interval '1 millisecond'
    WHERE CASE WHEN $2 THEN holder = $1 AND expires_at > now() ELSE expires_at <= now() END
    RETURNING now() AS clock),
-- The role as one row, so the generic plan does not guess many rows and replan at every call.
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
    x.txn_size, x.xid::text AS xid
FROM held r LEFT JOIN made m ON true LEFT JOIN LATERAL (
    SELECT m.first_id - 1 + row_number() OVER (ORDER BY f.seq) AS id, f.*
    FROM fresh f) x ON true
ORDER BY x.id
