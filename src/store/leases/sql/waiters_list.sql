-- Key $1's queue in grant order after waiter $2, $3 rows; `position` counts over the whole queue.
-- Dead or frozen instances' waiters are listed until swept, though acquires pass them over. No
-- lock.
SELECT q.id, q.position, o.owner, q.at AS since
FROM (SELECT id, at, row_number() OVER (ORDER BY id) AS position
      FROM lease_waiters WHERE key = $1) q
LEFT JOIN lease_waiter_owners o ON o.id = q.id
WHERE q.id > $2
ORDER BY q.id LIMIT $3
