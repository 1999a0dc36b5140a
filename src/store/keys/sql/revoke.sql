-- Revokes the live key of a name: one UPDATE, so two revocations of one key cannot both report
-- it. txid_current() is the change the instances confirm. Parameters: $1 name.
UPDATE api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL
RETURNING txid_current()
