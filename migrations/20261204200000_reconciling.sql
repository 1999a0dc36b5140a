-- Reconciling while holding the key (contract v1.2): an acquire with `reconciling: true` on a key
-- with a retained recovery record and no live lease is granted a lease that KEEPS the record, and
-- the record goes only when that holder confirms (`POST /v1/leases/{key}/reconciled`). If the
-- lease ends first (released, abandoned, expired), the record stays exactly as it was.
--
-- A key's recovery record was derived from its newest lease's own columns (lease_recovery_reason
-- in the first migration). A grant overwrites those columns, so a grant that keeps the record
-- copies it into the `kept_*` columns below, on the same row: one row lock still serialises
-- everything about a key, and the watch (which derives its events from a row's old and new
-- values) sees a record kept by a grant and dropped by a confirmation as column changes.
--
-- `kept_token IS NOT NULL` exactly while the key's newest lease was granted with `reconciling:
-- true` over a record and has not confirmed: while that lease is live the key is `held` (anyone
-- else is `lease_held`), and once it ends the key is `recovery_pending` with the kept record,
-- whatever the ending (the reconciler's own crash_recovery, abandon or require-recovery leave no
-- second record: the one record is the kept one, as it was). The columns are set by a reconciling
-- grant (acquire.sql), cleared by the confirmation (reconciled.sql) or by a grant with
-- `reconciled: true` (which replaces the record as in v1), and copied unchanged by a further
-- reconciling grant after an unconfirmed one.
ALTER TABLE leases
    ADD COLUMN kept_reason text CHECK (kept_reason IN ('abandoned', 'expired', 'recovery_required')),
    ADD COLUMN kept_owner text,
    ADD COLUMN kept_token bigint,
    ADD COLUMN kept_acquired_at timestamptz,
    ADD COLUMN kept_ended_at timestamptz,
    ADD COLUMN kept_metadata json,
    ADD CONSTRAINT leases_kept_record_whole CHECK (
        (kept_reason IS NULL) = (kept_token IS NULL)
        AND (kept_token IS NULL) = (kept_owner IS NULL)
        AND (kept_token IS NULL) = (kept_acquired_at IS NULL)
        AND (kept_token IS NULL) = (kept_ended_at IS NULL));

-- The reason of the key's retained recovery record, or NULL: the kept one while there is one
-- (also while the reconciling lease that keeps it is live), else the newest lease's own. Every
-- statement that reads a key's record calls this one definition.
CREATE FUNCTION key_recovery_reason(
    kept_reason text, end_reason text, expires_at timestamptz, crash_recovery boolean,
    recovery_required boolean, at timestamptz
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(kept_reason,
        lease_recovery_reason(end_reason, expires_at, crash_recovery, recovery_required, at))
$$;

-- The state of a key: lease_state, except that a kept record makes a key whose newest lease is
-- no longer live `recovery_pending`.
CREATE FUNCTION key_state(
    kept_reason text, end_reason text, expires_at timestamptz, crash_recovery boolean,
    recovery_required boolean, at timestamptz
) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN kept_reason IS NOT NULL AND (end_reason IS NOT NULL OR expires_at <= at)
            THEN 'recovery_pending'
        ELSE lease_state(end_reason, expires_at, crash_recovery, recovery_required, at)
    END
$$;

-- The metrics gauge's partial index (20261203100000) gains the keys that keep a record.
CREATE INDEX leases_recovery_candidates_kept ON leases (key)
    WHERE end_reason = 'abandoned' OR recovery_required OR crash_recovery
        OR kept_reason IS NOT NULL;
DROP INDEX leases_recovery_candidates;
ALTER INDEX leases_recovery_candidates_kept RENAME TO leases_recovery_candidates;

-- The audit log of recoveries now has three kinds of rows, told apart by `operation`:
-- `reconcile` (v1: an acquire with `reconciled: true` replaced the record), `reconciling` (v1.2:
-- a reconciling grant took the key and kept the record; the row names the reconciling holder,
-- so a reconcile that never confirms is on record), and `reconciled` (v1.2: the holder
-- confirmed, and the record moved here). `presented_token` is the confirming holder's token
-- (NULL for the two kinds of grant, which present none).
ALTER TABLE recoveries
    ADD COLUMN operation text NOT NULL DEFAULT 'reconcile'
        CHECK (operation IN ('reconcile', 'reconciling', 'reconciled')),
    ADD COLUMN presented_token bigint;

-- The watch (20261204100000_changes.sql; 20261205000000_change_log.sql, which comes after this
-- and keeps these rules), with the smallest change for v1.2, marked `v1.2` below:
-- `lease.reconciled` is noted when a record leaves the row, not when a grant merely passes over
-- it. (1) At a new token, only when the new row keeps no record (a `reconciled: true` grant), and
-- the record it names is the kept one if the old row kept one. (2) New: the same token with the
-- kept record cleared is the confirmation (`POST .../reconciled`), noted with the confirming
-- lease's token and owner, the record's reason and `record_token`. A reconciling grant is noted
-- as a plain `lease.granted` (after `lease.expired` of an unreported lease it replaces).
CREATE OR REPLACE FUNCTION note_lease_updates() RETURNS trigger LANGUAGE plpgsql AS $$
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
        -- v1.2: `n.kept_token IS NULL`, key_recovery_reason for lease_recovery_reason, and the
        -- kept record's token when there was one.
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
        -- v1.2: the confirmation of a reconciling lease.
        (8, CASE WHEN n.token = o.token AND o.kept_token IS NOT NULL AND n.kept_token IS NULL
             THEN 'lease.reconciled' END,
            n.token, now(), n.owner, NULL, NULL, NULL, o.kept_reason, o.kept_token)
    ) AS e (rank, kind, token, at, owner, expires_at, version, etag, reason, record_token)
    WHERE e.kind IS NOT NULL
    ORDER BY o.key, e.rank;
    RETURN NULL;
END
$$;
