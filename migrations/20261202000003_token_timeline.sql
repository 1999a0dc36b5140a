-- Fencing tokens across failovers.
--
-- A standby promoted after asynchronous replication can be behind its old primary: grants that
-- the old primary acknowledged, and the sequence positions they drew, may never have reached it.
-- Its `fencing_token_seq` would then hand out again tokens that holders already have, and
-- `ensure_sequence_ahead` cannot help, since the rows that carried those tokens are lost too.
-- What the promoted server does know is that it is on a new timeline. So every token is drawn
-- through `next_fencing_token()`, which first compares the server's timeline with the one the
-- sequence was last secured on, and on a change moves the sequence a safety gap past everything
-- it knows of before drawing.

-- The timeline the token sequence was last secured on: one row, kept for ever.
CREATE TABLE token_timeline (
    one         boolean     PRIMARY KEY DEFAULT true CHECK (one),
    timeline    bigint      NOT NULL,
    -- The sequence position set when this timeline was secured (NULL: nothing had to move).
    position    bigint,
    secured_at  timestamptz NOT NULL DEFAULT now()
);

-- The timeline that this server writes WAL on. Not pg_control_checkpoint(): that shows the
-- timeline of the last checkpoint, which after a promotion stays the old one until the
-- end-of-recovery checkpoint completes, in the background.
CREATE FUNCTION current_wal_timeline() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint
$$;

INSERT INTO token_timeline (timeline) VALUES (current_wal_timeline());

-- How far a new timeline moves the sequence past the largest token it knows of: more than the
-- grants an old primary can have acknowledged that its standby never received. 10^9 is hours of
-- replication lag at any grant rate this service reaches, and leaves room for nine million
-- failovers below 2^53 (the largest integer a JavaScript client reads exactly).
CREATE FUNCTION token_timeline_gap() RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
    SELECT 1000000000::bigint
$$;

-- Secures the token sequence on the server's current timeline; returns the position the
-- sequence was moved to, or NULL when the timeline is the one already secured.
--
-- Race-freedom under READ COMMITTED: the fast path reads the committed row. On a timeline
-- change every caller locks the row and re-reads it (a row lock yields the newest committed
-- version), so exactly one moves the sequence and the others, once it commits, find the new
-- timeline recorded and draw after the jump. No caller on the new timeline draws a token before
-- the jump is committed: until then the recorded timeline differs and they wait on the lock.
-- setval is not transactional: a jump whose transaction rolls back stays, and the next caller
-- jumps once more, which wastes tokens but never reuses one.
CREATE FUNCTION secure_token_timeline() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    now_on   bigint;
    recorded bigint;
    moved    bigint;
BEGIN
    -- A standby (or a server still in recovery) cannot issue tokens: say so with the SQLSTATE
    -- of a read-only transaction, which the service answers as 503 unavailable.
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'this server is in recovery (a standby): fencing tokens are issued only by a primary'
            USING ERRCODE = 'read_only_sql_transaction';
    END IF;
    now_on := current_wal_timeline();
    SELECT timeline INTO recorded FROM token_timeline;
    IF recorded = now_on THEN
        RETURN NULL;
    END IF;
    SELECT timeline INTO recorded FROM token_timeline FOR UPDATE;
    IF recorded = now_on THEN
        RETURN NULL;
    END IF;
    SELECT setval('fencing_token_seq',
                  greatest(s.last_value, coalesce((SELECT max(token) FROM leases), 0))
                  + token_timeline_gap())
      INTO moved
      FROM fencing_token_seq s;
    -- An upsert, so that a guard row deleted by hand is made again rather than jumped past at
    -- every grant.
    INSERT INTO token_timeline (timeline, position) VALUES (now_on, moved)
        ON CONFLICT (one) DO UPDATE SET timeline = now_on, position = moved, secured_at = now();
    RAISE WARNING 'new timeline % (was %): moved the fencing token sequence to %', now_on, recorded, moved;
    RETURN moved;
END
$$;

-- The only way a token is drawn: secured on the current timeline, then the next in sequence.
CREATE FUNCTION next_fencing_token() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM secure_token_timeline();
    RETURN nextval('fencing_token_seq');
END
$$;
