-- Retention of the Idempotency-Key records: up to $2 of those older than $1 ms, oldest first.
-- `SKIP LOCKED` lets several instances prune at once without waiting on each other, and a small
-- batch keeps the statement short. A request with the key of a record being deleted sees the
-- record and replays it, or, once the delete has committed, runs as a new request; an INSERT of
-- its new record waits for the delete to end, and then meets no row.
DELETE FROM idempotency_records WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_records
    WHERE at < now() - $1 * interval '1 millisecond'
    ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED))
