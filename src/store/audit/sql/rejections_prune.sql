-- Up to $2 refused writes older than $1 ms, oldest first; SKIP LOCKED, so a write never waits.
DELETE FROM rejections WHERE id IN (
    SELECT id FROM rejections WHERE at < now() - $1 * interval '1 millisecond'
    ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED)
