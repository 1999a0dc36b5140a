-- Watch (contract v1.1, "Watch"): every change to a key, numbered in one order for the whole
-- service, so that a watcher that resumes after change id N gets every change after N once.
--
-- Why two tables. A change's id must follow commit order: a reader that has seen id N must
-- never later find a smaller id committed. Ids drawn inside the changing transactions (a
-- sequence) follow the order they were drawn in, not the order of the commits, so a reader of
-- `id > N` could skip a change that committed late. So the changing statements write what they
-- did into `change_inbox` (from the triggers below, in their own transaction: a change is in the
-- inbox exactly when it committed, and the hot statements need no edit), and one relay per
-- database (src/store/changes.rs) moves committed inbox rows into `changes`, numbering them
-- max(id) + 1, + 2, ... in transactions that each begin by updating `change_relay`'s one row:
-- its row lock makes them follow one another, each numbers above the last (its statements after
-- the lock see the last one's commit), and each commits before the next can number, so the ids
-- in `changes` appear in increasing order to every reader. (A table lock on `changes` would do
-- the same, but would keep autovacuum off it under a steady stream of changes.)
--
-- That row is also the relay role: a lease by the database clock that its holder renews; every
-- transaction of the relay checks it first, so an instance that was paused and lost the role
-- numbers nothing.

-- What one change carries: the contract's `key`, `token`, `at`, and the members of its kind.
CREATE TABLE change_inbox (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           text        NOT NULL,
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

-- The numbered history: an inbox row as the relay numbered it (the same columns, so that the
-- move is a plain INSERT ... SELECT), keyed by its change id.
CREATE TABLE changes (LIKE change_inbox);
ALTER TABLE changes
    ADD PRIMARY KEY (id),
    ADD CHECK (kind IN ('lease.granted', 'lease.released', 'lease.abandoned', 'lease.expired',
        'lease.recovery_required', 'lease.reconciled', 'snapshot.written', 'snapshot.deleted',
        'write.refused')),
    -- When the relay numbered it: what the retention counts from.
    ADD COLUMN recorded_at timestamptz NOT NULL DEFAULT clock_timestamp();

-- The retained history starts after `pruned_through`: a watch resumed from an id below it has
-- missed changes that are gone (410 compacted). Also the base of the numbering once every
-- change has been pruned, so that an id is never given twice.
CREATE TABLE change_horizon (
    one             boolean PRIMARY KEY DEFAULT true CHECK (one),
    pruned_through  bigint NOT NULL DEFAULT 0
);
INSERT INTO change_horizon DEFAULT VALUES;

-- Which instance relays, until when (database clock).
CREATE TABLE change_relay (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    holder      text,
    expires_at  timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO change_relay DEFAULT VALUES;

-- An expiry changes no row by itself, so the relay writes it: it keeps the live leases' expiry
-- times, and once one passes by the database clock it sets `expiry_reported` (the trigger below
-- then notes `lease.expired`). Renew and release refuse a lease whose expiry was reported, so a
-- renewal that started a moment before the expiry and reached the row after the report cannot
-- bring back a lease the watchers were told had expired. A grant clears it. Leases already
-- expired when this migration runs are history, not news.
ALTER TABLE leases ADD COLUMN expiry_reported boolean NOT NULL DEFAULT false;
UPDATE leases SET expiry_reported = true WHERE end_reason IS NULL AND expires_at <= now();

-- The changes of a statement that inserted leases: first grants of keys. One trigger per
-- statement (the hot statements change a batch of keys at once), reading its transition table.
CREATE FUNCTION note_lease_inserts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO change_inbox (kind, key, token, at, owner, expires_at)
    SELECT 'lease.granted', n.key, n.token, n.acquired_at, n.owner, n.expires_at
    FROM new_rows n ORDER BY n.key;
    RETURN NULL;
END
$$;

CREATE TRIGGER leases_note_inserts
    AFTER INSERT ON leases
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION note_lease_inserts();

-- The changes of a statement that updated leases, read from the row's columns before and after:
-- a new token is a grant (after the expiry of the lease it replaces, if no one reported it yet,
-- and after the reconciliation of a recovery record it replaces); end_reason set is a release or
-- an abandon; recovery_required set on the same lease is a require-recovery; expiry_reported set
-- is the relay's expiry; a higher snapshot version with an ETag is a write, an ETag cleared a
-- delete. A renewal changes none of these and notes nothing.
CREATE FUNCTION note_lease_updates() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO change_inbox (kind, key, token, at, owner, expires_at, version, etag, reason,
        record_token)
    SELECT e.kind, o.key, e.token, e.at, e.owner, e.expires_at, e.version, e.etag, e.reason,
        e.record_token
    FROM old_rows o JOIN new_rows n ON n.key = o.key
    CROSS JOIN LATERAL (VALUES
        (1, CASE WHEN n.token <> o.token AND o.end_reason IS NULL AND NOT o.expiry_reported
                  OR n.token = o.token AND n.expiry_reported AND NOT o.expiry_reported
             THEN 'lease.expired' END,
            o.token, o.expires_at, o.owner, NULL::timestamptz, NULL::bigint, NULL::text,
            NULL::text, NULL::bigint),
        (2, CASE WHEN n.token <> o.token AND lease_recovery_reason(o.end_reason, o.expires_at,
                o.crash_recovery, o.recovery_required, n.acquired_at) IS NOT NULL
             THEN 'lease.reconciled' END,
            n.token, n.acquired_at, n.owner, NULL, NULL, NULL,
            lease_recovery_reason(o.end_reason, o.expires_at, o.crash_recovery,
                o.recovery_required, n.acquired_at), o.token),
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
            n.token, now(), NULL, NULL, o.snapshot_version, o.snapshot_etag, NULL, NULL)
    ) AS e (rank, kind, token, at, owner, expires_at, version, etag, reason, record_token)
    WHERE e.kind IS NOT NULL
    ORDER BY o.key, e.rank;
    RETURN NULL;
END
$$;

CREATE TRIGGER leases_note_updates
    AFTER UPDATE ON leases
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION note_lease_updates();

-- Refused fenced writes, from the audit rows the refusing statements insert.
CREATE FUNCTION note_rejections() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO change_inbox (kind, key, token, at, owner, reason, audit_id, operation,
        highest_token)
    SELECT 'write.refused', n.key, n.presented_token, n.at, n.holder, n.reason, n.id,
        n.operation, n.highest_token
    FROM new_rows n ORDER BY n.id;
    RETURN NULL;
END
$$;

CREATE TRIGGER rejections_note_inserts
    AFTER INSERT ON rejections
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION note_rejections();
