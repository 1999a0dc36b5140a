-- Watch, rebuilt (issue 30): a change is written once, by the transaction that makes it, and is
-- never moved or renumbered; expiries are reported without an UPDATE of the lease row.
--
-- Before, the triggers noted changes in `change_inbox` and one relay moved them into `changes`,
-- numbering each in commit order: under load that move cost PostgreSQL more than every hot
-- statement together. Now the triggers write `change_log` rows directly, each stamped with its
-- transaction's id (`xid`) and with a number from `change_seq` drawn after the statement took
-- its row locks (`seq`). The order comes from the relay's epochs: now and then it records a
-- snapshot (`pg_current_snapshot()`), and epoch e holds the changes visible in its snapshot that
-- were not visible in the snapshot of the epoch before. A later snapshot sees everything an
-- earlier one saw, so every committed change falls in exactly one epoch, and a change that
-- commits later falls in the same or a later one: nothing ever lands before a position a reader
-- has passed. Within an epoch, changes go by `seq`: a change to a key draws it after the lock
-- that ordered it behind the key's previous change, which had drawn its own before committing,
-- so each key's changes keep their order, and so does a change that began after another
-- committed. A change's id is its epoch's `first_id` plus its rank there: dense and strictly
-- increasing. An epoch is one small row per relay turn that found something, not per change.

DROP TRIGGER leases_note_inserts ON leases;
DROP TRIGGER leases_note_updates ON leases;
DROP TRIGGER rejections_note_inserts ON rejections;

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

-- First grants of keys. One trigger per statement (the hot statements change a batch of keys at
-- once), reading its transition table; it runs after the statement's row locks, so `seq` is
-- drawn after them.
CREATE OR REPLACE FUNCTION note_lease_inserts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO change_log (kind, key, token, at, owner, expires_at)
    SELECT 'lease.granted', n.key, n.token, n.acquired_at, n.owner, n.expires_at
    FROM new_rows n ORDER BY n.key;
    RETURN NULL;
END
$$;

-- The changes of a statement that updated leases, read from the row's columns before and after:
-- a new token is a grant (after the expiry of the lease it replaces, if no one reported it yet,
-- and after the reconciliation of a recovery record it replaces); end_reason set is a release or
-- an abandon; recovery_required set on the same lease is a require-recovery; a higher snapshot
-- version with an ETag is a write, an ETag cleared a delete; a kept record cleared on the same
-- lease is a reconciliation confirmed (20261204200000_reconciling.sql). A renewal changes none of
-- these and notes nothing.
CREATE OR REPLACE FUNCTION note_lease_updates() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH replaced AS (
        -- The unended leases that a grant replaced, whose expiry this reports unless the relay
        -- did (the upsert waits for the relay's, and then changes and returns nothing).
        INSERT INTO expiry_reports AS r (key, token)
        SELECT o.key, o.token FROM old_rows o JOIN new_rows n ON n.key = o.key
        WHERE n.token <> o.token AND o.end_reason IS NULL
        ORDER BY o.key
        ON CONFLICT (key) DO UPDATE SET token = excluded.token WHERE r.token < excluded.token
        RETURNING r.key)
    INSERT INTO change_log (kind, key, token, at, owner, expires_at, version, etag, reason,
        record_token)
    SELECT e.kind, o.key, e.token, e.at, e.owner, e.expires_at, e.version, e.etag, e.reason,
        e.record_token
    FROM old_rows o JOIN new_rows n ON n.key = o.key LEFT JOIN replaced x ON x.key = o.key
    CROSS JOIN LATERAL (VALUES
        (1, CASE WHEN x.key IS NOT NULL THEN 'lease.expired' END,
            o.token, o.expires_at, o.owner, NULL::timestamptz, NULL::bigint, NULL::text,
            NULL::text, NULL::bigint),
        -- A grant that replaces a record (not one that keeps it: v1.2's reconciling grant).
        (2, CASE WHEN n.token <> o.token AND n.kept_token IS NULL
                AND key_recovery_reason(o.kept_reason, o.end_reason, o.expires_at,
                    o.crash_recovery, o.recovery_required, n.acquired_at) IS NOT NULL
             THEN 'lease.reconciled' END,
            n.token, n.acquired_at, n.owner, NULL, NULL, NULL,
            key_recovery_reason(o.kept_reason, o.end_reason, o.expires_at, o.crash_recovery,
                o.recovery_required, n.acquired_at), coalesce(o.kept_token, o.token)),
        (3, CASE WHEN n.token <> o.token THEN 'lease.granted' END,
            n.token, n.acquired_at, n.owner, n.expires_at, NULL, NULL, NULL, NULL),
        (4, CASE WHEN n.token = o.token AND o.end_reason IS NULL AND n.end_reason IS NOT NULL
             THEN 'lease.' || n.end_reason END,
            n.token, n.ended_at, n.owner, NULL, NULL, NULL, NULL, NULL),
        (5, CASE WHEN n.token = o.token AND n.recovery_required AND NOT o.recovery_required
             THEN 'lease.recovery_required' END,
            n.token, now(), n.owner, NULL, NULL, NULL, NULL, NULL),
        (6, CASE WHEN n.snapshot_version > o.snapshot_version AND n.snapshot_etag IS NOT NULL
             THEN 'snapshot.written' END,
            n.token, now(), NULL, NULL, n.snapshot_version, n.snapshot_etag, NULL, NULL),
        (7, CASE WHEN o.snapshot_etag IS NOT NULL AND n.snapshot_etag IS NULL
             THEN 'snapshot.deleted' END,
            n.token, now(), NULL, NULL, o.snapshot_version, o.snapshot_etag, NULL, NULL),
        -- v1.2: the confirmation of a reconciling lease, which drops the record it kept.
        (8, CASE WHEN n.token = o.token AND o.kept_token IS NOT NULL AND n.kept_token IS NULL
             THEN 'lease.reconciled' END,
            n.token, now(), n.owner, NULL, NULL, NULL, o.kept_reason, o.kept_token)
    ) AS e (rank, kind, token, at, owner, expires_at, version, etag, reason, record_token)
    WHERE e.kind IS NOT NULL
    ORDER BY o.key, e.rank;
    RETURN NULL;
END
$$;

-- Refused fenced writes, from the audit rows the refusing statements insert.
CREATE OR REPLACE FUNCTION note_rejections() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO change_log (kind, key, token, at, owner, reason, audit_id, operation,
        highest_token)
    SELECT 'write.refused', n.key, n.presented_token, n.at, n.holder, n.reason, n.id,
        n.operation, n.highest_token
    FROM new_rows n ORDER BY n.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER leases_note_inserts
    AFTER INSERT ON leases
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION note_lease_inserts();
CREATE TRIGGER leases_note_updates
    AFTER UPDATE ON leases
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION note_lease_updates();
CREATE TRIGGER rejections_note_inserts
    AFTER INSERT ON rejections
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION note_rejections();
