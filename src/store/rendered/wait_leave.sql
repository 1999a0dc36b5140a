-- src/store/rendered/wait_leave.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- Waiters $1 leave without an answer, a burst of them as one statement and one commit; the trigger
-- wakes each key's others (one notification per key). A row already gone answers none.
DELETE FROM lease_waiters WHERE id = ANY($1::bigint[])
RETURNING array_position($1::bigint[], id)::bigint AS i
