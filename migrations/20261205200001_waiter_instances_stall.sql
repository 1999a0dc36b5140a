-- A waiter is served only while its instance answers (issue 34): a SIGSTOPped (frozen) instance
-- keeps its listening connection, and with it its liveness lock, so its first waiter held a
-- released key for the whole freeze while waiters on live instances got nothing.
--
-- Each instance now also says it is alive every quarter of a second (src/store/waiters.rs,
-- `heartbeat`): `seen_at`, by the database clock, and `stale_after`, its `--waiter-stall-bound`
-- (1 s by default). An instance whose last word is older than that counts as dead for its
-- waiters like one whose connection closed: acquires pass its waiters over, and the sweep of any
-- instance with waiters takes their rows out (waking the next waiter of each key) within half a
-- second. When it thaws, it finds its waiters' places gone and answers each with one last try
-- (`409 lease_held` while the key is held). An instance that never said a word (none yet) is
-- judged by its lock alone.
CREATE TABLE waiter_instances (
    instance     integer     PRIMARY KEY,
    seen_at      timestamptz NOT NULL,
    stale_after  interval    NOT NULL
);

CREATE OR REPLACE FUNCTION waiter_instance_alive(instance integer) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT NOT pg_try_advisory_xact_lock_shared(waiter_lock_class(), $1)
        AND NOT EXISTS (SELECT FROM waiter_instances i
            WHERE i.instance = $1 AND i.seen_at < clock_timestamp() - i.stale_after)
$$;
