-- The whole epochs ending after id $1, in id order (ids are ranks by seq, known only once an epoch
-- is read whole): those beginning within $2 changes, at most $3 epochs. Each epoch gives at least
-- one row so the reader knows how far it read; `newest` says whether it read all. `xid` groups a
-- transaction's changes (history.rs gives them the id of the first as `txn`).
WITH e AS (
    SELECT first_id, last_id, after_snap, snap FROM (
        SELECT first_id, last_id, after_snap, snap,
            sum(last_id - first_id + 1) OVER (ORDER BY last_id) - (last_id - first_id + 1) AS before
        FROM change_epochs WHERE last_id > $1 ORDER BY last_id LIMIT $3) w
    WHERE before < $2)
SELECT e.first_id, e.last_id, (SELECT max(last_id) FROM change_epochs) AS newest, x.id, x.kind,
    x.key, x.token, x.at, x.owner, x.expires_at, x.version, x.etag, x.reason, x.audit_id,
    x.operation, x.highest_token, x.record_token, x.fencing_key, x.txn_size, x.xid::text AS xid
FROM e LEFT JOIN LATERAL (
    SELECT e.first_id - 1 + row_number() OVER (ORDER BY c.seq) AS id, c.*
    FROM epoch_changes(e.after_snap, e.snap) c) x ON true
ORDER BY e.last_id, x.id
