-- The fenced delete's second statement ($1 keys), in its transaction: its snapshot follows the head
-- lock, so it sees every version and none can be added before commit.
DELETE FROM snapshot_versions WHERE key = ANY($1)
