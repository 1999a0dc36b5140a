-- src/store/rendered/put.sql: the statement as the service sends it, assembled by src/store/engine/statement.rs.
-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib rendered` writes it again from its parts.
-- The requests of the batch (src/store/engine/statement.rs): $1 idem, $2 fp, $3 principal, $4
-- key_id, $5 key, $6 token, $7 has_if_match, $8 tags, $9 request_id, $10 remote_addr, $11
-- operation, $12 etag, $13 size, $14 content_type, $15 body, $16 keep
WITH req AS (
    SELECT r.idem, r.fp, r.principal, r.key_id, r.key, r.token, r.has_if_match, CASE WHEN r.tags IS
        NOT NULL THEN ARRAY(SELECT json_array_elements_text(r.tags::json)) END AS tags,
        r.request_id, r.remote_addr, r.operation, r.etag, r.size, r.content_type, r.body, r.keep,
        r.i
    FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[], $5::text[], $6::bigint[],
        $7::boolean[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::bigint[],
        $14::text[], $15::bytea[], $16::bigint[])
    WITH ORDINALITY AS r(idem, fp, principal, key_id, key, token, has_if_match, tags, request_id,
        remote_addr, operation, etag, size, content_type, body, keep, i)),
-- The first part of every changing statement after its requests (`req`, which
-- src/store/engine/statement.rs writes from the statement's columns; acquire.sql, renew.sql,
-- end.sql and fenced.sql follow it, and remember.sql ends each): per request (`i`), whether it may run at all
-- (`gate`), and the stored answer of its Idempotency-Key (`prior`). Every change that follows
-- is conditioned on its request's `gate.verdict = 'run'`.
--
-- Every statement is over a batch of requests: arrays bound as $1, $2, …, one element per
-- request, unnested into `req` with their position `i`. A batch never holds two requests for one
-- key or one Idempotency-Key (src/store/engine/batch/ defers the second to the next batch), so each
-- request is decided on its own, as if it were alone, and a refusal of one changes nothing for
-- another. Every request's `req` row has `idem` (the Idempotency-Key, NULL when none was sent),
-- `fp` (the request's fingerprint), `principal` (NULL without authentication) and `key_id` (its
-- API key's id, NULL likewise).
--
-- Verdicts: `revoked` when the API key was revoked before this statement ran (however early the
-- request's headers came); `run` without an Idempotency-Key; `replay` when the key has a record
-- (remember.sql answers it instead of the change); `run` when this statement takes the key's
-- transaction-level advisory lock, which only one statement at a time can hold; `in_progress`
-- when another statement holds it.
--
-- `prior` looks each request's record up by its primary key, in a subquery of its own (LIMIT
-- keeps the planner from making it a join): the hot connections keep one generic plan for their
-- life, and a join planned while the table was nearly empty read all of it for every batch.
--
-- Race-freedom: two requests with one key never both change something. The lock admits one at a
-- time. A second one that takes the lock after the first committed, but whose snapshot is older
-- than that commit, finds no record in `prior` and runs; its record's INSERT (remember.sql)
-- then meets the first one's row in the primary key, the statement fails with a unique
-- violation and is rolled back whole, and the batch is run again, now seeing the record.
prior AS (
    SELECT r.i, p.fingerprint, p.answer
    FROM req r CROSS JOIN LATERAL (
        SELECT fingerprint, answer FROM idempotency_records
        WHERE principal = coalesce(r.principal, '') AND key = r.idem LIMIT 1) p
    WHERE r.idem IS NOT NULL),
gate AS (
    SELECT r.i, CASE
        WHEN r.key_id IS NOT NULL
            AND NOT EXISTS (SELECT FROM api_keys WHERE id = r.key_id AND revoked_at IS NULL)
            THEN 'revoked'
        WHEN r.idem IS NULL THEN 'run'
        WHEN EXISTS (SELECT FROM prior WHERE prior.i = r.i) THEN 'replay'
        WHEN pg_try_advisory_xact_lock(hashtextextended(r.idem, hashtext(coalesce(r.principal, ''))))
            THEN 'run'
        ELSE 'in_progress'
    END AS verdict
    FROM req r),
-- The first part of every fenced statement (put.sql, delete_head.sql and precheck.sql follow
-- it), for each request of the batch: the fencing rule, in this one place, and the audit row of
-- a refusal (`refused`), written by the same statement so that it commits with the verdict.
--
-- The requests (`req`: key, token, has_if_match, tags, request_id, remote_addr, operation, and for
-- a write etag, size, content_type, body and keep; src/store/snapshots/mod.rs names them) and
-- gate.sql come before it (nothing of a request is checked, refused or written unless its gate
-- verdict is `run`), and remember.sql after the statement that follows it. `r.token < c.token OR`
-- is what a lower token is stale against: the key's newest granted token (`r.token < c.token
-- OR`); only the fault tests' negative control fills it otherwise.
--
-- Locks: `cur` takes each key's lease row FOR NO KEY UPDATE, in key order (the order every
-- batched statement locks in), the lock every grant, renewal, release and fenced write of the
-- key takes, so the verdict is made on the row as the last of them left it and nothing can
-- change it until this statement's transaction ends. A grant that commits first is seen (its
-- token is the newest: a lower one is stale); one that comes after waits, and then sees what this
-- statement did. A key with no row has nothing to lock: it never had a lease, so every token is
-- unknown for it. Race-free under READ COMMITTED with any number of instances.
cur AS (
    SELECT r.i, l.key, l.token, l.owner, l.end_reason, l.snapshot_version, l.snapshot_etag,
        l.versions_pruned_through
    FROM req r JOIN gate g ON g.i = r.i AND g.verdict = 'run' JOIN leases l ON l.key = r.key
    ORDER BY l.key FOR NO KEY UPDATE OF l),
verdict AS (
    SELECT r.i, r.key, CASE
        WHEN g.verdict <> 'run' THEN g.verdict
        WHEN c.key IS NULL OR r.token > c.token THEN 'unknown_token'
        WHEN r.token < c.token OR c.end_reason IS NOT NULL THEN 'stale_token'
        WHEN r.has_if_match AND (c.snapshot_etag IS NULL
                     OR NOT (r.tags IS NULL OR c.snapshot_etag = ANY(r.tags)))
            THEN 'precondition_failed'
        ELSE 'accepted'
    END AS outcome,
    c.token AS highest_token, c.owner AS holder,
    c.snapshot_etag IS NULL AS created, c.snapshot_version,
    c.versions_pruned_through AS pruned_through
    FROM req r JOIN gate g ON g.i = r.i LEFT JOIN cur c ON c.i = r.i),
refused AS (
    INSERT INTO rejections (key, reason, presented_token, highest_token, holder,
        operation, request_id, remote_addr, principal)
    SELECT r.key, v.outcome, r.token, v.highest_token, v.holder, r.operation, r.request_id,
        r.remote_addr, r.principal
    FROM verdict v JOIN req r ON r.i = v.i WHERE v.outcome IN ('stale_token', 'unknown_token')
    RETURNING id, key, at, reason, presented_token, highest_token, holder, operation),
-- The watch's change of each refusal (`write.refused`, migrations/20261205000000_change_log.sql).
refusals_noted AS (
    INSERT INTO change_log (kind, key, token, at, owner, reason, audit_id, operation,
        highest_token)
    SELECT 'write.refused', f.key, f.presented_token, f.at, f.holder, f.reason, f.id,
        f.operation, f.highest_token
    FROM refused f ORDER BY f.id),
-- The fenced write, for each request of the batch: fenced.sql, then this. One statement, so the
-- checks, the writes (or the refusals and their audit rows) and the pruning commit together.
--
-- `r.body` is the request's bound body (`r.body`), or for a body uploaded beforehand (a batch
-- of one) the connection's upload table's; `r.keep` is the versions each key keeps.
--
-- `head` bumps each accepted key's version counter and sets its ETag on the row `cur` locked, so
-- versions are gapless however many writers race, and returns what the rest writes, so that no
-- part after it joins `req` again (each join built a hash table per batch, bench/README.md,
-- fifth pass); `stored` inserts the bodies under those versions; `pruned` drops, in one DELETE
-- for the batch, the versions that fall out of the retention window: those above the key's
-- `versions_pruned_through` (as `cur` locked it), which then moves up to the window's start, so
-- that the DELETE walks none of the index entries its earlier runs left for the vacuum
-- (migrations/20261208000000_versions_pruned_through.sql). Pruned as far as its own `keep`: an
-- instance that keeps more versions than another finds them gone, as before.
head AS (
    UPDATE leases SET snapshot_version = leases.snapshot_version + 1, snapshot_etag = r.etag,
        versions_pruned_through = greatest(leases.versions_pruned_through,
            leases.snapshot_version + 1 - r.keep)
    FROM verdict v JOIN req r ON r.i = v.i
    WHERE leases.key = r.key AND v.outcome = 'accepted'
    RETURNING leases.key, leases.snapshot_version AS version, v.pruned_through, r.token, r.etag,
        r.size, r.content_type, r.keep, r.body AS body),
stored AS (
    INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body)
    SELECT h.key, h.version, h.token, h.etag, h.size, h.content_type, now(), h.body
    FROM head h
    RETURNING key, version, updated_at),
-- The watch's change of each write, drawn after the row lock (migrations/20261205000000_change_log.sql).
written_noted AS (
    INSERT INTO change_log (kind, key, token, at, version, etag)
    SELECT 'snapshot.written', h.key, h.token, now(), h.version, h.etag
    FROM head h ORDER BY h.key),
pruned AS (
    DELETE FROM snapshot_versions sv
    USING head h
    WHERE sv.key = h.key AND sv.version > h.pruned_through AND sv.version <= h.version - h.keep),
result AS (
    SELECT v.i, v.outcome, v.highest_token, v.created, f.id AS audit_id,
        s.version, s.updated_at, true AS settled
    FROM verdict v LEFT JOIN refused f ON f.key = v.key LEFT JOIN stored s ON s.key = v.key),
-- The last part of every changing statement (gate.sql begins it), after the statement's own
-- `result`: one row per request (`i`) that is its answer, with a column `settled` that is false
-- only when the request will be sent again (acquire's lost race for a new key).
--
-- `remembered` stores each answer under its request's Idempotency-Key, in this statement, so the
-- record commits exactly when the change does (or the refusal's audit row). Without ON CONFLICT:
-- a racing record makes the whole statement fail and roll back (see gate.sql). The statement
-- answers, per request, the gate's verdict, the stored fingerprint of a replay, and the answer:
-- the stored one on a replay, this statement's own otherwise.
remembered AS (
    INSERT INTO idempotency_records (principal, key, fingerprint, answer)
    SELECT coalesce(r.principal, ''), r.idem, r.fp, to_json(res)
    FROM result res JOIN req r ON r.i = res.i JOIN gate g ON g.i = res.i
    WHERE g.verdict = 'run' AND r.idem IS NOT NULL AND res.settled)
SELECT g.i, g.verdict AS gate, p.fingerprint AS prior_fingerprint,
    coalesce(p.answer, (SELECT to_json(res) FROM result res WHERE res.i = g.i)) AS answer
FROM gate g LEFT JOIN prior p ON p.i = g.i
