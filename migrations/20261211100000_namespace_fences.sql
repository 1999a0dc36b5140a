-- Contract v1.3: a lease fences its namespace, so a key may hold a snapshot without a lease of
-- its own. The snapshot head moves off the lease row into `snapshot_heads`, one row per key ever
-- written. A fenced write locks its fence's lease row, then the heads it writes (see
-- src/store/snapshots/sql/fence.sql).
CREATE TABLE snapshot_heads (
    key             text COLLATE "C" PRIMARY KEY,
    -- Accepted writes of the key, never reset: a version number is never reused.
    version         bigint NOT NULL CHECK (version >= 0),
    -- The current snapshot's ETag, NULL once deleted.
    etag            text,
    -- Versions at or below this are pruned (see 20261208000000_versions_pruned_through.sql).
    pruned_through  bigint NOT NULL DEFAULT 0,
    -- The highest token any accepted write or delete of the key carried, under any fence.
    written_token   bigint NOT NULL
) WITH (fillfactor = 80);

-- Before v1.3 every write of a key carried a token of the key's own leases, so the key's newest
-- token bounds what wrote it.
INSERT INTO snapshot_heads (key, version, etag, pruned_through, written_token)
SELECT key, snapshot_version, snapshot_etag, versions_pruned_through, token
FROM leases WHERE snapshot_version > 0;

ALTER TABLE leases DROP COLUMN snapshot_version, DROP COLUMN snapshot_etag,
    DROP COLUMN versions_pruned_through;

-- The fence a version was written under (NULL: the key itself) and its Snapshot-Metadata.
ALTER TABLE snapshot_versions ADD COLUMN fencing_key text COLLATE "C", ADD COLUMN metadata json;

-- A refused write names its fence; a refused transaction has one row, operation `txn`.
ALTER TABLE rejections ADD COLUMN fencing_key text COLLATE "C",
    DROP CONSTRAINT rejections_operation_check,
    ADD CONSTRAINT rejections_operation_check CHECK (operation IN ('put', 'delete', 'txn'));

-- A change names its fence, and the changes of one transaction their number: they share the
-- transaction's xid, so a reader gives them the id of the first as `txn`.
ALTER TABLE change_log ADD COLUMN fencing_key text COLLATE "C", ADD COLUMN txn_size integer;
