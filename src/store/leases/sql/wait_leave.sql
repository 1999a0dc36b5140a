-- A waiter leaves the queue without an answer from the acquire statement (its client went away,
-- its try failed): $1 its id. The trigger on lease_waiters wakes the key's other waiters.
-- Deleting a row that is already gone (the statement that answered it took it out) does
-- nothing.
DELETE FROM lease_waiters WHERE id = $1
