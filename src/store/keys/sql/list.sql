SELECT id, name, scope, prefix, created_at, revoked_at FROM api_keys ORDER BY id
