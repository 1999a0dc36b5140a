-- An instance says it is alive and answering ($1 its id, $2 its --waiter-stall-bound in
-- milliseconds), by the database clock: see 20261205200001_waiter_instances_stall.sql. Rows of
-- instances silent for a day (long gone) are dropped on the way.
WITH gone AS (
    DELETE FROM waiter_instances WHERE seen_at < clock_timestamp() - interval '1 day')
INSERT INTO waiter_instances (instance, seen_at, stale_after)
VALUES ($1, clock_timestamp(), $2 * interval '1 millisecond')
ON CONFLICT (instance) DO UPDATE SET seen_at = excluded.seen_at, stale_after = excluded.stale_after
