-- The relay role (migrations/20261204100000_changes.sql): taken by an instance when no one holds
-- it ($2 = false, the holder's time ran out by the database clock), or kept by its holder
-- ($2 = true, only while its time has not run out: a relay that was paused past it keeps
-- nothing, and numbers nothing, since every relay transaction starts here). $1 is the
-- instance's name, $3 how long the role lasts from now in milliseconds. The row lock makes two
-- takers, or a taker and a late keeper, take turns; the loser finds the row changed and no row
-- is returned.
UPDATE change_relay SET holder = $1, expires_at = now() + $3 * interval '1 millisecond'
WHERE CASE WHEN $2 THEN holder = $1 AND expires_at > now() ELSE expires_at <= now() END
RETURNING now() AS clock
