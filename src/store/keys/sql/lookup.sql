-- One request's key, straight from the table (when the instance's copy does not know it): whether
-- any live key exists, and the presented key if it is live. One read, no lock. Parameters: $1 the
-- presented key's id, or NULL.
SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS any_live,
    k.name, k.scope, k.prefix, k.secret_sha256
FROM (VALUES (1)) AS one
LEFT JOIN api_keys k ON k.id = $1 AND k.revoked_at IS NULL
