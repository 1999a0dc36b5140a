-- The snapshot an instance reads before it loads the keys: every change committed in it, the load
-- (a later snapshot) holds too, so it is what the instance confirms.
SELECT pg_current_snapshot()::text
