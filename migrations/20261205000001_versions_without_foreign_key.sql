-- Fewer writes per fenced PUT (issue 30): the foreign key from snapshot_versions to leases is
-- dropped. Its check locked the lease row FOR KEY SHARE once per version row inserted, on the row
-- the same statement already holds FOR NO KEY UPDATE (a second lock, a multixact), and guarded
-- nothing: a version is inserted only by put.sql, for a key whose lease row it has just locked,
-- and lease rows are never deleted.
ALTER TABLE snapshot_versions DROP CONSTRAINT snapshot_versions_key_fkey;
