-- Instance $1's liveness: a session advisory lock, released when its connection ends. It waits
-- while a broken connection of the same instance is still known to the server.
SELECT pg_advisory_lock(waiter_lock_class(), $1)
