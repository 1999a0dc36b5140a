-- The changes after id $1 of keys under prefix $2, from at most $4 epochs and at most $3 of
-- them per epoch, in id order: a watcher catching up, and each instance's reader of the new
-- changes (prefix ''). Every epoch read gives at least one row (`through`, its last id, with no
-- change when none of its changes is under the prefix), so that the reader knows how far it
-- has read even where nothing matched. A change's id is its rank by seq in its epoch.
WITH e AS (
    SELECT first_id, last_id, after_snap, snap FROM change_epochs
    WHERE last_id > $1 ORDER BY last_id LIMIT $4)
SELECT e.last_id AS through, x.id, x.kind, x.key, x.token, x.at, x.owner, x.expires_at,
    x.version, x.etag, x.reason, x.audit_id, x.operation, x.highest_token, x.record_token
FROM e LEFT JOIN LATERAL (
    SELECT * FROM (
        SELECT e.first_id - 1 + row_number() OVER (ORDER BY c.seq) AS id, c.*
        FROM epoch_changes(e.after_snap, e.snap) c) ranked
    WHERE ranked.id > $1 AND starts_with(ranked.key, $2)
    ORDER BY ranked.id LIMIT $3) x ON true
ORDER BY e.last_id, x.id
