-- The fenced delete's second statement, run only when delete.sql accepted the delete, in
-- its transaction. Its snapshot is taken after that statement's row lock was granted, so it sees
-- every version committed before; no writer can add one until the transaction commits.
-- Parameters: $1 the keys (a delete's one, or those a transaction deleted).
DELETE FROM snapshot_versions WHERE key = ANY($1)
