-- Confirm a reconciliation (v1.2), for each request of the batch: the holder of the key's live
-- lease says the leftovers of the record its reconciling grant kept no longer conflict, so the
-- record leaves the row (`kept_*` cleared, migrations/20261204200000_reconciling.sql) and moves
-- to the audit log (`confirmed`, operation `reconciled`), and the lease goes on unchanged. One
-- UPDATE with renew.sql's live-lease condition, on the rows `locked` locked first in key order
-- (the order every batched statement locks in): the lock yields the row's newest version, so
-- the record read in `locked` is the one the UPDATE clears, a confirmation racing a takeover
-- either lands first or finds another token (no row: lease_lost, nothing changed), and one
-- racing its own lease's expiry report is lease_lost once the report is in. A second
-- confirmation of the same lease finds no record kept: it changes no value, writes no audit row
-- and notes no change, and answers the lease (confirming is idempotent, as a retry without an
-- Idempotency-Key needs). The requests (`req`: key, token, request_id, remote_addr) and gate.sql come first, remember.sql last.
locked AS (
    SELECT r.i, l.key, l.kept_reason, l.kept_owner, l.kept_token, l.kept_acquired_at,
        l.kept_ended_at, l.kept_metadata
    FROM req r JOIN gate g ON g.i = r.i AND g.verdict = 'run'
    JOIN leases l ON l.key = r.key
    ORDER BY l.key FOR NO KEY UPDATE OF l),
changed AS (
    UPDATE leases l SET kept_reason = NULL, kept_owner = NULL, kept_token = NULL,
        kept_acquired_at = NULL, kept_ended_at = NULL, kept_metadata = NULL
    FROM locked k JOIN req r ON r.i = k.i
    WHERE l.key = k.key AND l.token = r.token AND l.end_reason IS NULL
        AND l.expires_at > clock_timestamp()
    RETURNING r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at),
confirmed AS (
    INSERT INTO recoveries (key, reason, record_owner, record_token, record_acquired_at,
        record_ended_at, record_metadata, reconciled_by, new_token, request_id, remote_addr,
        principal, operation, presented_token)
    SELECT k.key, k.kept_reason, k.kept_owner, k.kept_token, k.kept_acquired_at,
        k.kept_ended_at, k.kept_metadata, c.owner, c.token, r.request_id, r.remote_addr,
        r.principal, 'reconciled', r.token
    FROM changed c JOIN locked k ON k.i = c.i JOIN req r ON r.i = c.i
    WHERE k.kept_token IS NOT NULL),
-- The watch's change of a confirmation that dropped a kept record
-- (migrations/20261205000000_change_log.sql).
reconciled_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner, reason, record_token)
    SELECT 'lease.reconciled', c.key, c.token, now(), c.owner, k.kept_reason, k.kept_token
    FROM changed c JOIN locked k ON k.i = c.i WHERE k.kept_token IS NOT NULL ORDER BY c.key),
-- The answers: the lease, or null (lease_lost).
result AS (
    SELECT r.i, (SELECT to_json(c) FROM changed c WHERE c.i = r.i) AS lease, true AS settled
    FROM req r),
