-- Frees Idempotency-Key ($1 principal, $2 key) from an unheld place (a dead instance's, or this
-- instance $3's not among held ids $4); how many were freed.
DELETE FROM lease_waiters
WHERE principal = $1 AND idem = $2
    AND ((instance <> $3 AND NOT waiter_instance_alive(instance))
        OR (instance = $3 AND id <> ALL($4::bigint[])))
