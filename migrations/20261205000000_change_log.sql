-- Watch, rebuilt (issue 30): a change is written once, by the statement that makes it, and is
-- never moved or renumbered; expiries are reported without an UPDATE of the lease row.
--
-- Before, triggers noted changes in `change_inbox` and one relay moved them into `changes`,
-- numbering each in commit order: under load that move cost PostgreSQL more than every hot
-- statement together. Now each changing statement (acquire.sql, end.sql, reconciled.sql,
-- fenced.sql with put.sql or delete_head.sql, and the relay's expire.sql) inserts its
-- `change_log` rows in a CTE of its own, each stamped with its transaction's id (`xid`) and a
-- number from `change_seq` drawn after the statement locked that key's row (`seq`); a renewal
-- writes none. The order comes from the relay's epochs: now and then it records a snapshot
-- (`pg_current_snapshot()`), and epoch e holds the changes visible in its snapshot that were not
-- visible in the snapshot of the epoch before. A later snapshot sees everything an earlier one
-- saw, so every committed change falls in exactly one epoch, and a change that commits later
-- falls in the same or a later one: nothing ever lands before a position a reader has passed.
-- Within an epoch, changes go by `seq`: a change to a key draws it after the lock that ordered
-- it behind the key's previous change, which had drawn its own before committing, so each key's
-- changes keep their order, and so does a change that began after another committed. A change's
-- id is its epoch's `first_id` plus its rank there: dense and strictly increasing. An epoch is
-- one small row per relay turn that found something, not per change.

-- The changing statements note their changes themselves now (their SQL files), not triggers.
DROP TRIGGER leases_note_inserts ON leases;
DROP TRIGGER leases_note_updates ON leases;
DROP TRIGGER rejections_note_inserts ON rejections;
DROP FUNCTION note_lease_inserts();
DROP FUNCTION note_lease_updates();
DROP FUNCTION note_rejections();

-- The history before this migration is not carried over: a watch resumed from within it is
-- answered 410 compacted (the horizon moves to its last id), as after any pruning.
UPDATE change_horizon
SET pruned_through = greatest(pruned_through, coalesce((SELECT max(id) FROM changes), 0));
DROP TABLE change_inbox;
DROP TABLE changes;

CREATE SEQUENCE change_seq;

-- What one change carries: the contract's `key`, `token`, `at`, and the members of its kind.
CREATE TABLE change_log (
    xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    seq            bigint      NOT NULL DEFAULT nextval('change_seq'),
    kind           text        NOT NULL CHECK (kind IN ('lease.granted', 'lease.released',
        'lease.abandoned', 'lease.expired', 'lease.recovery_required', 'lease.reconciled',
        'snapshot.written', 'snapshot.deleted', 'write.refused')),
    key            text COLLATE "C" NOT NULL,
    token          bigint      NOT NULL,
    at             timestamptz NOT NULL,
    owner          text,
    expires_at     timestamptz,
    version        bigint,
    etag           text,
    reason         text,
    audit_id       bigint,
    operation      text,
    highest_token  bigint,
    record_token   bigint
);
-- The only index: epochs are found by transaction id (the appends go to its right edge).
CREATE INDEX change_log_xid ON change_log (xid);

-- The epochs: ids first_id..last_id are the changes visible in `snap` and not in `after_snap`
-- (the previous epoch's snapshot). `made_at` is what the retention counts from.
CREATE TABLE change_epochs (
    first_id    bigint      PRIMARY KEY,
    last_id     bigint      NOT NULL UNIQUE CHECK (last_id >= first_id),
    after_snap  pg_snapshot NOT NULL,
    snap        pg_snapshot NOT NULL,
    made_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- The first epoch holds no change of its own: it is where the numbering and the snapshots
-- start, at the horizon (never read, since every resume point is at or past it).
INSERT INTO change_epochs (first_id, last_id, after_snap, snap)
SELECT pruned_through, pruned_through, pg_current_snapshot(), pg_current_snapshot()
FROM change_horizon;

-- The changes of one epoch, unordered. "Not visible in after_snap" is "started after it, or
-- running when it was taken", so the reads are a range and a few points of the xid index,
-- however long some transaction stays open. (The points as `= ANY (ARRAY(...))`: written as
-- `IN (SELECT ...)` they were planned as a hash join over the whole table.)
CREATE FUNCTION epoch_changes(after_snap pg_snapshot, snap pg_snapshot)
RETURNS SETOF change_log LANGUAGE sql STABLE AS $$
    SELECT c.* FROM change_log c
    WHERE c.xid >= pg_snapshot_xmax(after_snap) AND c.xid < pg_snapshot_xmax(snap)
        AND pg_visible_in_snapshot(c.xid, snap)
    UNION ALL
    SELECT c.* FROM change_log c
    WHERE c.xid = ANY (ARRAY(SELECT pg_snapshot_xip(after_snap)))
        AND pg_visible_in_snapshot(c.xid, snap)
$$;

-- The numbered history, for people and tests; the service reads it an epoch at a time
-- (src/store/watch/sql/read.sql).
CREATE VIEW changes AS
SELECT e.first_id - 1 + row_number() OVER (PARTITION BY e.first_id ORDER BY c.seq) AS id,
    c.kind, c.key, c.token, c.at, c.owner, c.expires_at, c.version, c.etag, c.reason, c.audit_id,
    c.operation, c.highest_token, c.record_token, e.made_at AS recorded_at
FROM change_epochs e CROSS JOIN LATERAL epoch_changes(e.after_snap, e.snap) c;

-- Whose expiry has been reported, one row per key: written by whoever reports it first, the
-- relay when the expiry passes or the grant that replaces the lease, with an upsert that waits
-- for the other's, so each expiry is reported once. Renew and release need no mark: they refuse
-- a lease whose expires_at has passed by the database clock read after their row lock
-- (clock_timestamp()), and the relay reports only a lease it holds a share lock on, whose
-- expires_at has passed by that clock, so nothing renews a lease after its expiry was reported.
CREATE TABLE expiry_reports (
    key    text COLLATE "C" PRIMARY KEY,
    token  bigint NOT NULL
);
INSERT INTO expiry_reports (key, token)
SELECT key, token FROM leases
WHERE end_reason IS NULL AND (expiry_reported OR expires_at <= now());
ALTER TABLE leases DROP COLUMN expiry_reported;
