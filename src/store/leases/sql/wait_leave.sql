-- Waiter $1 leaves without an answer; the trigger wakes the key's others. A row already gone is a
-- no-op.
DELETE FROM lease_waiters WHERE id = $1
