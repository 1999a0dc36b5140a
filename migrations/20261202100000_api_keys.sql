-- API keys: bearer secrets, kept only as a SHA-256 hash (the secrets are 256 random bits, so a
-- slow password hash would add nothing but latency to every request).
CREATE TABLE api_keys (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name           text        NOT NULL,
    scope          text        NOT NULL CHECK (scope IN ('read', 'write', 'admin')),
    -- Confines the key to keys that start with this; '' allows every key.
    prefix         text COLLATE "C" NOT NULL DEFAULT '',
    secret_sha256  bytea       NOT NULL CHECK (length(secret_sha256) = 32),
    created_at     timestamptz NOT NULL DEFAULT now(),
    revoked_at     timestamptz
);
-- A name is the principal written to the audit log, so two live keys never share one; a revoked
-- key's name may be given to a new key.
CREATE UNIQUE INDEX api_keys_live_name ON api_keys (name) WHERE revoked_at IS NULL;
