-- Instance $1 says it is alive, by the database clock, for $2 ms; rows silent for a day are
-- dropped.
WITH gone AS (
    DELETE FROM waiter_instances WHERE seen_at < clock_timestamp() - interval '1 day')
INSERT INTO waiter_instances (instance, seen_at, stale_after)
VALUES ($1, clock_timestamp(), $2 * interval '1 millisecond')
ON CONFLICT (instance) DO UPDATE SET seen_at = excluded.seen_at, stale_after = excluded.stale_after
