-- An instance's id, drawn once, when it first listens for waiters' wake-ups: unique among the
-- instances that share the database (the sequence wraps only after 2^31 instances have started),
-- so that no two live instances name the same liveness lock (wait_instance.sql).
SELECT nextval('lease_waiter_instance_seq')::integer
