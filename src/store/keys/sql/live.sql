-- Every live key, for an instance's copy of the table (reloaded on each change it is told of).
SELECT id, name, scope, prefix, secret_sha256 FROM api_keys WHERE revoked_at IS NULL
