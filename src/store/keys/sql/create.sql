-- Makes an API key: one INSERT. The partial unique index on live names makes a second live key
-- of one name impossible, however many `snapfence keys create` run at once; the loser's
-- ON CONFLICT DO NOTHING yields no row. txid_current() is the change the instances confirm.
-- Parameters: $1 name, $2 scope, $3 prefix, $4 the secret's SHA-256.
INSERT INTO api_keys (name, scope, prefix, secret_sha256) VALUES ($1, $2, $3, $4)
ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
RETURNING id, name, scope, prefix, created_at, revoked_at, txid_current() AS change
