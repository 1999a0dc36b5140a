-- Up to $3 changes after id $1 of keys under prefix $2, in id order: a watcher catching up,
-- and each instance's reader of the new changes (prefix ''). The primary key gives the order.
SELECT id, kind, key, token, at, owner, expires_at, version, etag, reason, audit_id, operation,
    highest_token, record_token
FROM changes
WHERE id > $1 AND starts_with(key, $2)
ORDER BY id LIMIT $3
