-- A waiting acquire takes its place at the end of the key's queue: $1 the key, $2 this
-- instance's id (the objid of its liveness lock). Answers the waiter's id, its place in the
-- queue. One autocommit INSERT: the row is visible to every acquire that starts after it
-- commits, and the waiter's first try (acquire_wait_in.sql) runs only after that, so a release
-- that commits after the waiter's first try saw the key held finds the row and wakes it (the
-- trigger on leases), and one that committed before is seen by that try.
INSERT INTO lease_waiters (key, instance) VALUES ($1, $2) RETURNING id
