-- A waiting acquire sent with an Idempotency-Key holds that key for as long as it waits (issue
-- 34): a second request with the same key (and API key) while the first is queued is answered
-- `409 request_in_progress` at once, on any instance, instead of taking a second place in the
-- queue. The gate's advisory lock (gate.sql) covers a statement while it runs; a waiter holds no
-- connection between its tries, so its place in the queue is what says it runs.
--
-- `principal` and `idem` are NULL for a waiter sent without an Idempotency-Key. The unique index
-- is what makes two racing enqueues of one key, on any instances, take one place between them
-- (src/store/sql/wait_enqueue.sql: ON CONFLICT DO NOTHING); a row of a dead instance, or one
-- that no request holds any more, is taken out by the instance that meets it
-- (src/store/sql/wait_unblock.sql) and by the sweep.
ALTER TABLE lease_waiters ADD COLUMN principal text, ADD COLUMN idem text;
CREATE UNIQUE INDEX lease_waiters_idem ON lease_waiters (principal, idem) WHERE idem IS NOT NULL;
