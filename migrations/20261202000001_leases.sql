-- Leases and fencing tokens.
--
-- One row per key, created by the key's first grant and never deleted: a new grant overwrites the
-- row in place, so the row always carries the key's newest token, which is what fenced writes are
-- checked against. Expiry is never written by a background job; it is derived from `expires_at`
-- and the database clock at the moment of each statement.

-- Every grant draws its token here. CACHE 1 is load-bearing: with a per-session cache, two
-- connections could hand out tokens out of order (session A caches 1..20, session B 21..40, and a
-- later grant by A would get a smaller token than an earlier grant by B on the same key).
CREATE SEQUENCE fencing_token_seq AS bigint MINVALUE 1 MAXVALUE 9223372036854775807 START 1 CACHE 1 NO CYCLE;

CREATE TABLE leases (
    -- "C" collation: byte order, so that keyset pagination and prefix ranges use the primary key
    -- index whatever the database's default collation is.
    key                text COLLATE "C" PRIMARY KEY,
    token              bigint      NOT NULL CHECK (token > 0),
    owner              text        NOT NULL,
    ttl_ms             bigint      NOT NULL CHECK (ttl_ms > 0),
    metadata           jsonb,
    crash_recovery     boolean     NOT NULL,
    -- Set by require-recovery while the lease is live: its release or expiry leaves a record.
    recovery_required  boolean     NOT NULL DEFAULT false,
    acquired_at        timestamptz NOT NULL,
    expires_at         timestamptz NOT NULL,
    -- How the holder gave the lease up, if it did; NULL while live or merely expired.
    end_reason         text        CHECK (end_reason IN ('released', 'abandoned')),
    ended_at           timestamptz,
    -- Head of the key's snapshot: the counter of accepted writes (never reset, so a version number
    -- is never reused, not even after a delete) and the ETag of the current snapshot (NULL when
    -- there is none). They live on the lease row so that one row lock serialises the fencing check,
    -- the version counter and the If-Match check against every concurrent grant and write.
    snapshot_version   bigint      NOT NULL DEFAULT 0,
    snapshot_etag      text,
    CHECK ((end_reason IS NULL) = (ended_at IS NULL))
);

-- The reason a key's newest lease leaves a recovery record, or NULL when it leaves none. This is
-- the single definition of the recovery rules; every statement that needs them calls it, with the
-- statement's own now(), so instances never disagree about expiry.
CREATE FUNCTION lease_recovery_reason(
    end_reason text, expires_at timestamptz, crash_recovery boolean, recovery_required boolean,
    at timestamptz
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN end_reason IS NULL AND expires_at > at THEN NULL   -- still held
        WHEN end_reason = 'abandoned' THEN 'abandoned'
        WHEN recovery_required THEN 'recovery_required'         -- released or expired
        WHEN end_reason IS NULL AND crash_recovery THEN 'expired'
        ELSE NULL
    END
$$;

-- The state of a key as the contract names it, from the same columns.
CREATE FUNCTION lease_state(
    end_reason text, expires_at timestamptz, crash_recovery boolean, recovery_required boolean,
    at timestamptz
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN end_reason IS NULL AND expires_at > at THEN 'held'
        WHEN lease_recovery_reason(end_reason, expires_at, crash_recovery, recovery_required, at) IS NOT NULL
            THEN 'recovery_pending'
        WHEN end_reason IS NULL THEN 'expired'
        ELSE 'released'
    END
$$;
