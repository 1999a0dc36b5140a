-- Frees an Idempotency-Key ($1 principal, $2 key) from a place that no request holds: one of a
-- dead instance (waiter_instance_alive), or one of this instance ($3) that none of its requests
-- holds ($4 the ids it holds: a leave not sent yet, or that failed). Run when an enqueue found the
-- key's place taken; how many it freed (then the enqueue is tried again).
DELETE FROM lease_waiters
WHERE principal = $1 AND idem = $2
    AND ((instance <> $3 AND NOT waiter_instance_alive(instance))
        OR (instance = $3 AND id <> ALL($4::bigint[])))
