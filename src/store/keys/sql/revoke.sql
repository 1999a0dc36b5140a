-- Revokes name $1's live key in one UPDATE, so two revocations cannot both report it.
UPDATE api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL
RETURNING txid_current()
