-- The fenced delete's second statement, run only when delete_head.sql accepted the delete, in
-- its transaction. Its snapshot is taken after that statement's row lock was granted, so it sees
-- every version committed before; no writer can add one until the transaction commits.
-- Parameters: $1 key.
DELETE FROM snapshot_versions WHERE key = $1
