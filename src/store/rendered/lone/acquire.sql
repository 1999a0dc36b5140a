-- src/store/rendered/lone/acquire.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The one request of a batch of one (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal,
-- $4 key_id, $5 key, $6 owner, $7 ttl_ms, $8 metadata, $9 crash_recovery, $10 reconciled, $11
-- request_id, $12 remote_addr, $13 reconciling, $14 waiter, $15 last_try
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.owner, r.ttl_ms, r.metadata,
        r.crash_recovery, r.reconciled, r.request_id, r.remote_addr, r.reconciling, r.waiter,
        r.last_try, r.i
    FROM (SELECT ($1::text[])[1] AS idem, ($2::bytea[])[1] AS fp, ($3::text[])[1] AS principal,
        ($4::int8[])[1] AS key_id, ($5::text[])[1] AS key, ($6::text[])[1] AS owner, ($7::int8[])[1]
        AS ttl_ms, ($8::text[])[1] AS metadata, ($9::bool[])[1] AS crash_recovery, ($10::bool[])[1]
        AS reconciled, ($11::text[])[1] AS request_id, ($12::text[])[1] AS remote_addr,
        ($13::bool[])[1] AS reconciling, ($14::int8[])[1] AS waiter, ($15::bool[])[1] AS last_try,
        1::int8 AS i) r),
-- The first part of every changing statement after `req`: each request, as every later part reads
-- it, with whether it may run (`verdict`) and its Idempotency-Key's stored answer (`prior_*`);
-- every change requires `verdict = 'run'`. A batch never holds two requests for one key or one
-- Idempotency-Key, so each is decided as if alone.
--
-- Verdicts: `revoked` (the API key was revoked), `replay` (a record exists), `run` (no key, or this
-- statement took the key's transaction-level advisory lock), `in_progress` (another holds it).
-- The record is a LIMITed subquery so the hot connections' generic plan reads by primary key.
--
-- Race-freedom: the lock admits one statement per key at a time. One whose snapshot predates the
-- first's commit finds no record and runs, but its INSERT (remember.sql) meets the first's row, the
-- statement rolls back on the unique violation, and the batch runs again.
gate AS (
    SELECT r.*, p.fingerprint AS prior_fingerprint, p.answer AS prior_answer, CASE
        WHEN r.key_id IS NOT NULL
            AND NOT EXISTS (SELECT FROM api_keys WHERE id = r.key_id AND revoked_at IS NULL)
            THEN 'revoked'
        WHEN r.idem IS NULL THEN 'run'
        WHEN p.fingerprint IS NOT NULL THEN 'replay'
        WHEN pg_try_advisory_xact_lock(hashtextextended(r.idem, hashtext(coalesce(r.principal, ''))))
            THEN 'run'
        ELSE 'in_progress'
    END AS verdict
    FROM req r LEFT JOIN LATERAL (
        SELECT fingerprint, answer FROM idempotency_records
        WHERE principal = coalesce(r.principal, '') AND key = r.idem LIMIT 1) p ON true),
-- Acquire, per request of the batch: `decision` decides on the key's lease row locked FOR NO KEY
-- UPDATE (`cur`), then `granted` (existing row) or `inserted` (first grant) runs; a replaced or
-- kept recovery record goes to `recoveries` in the same statement. A reconciling grant (v1.2) keeps
-- the record in the row's `kept_*` columns.
--
-- Race-freedom: every acquire, renew, release and write of a key waits for its row lock, so
-- `decision` sees the last one's state. Concurrent first acquires race on the INSERT; the primary
-- key lets one win and the losers are sent again. Tokens are drawn after the lock, so per key they
-- rise in grant order, and after `secured`, so a promoted standby never repeats one. Rows are
-- locked in key order, as in every batched statement, so batches never wait in a cycle.
cur AS (
    SELECT r.i, l.key, l.token, l.owner, l.ttl_ms, l.metadata, l.crash_recovery,
        l.recovery_required, l.acquired_at, l.expires_at, l.ended_at,
        l.kept_owner, l.kept_token, l.kept_acquired_at, l.kept_ended_at, l.kept_metadata,
        key_recovery_reason(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery,
            l.recovery_required, now()) AS recovery_reason,
        key_state(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery,
            l.recovery_required, now()) AS state,
        CASE WHEN l.kept_token IS NULL THEN l.owner ELSE l.kept_owner END AS rec_owner,
        coalesce(l.kept_token, l.token) AS rec_token,
        coalesce(l.kept_acquired_at, l.acquired_at) AS rec_acquired_at,
        coalesce(l.kept_ended_at, l.ended_at, l.expires_at) AS rec_ended_at,
        CASE WHEN l.kept_token IS NULL THEN l.metadata ELSE l.kept_metadata END AS rec_metadata
    FROM gate r JOIN leases l ON l.key = r.key WHERE r.verdict = 'run'
    ORDER BY l.key FOR NO KEY UPDATE OF l),
-- `decision` carries what later parts need, so none joins `gate` or `cur` again (each join
-- cost a hash table per batch).
--
-- A free key goes to the first live waiter of its queue; any other acquire finds it `held`, and
-- `waiters` counts the earlier live waiters by GET's rule (status.sql). Race-free: every acquire
-- holds the row lock while it decides, so two waiters never both pass; a volatile subquery is not
-- pulled up, so `waiters` is counted once.
--
-- The token is drawn here, once: drawn in `granted`'s SET it would be drawn again when the UPDATE
-- rechecks a row changed after the snapshot. `secured` is next_fencing_token()'s timeline guard,
-- once per batch and before every nextval.
secured AS (
    SELECT secure_token_timeline()),
decision AS (
    SELECT f.i, f.key, f.owner, f.ttl_ms, f.metadata, f.crash_recovery, f.request_id,
        f.remote_addr, f.principal, f.waiter, f.last_try, f.verdict, f.waiters,
        f.reconciling AND f.recovery_reason IS NOT NULL AS keeps,
        CASE WHEN f.verdict = 'grant' THEN nextval('fencing_token_seq') END AS token,
        f.cur_token, f.cur_owner, f.cur_expires_at, f.cur_ended_at, f.recovery_reason,
        f.rec_owner, f.rec_token, f.rec_acquired_at, f.rec_ended_at, f.rec_metadata,
        CASE WHEN f.cur_key IS NOT NULL
            AND (f.verdict NOT IN ('grant', 'insert') OR f.recovery_reason IS NOT NULL)
        THEN json_build_object(
            'key', f.cur_key, 'token', f.cur_token, 'owner', f.cur_owner, 'ttl_ms', f.cur_ttl_ms,
            'metadata', f.cur_metadata, 'crash_recovery', f.cur_crash_recovery,
            'recovery_required', f.cur_recovery_required, 'acquired_at', f.cur_acquired_at,
            'expires_at', f.cur_expires_at, 'ended_at', f.cur_ended_at,
            'recovery_reason', f.recovery_reason, 'state', f.cur_state,
            'kept_owner', f.kept_owner, 'kept_token', f.kept_token,
            'kept_acquired_at', f.kept_acquired_at, 'kept_ended_at', f.kept_ended_at,
            'kept_metadata', CASE WHEN f.verdict <> 'held' THEN f.kept_metadata END)
        END AS current
    FROM (
        SELECT r.i, r.key, r.owner, r.ttl_ms, r.metadata, r.crash_recovery, r.request_id,
            r.remote_addr, r.principal, r.waiter, r.last_try, r.reconciling,
            CASE WHEN w.waiters > 0 THEN 'held' ELSE coalesce(v.verdict, 'grant') END AS verdict,
            w.waiters, c.key AS cur_key, c.token AS cur_token, c.owner AS cur_owner,
            c.ttl_ms AS cur_ttl_ms, c.metadata AS cur_metadata,
            c.crash_recovery AS cur_crash_recovery, c.recovery_required AS cur_recovery_required,
            c.acquired_at AS cur_acquired_at, c.expires_at AS cur_expires_at,
            c.ended_at AS cur_ended_at, c.state AS cur_state, c.recovery_reason, c.kept_owner,
            c.kept_token, c.kept_acquired_at, c.kept_ended_at, c.kept_metadata, c.rec_owner,
            c.rec_token, c.rec_acquired_at, c.rec_ended_at, c.rec_metadata
        FROM gate r LEFT JOIN cur c ON c.i = r.i
        CROSS JOIN LATERAL (SELECT CASE
            WHEN r.verdict <> 'run' THEN r.verdict
            WHEN c.key IS NULL THEN 'insert'
            WHEN c.state = 'held' THEN 'held'
            WHEN c.recovery_reason IS NOT NULL AND NOT r.reconciled AND NOT r.reconciling
                THEN 'recovery_required'
        END AS verdict) v
        CROSS JOIN LATERAL (SELECT CASE WHEN v.verdict IS NULL THEN (
                SELECT count(*) FROM lease_waiters w
                WHERE w.key = r.key AND w.id < coalesce(r.waiter, 9223372036854775807)
                AND waiter_instance_alive(w.instance))
            END AS waiters) w) f
    CROSS JOIN secured),
granted AS (
    UPDATE leases SET token = d.token, owner = d.owner, ttl_ms = d.ttl_ms,
        metadata = d.metadata::json, crash_recovery = d.crash_recovery, recovery_required = false,
        acquired_at = now(), expires_at = now() + d.ttl_ms * interval '1 millisecond',
        end_reason = NULL, ended_at = NULL,
        -- A reconciling grant keeps the record; any other grant replaces it.
        kept_reason = CASE WHEN d.keeps THEN d.recovery_reason END,
        kept_owner = CASE WHEN d.keeps THEN d.rec_owner END,
        kept_token = CASE WHEN d.keeps THEN d.rec_token END,
        kept_acquired_at = CASE WHEN d.keeps THEN d.rec_acquired_at END,
        kept_ended_at = CASE WHEN d.keeps THEN d.rec_ended_at END,
        kept_metadata = CASE WHEN d.keeps THEN d.rec_metadata END
    FROM decision d
    WHERE leases.key = d.key AND d.verdict = 'grant'),
inserted AS (
    INSERT INTO leases (key, token, owner, ttl_ms, metadata, crash_recovery, acquired_at, expires_at)
    SELECT d.key, nextval('fencing_token_seq'), d.owner, d.ttl_ms, d.metadata::json,
        d.crash_recovery, now(), now() + d.ttl_ms * interval '1 millisecond'
    FROM decision d WHERE d.verdict = 'insert'
    ORDER BY d.key
    ON CONFLICT (key) DO NOTHING
    RETURNING key, token),
new_lease AS (
    SELECT d.i, d.key, coalesce(d.token, n.token) AS token, d.owner, d.ttl_ms,
        d.metadata::json AS metadata, d.crash_recovery, false AS recovery_required,
        now() AS acquired_at, now() + d.ttl_ms * interval '1 millisecond' AS expires_at,
        NULL::timestamptz AS ended_at, d.keeps, d.cur_token, d.cur_owner, d.cur_expires_at,
        d.recovery_reason, d.rec_token
    FROM decision d LEFT JOIN inserted n ON n.key = d.key AND d.verdict = 'insert'
    WHERE d.verdict = 'grant' OR n.key IS NOT NULL),
reconciled AS (
    INSERT INTO recoveries (key, reason, record_owner, record_token, record_acquired_at,
        record_ended_at, record_metadata, reconciled_by, new_token, request_id, remote_addr,
        principal, operation)
    SELECT d.key, d.recovery_reason, d.rec_owner, d.rec_token, d.rec_acquired_at,
        d.rec_ended_at, d.rec_metadata, d.owner, d.token, d.request_id, d.remote_addr,
        d.principal, CASE WHEN d.keeps THEN 'reconciling' ELSE 'reconcile' END
    FROM decision d WHERE d.verdict = 'grant' AND d.recovery_reason IS NOT NULL),
-- The watch's changes of the grants, each drawing its seq after the row lock: the expiry of an
-- unreported replaced lease, a replaced record's reconciliation, and the grant. `expired` updates
-- the report row when this snapshot sees one (READ COMMITTED rechecks `token < ...` on a newer
-- one), else inserts: an upsert would lock and log a row per grant. The relay's report holds a
-- share lock on the lease row that `cur` waited for.
expired_update AS (
    UPDATE expiry_reports x SET token = d.cur_token
    FROM decision d
    WHERE x.key = d.key AND x.token < d.cur_token AND d.verdict = 'grant'
        AND d.cur_ended_at IS NULL
    RETURNING x.key),
expired_insert AS (
    INSERT INTO expiry_reports (key, token)
    SELECT d.key, d.cur_token FROM decision d
    WHERE d.verdict = 'grant' AND d.cur_ended_at IS NULL
        AND NOT EXISTS (SELECT FROM expiry_reports x WHERE x.key = d.key)
    ORDER BY d.key
    ON CONFLICT (key) DO UPDATE SET token = excluded.token WHERE expiry_reports.token < excluded.token
    RETURNING key),
expired AS (
    SELECT key FROM expired_update UNION ALL SELECT key FROM expired_insert),
granted_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner, expires_at, reason, record_token)
    SELECT e.kind, n.key, e.token, e.at, e.owner, e.expires_at, e.reason, e.record_token
    FROM new_lease n LEFT JOIN expired x ON x.key = n.key
    CROSS JOIN LATERAL (VALUES
        (1, CASE WHEN x.key IS NOT NULL THEN 'lease.expired' END, n.cur_token, n.cur_expires_at,
            n.cur_owner, NULL::timestamptz, NULL::text, NULL::bigint),
        (2, CASE WHEN NOT n.keeps AND n.recovery_reason IS NOT NULL THEN 'lease.reconciled' END,
            n.token, n.acquired_at, n.owner, NULL, n.recovery_reason, n.rec_token),
        (3, 'lease.granted', n.token, n.acquired_at, n.owner, n.expires_at, NULL, NULL)
    ) AS e (rank, kind, token, at, owner, expires_at, reason, record_token)
    WHERE e.kind IS NOT NULL
    ORDER BY n.key, e.rank),
-- The answers; a waiter's `held` before its last try is not settled. `clock` is the database's
-- now(), for the waiter's sleep.
result AS (
    SELECT d.i, d.verdict,
        CASE WHEN n.i IS NOT NULL THEN json_build_object(
            'key', n.key, 'token', n.token, 'owner', n.owner, 'ttl_ms', n.ttl_ms,
            'metadata', n.metadata, 'crash_recovery', n.crash_recovery,
            'recovery_required', n.recovery_required, 'acquired_at', n.acquired_at,
            'expires_at', n.expires_at, 'ended_at', n.ended_at) END AS granted,
        d.current,
        CASE WHEN d.verdict = 'held' THEN d.waiters END AS waiters,
        coalesce(n.keeps, false) AS keeps,
        (d.verdict <> 'insert' OR n.key IS NOT NULL) AND (d.last_try OR d.verdict <> 'held')
            AS settled,
        now() AS clock
    FROM decision d LEFT JOIN new_lease n ON n.i = d.i),
-- A waiter leaves the queue with its final answer (a trigger wakes the next).
dequeued AS (
    DELETE FROM lease_waiters w USING result res JOIN gate r ON r.i = res.i
    WHERE w.id = r.waiter AND res.settled),
-- The last part of every changing statement: one answer row per request, `settled` false when it
-- will be sent again. `remembered` stores each answer under its Idempotency-Key in this statement,
-- so the record commits exactly with the change; no ON CONFLICT, so a racing record rolls the
-- statement back (gate.sql). A transaction's ops after its first have JSON null.
remembered AS (
    INSERT INTO idempotency_records (principal, key, fingerprint, answer)
    SELECT coalesce(g.principal, ''), g.idem, g.fp, to_json(res)
    FROM result res JOIN gate g ON g.i = res.i
    WHERE g.verdict = 'run' AND g.idem IS NOT NULL AND res.settled)
SELECT g.i, g.verdict AS gate, g.prior_fingerprint,
    coalesce(g.prior_answer, (SELECT to_json(res) FROM result res WHERE res.i = g.i), 'null')
        AS answer
FROM gate g
