-- Up to $2 replaced recovery records older than $1 ms, oldest first; SKIP LOCKED, so a write never waits.
DELETE FROM recoveries WHERE id IN (
    SELECT id FROM recoveries WHERE at < now() - $1 * interval '1 millisecond'
    ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED)
