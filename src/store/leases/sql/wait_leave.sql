-- Waiters $1 leave without an answer, a burst of them as one statement and one commit; the trigger
-- wakes each key's others (one notification per key). A row already gone answers none.
DELETE FROM lease_waiters WHERE id = ANY($1::bigint[])
RETURNING array_position($1::bigint[], id)::bigint AS i
