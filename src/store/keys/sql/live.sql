-- Every live key, for an instance's copy of the table, with the snapshot it was read in (one row of
-- NULL keys when none is live), which says which changes the copy holds.
SELECT s.seen, k.id, k.name, k.scope, k.prefix, k.secret_sha256
FROM (SELECT pg_current_snapshot()::text AS seen) s
LEFT JOIN api_keys k ON k.revoked_at IS NULL
