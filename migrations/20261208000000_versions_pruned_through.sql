-- Every version of the key at or below this one has been deleted: a fenced write prunes the
-- versions that fall out of the retention window from here up (src/store/snapshots/sql/put.sql)
-- rather than from the key's first version. Deleted index entries stay in snapshot_versions'
-- primary key until a vacuum, and a prune from the first version walked all of them on every
-- write: under a steady stream of writes a batch's time doubled within 30 seconds, until
-- autovacuum came round (bench/README.md, fifth pass). 0 for the existing keys: their next write
-- prunes from the start once.
ALTER TABLE leases ADD COLUMN versions_pruned_through bigint NOT NULL DEFAULT 0;
