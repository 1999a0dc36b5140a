-- A key's queue of waiting acquires, with the owner each asked for (lease_waiter_owners), in
-- grant order (the waiter id: sql/acquire.sql grants a free key only to its first live waiter),
-- after the cursor's waiter. `position` counts from 1 over the whole queue, so it stays right on
-- every page. A waiter of a dead instance, or of one that stopped answering (frozen past its
-- --waiter-stall-bound), is listed until a sweep takes its row out (within a second of its
-- death or of the bound: src/store/leases/waiters.rs), although acquires pass it over and the
-- key's status (status.sql) no longer counts it. A plain read of the
-- lease_waiters_key_id range and a primary key probe of lease_waiter_owners per row, no lock.
-- Parameters: $1 key, $2 the cursor's waiter id (0 for the first page), $3 page size + 1.
SELECT q.id, q.position, o.owner, q.at AS since
FROM (SELECT id, at, row_number() OVER (ORDER BY id) AS position
      FROM lease_waiters WHERE key = $1) q
LEFT JOIN lease_waiter_owners o ON o.id = q.id
WHERE q.id > $2
ORDER BY q.id LIMIT $3
