-- Deletes up to $2 Idempotency-Key records older than $1 ms, oldest first. SKIP LOCKED lets
-- instances prune at once; a request meeting a record being deleted replays it, or runs anew once
-- the delete commits (its INSERT waits for the delete).
DELETE FROM idempotency_records WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_records
    WHERE at < now() - $1 * interval '1 millisecond'
    ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED))
