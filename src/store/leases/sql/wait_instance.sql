-- An instance says it is alive for as long as its listening connection lives: $1 its id. A
-- session-level advisory lock, released by PostgreSQL the moment the connection ends (see
-- waiter_instance_alive). It waits if a connection of the same instance that broke is still
-- known to the server, until the server notices (or statement_timeout ends the wait and the
-- instance tries again).
SELECT pg_advisory_lock(waiter_lock_class(), $1)
