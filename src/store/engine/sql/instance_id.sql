-- A unique instance id, so no two live instances share a liveness lock.
SELECT nextval('lease_waiter_instance_seq')::integer
