-- Whether API key $1 is still live.
SELECT EXISTS (SELECT FROM api_keys WHERE id = $1 AND revoked_at IS NULL)
