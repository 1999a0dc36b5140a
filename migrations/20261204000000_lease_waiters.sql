-- Waiting acquires (contract v1.1, "Waiting acquire"): the queue of requests that wait for a
-- held key, shared by every instance on the database. A waiting request costs one row here and
-- no database connection: it sleeps in its instance until the database wakes it (a NOTIFY on
-- `snapfence_waiters` carrying the key, sent at commit by the triggers below) or until the
-- holder's expires_at passes by the database clock (the instance sleeps for `expires_at -
-- now()` as the database computed it), then runs the acquire statement again as a waiter.
--
-- Order: `id` is drawn when the waiter is queued, and a free key is granted only to the live
-- waiter with the smallest id (src/store/sql/acquire.sql, `decision`); every other acquire of
-- it, waiting or not, is answered `held`. Two waiters queued at the same moment may become
-- visible in either order; a waiter is behind every waiter whose row had committed before its
-- own request ran.
CREATE TABLE lease_waiters (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key       text COLLATE "C" NOT NULL,
    -- The instance that queued it: the objid of the advisory lock its listening connection holds
    -- for as long as it lives (see waiter_instance_alive).
    instance  integer     NOT NULL,
    at        timestamptz NOT NULL DEFAULT now()
);
-- The queue of a key, in order: the probe every acquire makes (an empty range when no one waits).
CREATE INDEX lease_waiters_key_id ON lease_waiters (key, id);
CREATE INDEX lease_waiters_instance ON lease_waiters (instance);

-- Each instance's id (lease_waiters.instance, and the objid of its liveness lock), drawn when it
-- first listens: two live instances never share one.
CREATE SEQUENCE lease_waiter_instance_seq AS integer MINVALUE 1 CYCLE;

-- The advisory lock class of the instances' liveness locks (two-int4 form, which never meets
-- the one-bigint locks of gate.sql): 'snap' in ASCII.
CREATE FUNCTION waiter_lock_class() RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    SELECT 1936613744
$$;

-- Whether the instance that queued a waiter still lives. Each instance holds the session
-- advisory lock (waiter_lock_class(), its id) on its listening connection for as long as it
-- runs; when it dies its connection closes and PostgreSQL releases the lock at once. So the lock
-- is held exactly while the instance is alive: a shared try-lock that fails means alive. A try
-- never waits; one that succeeds (a dead instance) holds a shared lock until the caller's
-- transaction ends, which no live instance asks for.
CREATE FUNCTION waiter_instance_alive(instance integer) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT NOT pg_try_advisory_xact_lock_shared(waiter_lock_class(), instance)
$$;

-- A release or an abandon frees a key: its waiters are woken at commit. Only keys with someone
-- queued notify, so an ending with no one waiting costs one index probe. A row trigger limited
-- to the UPDATEs that set end_reason (and by its WHEN to the ones that end a live lease), so
-- grants, renewals and fenced writes never call it; end.sql is unchanged.
CREATE FUNCTION notify_lease_waiters_on_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM lease_waiters WHERE key = NEW.key) THEN
        PERFORM pg_notify('snapfence_waiters', NEW.key);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER leases_wake_waiters
    AFTER UPDATE OF end_reason ON leases
    FOR EACH ROW
    WHEN (OLD.end_reason IS NULL AND NEW.end_reason IS NOT NULL)
    EXECUTE FUNCTION notify_lease_waiters_on_end();

-- A waiter that leaves the queue wakes the key's other waiters, at commit. One that leaves
-- without taking the key (refused, timed out, its client gone, its instance dead) may have been
-- the one the key was waiting for: the next one takes it now. One that leaves with the key (the
-- statement that grants it deletes its row) started a lease that the waiters behind it saw no
-- sign of (they were told `held` for a waiter ahead, with no expiry to sleep until): each
-- instance's first waiter tries once more, finds the new lease, and sleeps until its expiry.
CREATE FUNCTION notify_lease_waiters_on_leave() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT FROM lease_waiters WHERE key = OLD.key) THEN
        PERFORM pg_notify('snapfence_waiters', OLD.key);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER lease_waiters_wake_next
    AFTER DELETE ON lease_waiters
    FOR EACH ROW
    EXECUTE FUNCTION notify_lease_waiters_on_leave();
