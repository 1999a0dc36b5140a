-- Makes an API key ($1 name, $2 scope, $3 prefix, $4 secret's SHA-256). The partial unique index on
-- live names makes a second live key of a name impossible however many run at once; txid_current()
-- is the change the instances confirm.
INSERT INTO api_keys (name, scope, prefix, secret_sha256) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
RETURNING id, name, scope, prefix, created_at, revoked_at, txid_current() AS change
