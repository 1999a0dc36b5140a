-- The changes after id $1, in id order, from whole epochs: as many as begin within $2 changes of
-- the first (at least one) and at most $3 of them. Whole epochs, since an epoch's changes are
-- ranked by seq only once all of them are read (epoch_changes() is unordered): reading a large
-- epoch in pages read it whole for each page, and a relay behind the load (large epochs) then
-- made the readers read each change many times over, which kept it behind. Every epoch read
-- gives at least one row (with no change when it has none after $1), so that the reader knows
-- how far it has read; `newest` is the newest epoch's last id, so that it knows whether it has
-- read everything. A change's id is its rank by seq in its epoch; a transaction's changes share
-- its xid, and take the id of its first as `txn`.
WITH e AS (
    SELECT first_id, last_id, after_snap, snap FROM (
        SELECT first_id, last_id, after_snap, snap,
            sum(last_id - first_id + 1) OVER (ORDER BY last_id) - (last_id - first_id + 1) AS before
        FROM change_epochs WHERE last_id > $1 ORDER BY last_id LIMIT $3) w
    WHERE before < $2)
SELECT e.first_id, e.last_id, (SELECT max(last_id) FROM change_epochs) AS newest, x.id, x.kind,
    x.key, x.token, x.at, x.owner, x.expires_at, x.version, x.etag, x.reason, x.audit_id,
    x.operation, x.highest_token, x.record_token, x.fencing_key, x.txn, x.txn_size
FROM e LEFT JOIN LATERAL (
    SELECT * FROM (
        SELECT n.*, CASE WHEN n.txn_size IS NOT NULL
            THEN min(n.id) OVER (PARTITION BY n.xid, n.txn_size IS NOT NULL) END AS txn
        FROM (SELECT e.first_id - 1 + row_number() OVER (ORDER BY c.seq) AS id, c.*
            FROM epoch_changes(e.after_snap, e.snap) c) n) ranked
    WHERE ranked.id > $1) x ON true
ORDER BY e.last_id, x.id
