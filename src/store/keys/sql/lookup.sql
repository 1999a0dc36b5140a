-- One request's key when the instance's copy lacks it: whether any live key exists, and key $1 if
-- live.
SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS any_live,
    k.name, k.scope, k.prefix, k.secret_sha256
FROM (VALUES (1)) AS one
LEFT JOIN api_keys k ON k.id = $1 AND k.revoked_at IS NULL
