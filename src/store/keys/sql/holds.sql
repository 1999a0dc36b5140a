-- Whether the committed change $1 (a transaction id) is visible in the snapshot $2 an instance
-- loaded its copy of the keys in.
SELECT pg_visible_in_snapshot($1::text::xid8, $2::pg_snapshot)
