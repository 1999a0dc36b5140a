-- The hot calls of a request that has its batch to itself, as functions: an acquire
-- (lease_acquire_one(), called by src/store/leases/sql/acquire_one.sql) and a fenced write with
-- its body bound (snapshot_put_one(), src/store/snapshots/sql/put_one.sql). Batches of several
-- requests run the batch statements (acquire.sql, put.sql). The rules are the batch statements',
-- step for step, and tests hold each pair to the same answers and changes
-- (tests/api/lone_forms.rs). Why a second form: a batch statement starts ~90 plan nodes whatever
-- its requests need, which is most of what a lone request paid (one client: 0.84 ms a grant,
-- 0.64 ms with the function); a function runs only the branch its request takes. Over a batch
-- of 16 the statement is cheaper (per request: 0.06 ms of PostgreSQL's time against 0.11), so it
-- stays for batches.
--
-- Race-freedom, under READ COMMITTED: each statement in a function takes a new snapshot, after
-- the locks taken before it. The Idempotency-Key's advisory lock is taken before its record is
-- looked up (change_gate()), so a request that holds it sees the record of any earlier holder
-- (which committed as it let go), and two requests with one key never both run. On an existing
-- key the row lock (FOR NO KEY UPDATE) orders every acquire, renew, release and write of the
-- key, so a decision reads the state the last of them left.

-- The gate of a changing request (src/store/idempotency/sql/gate.sql, as a function): `revoked`
-- when its API key was revoked, `replay` with the record's fingerprint and answer when its
-- Idempotency-Key has one, `in_progress` when another statement holds the key, else `run`.
-- A refused gate's answer is not read: it says the verdict alone.
CREATE FUNCTION change_gate(p_idem text, p_principal text, p_key_id bigint,
    OUT gate text, OUT prior_fingerprint bytea, OUT answer json)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_key_id IS NOT NULL
        AND NOT EXISTS (SELECT FROM api_keys WHERE id = p_key_id AND revoked_at IS NULL) THEN
        gate := 'revoked';
    ELSIF p_idem IS NULL THEN
        gate := 'run';
    ELSE
        gate := CASE WHEN pg_try_advisory_xact_lock(
            hashtextextended(p_idem, hashtext(coalesce(p_principal, ''))))
            THEN 'run' ELSE 'in_progress' END;
        SELECT r.fingerprint, r.answer INTO prior_fingerprint, answer FROM idempotency_records r
        WHERE r.principal = coalesce(p_principal, '') AND r.key = p_idem;
        IF FOUND THEN
            gate := 'replay';
        END IF;
    END IF;
    IF gate IN ('revoked', 'in_progress') THEN
        answer := json_build_object('verdict', gate, 'settled', true);
    END IF;
END
$$;

-- Acquire. On a new key there is no row to lock: concurrent first acquires all try the INSERT,
-- the primary key lets one win, and a loser's ON CONFLICT DO NOTHING waits for the winner's
-- commit, after which the loop finds and locks the winner's row. Tokens are drawn only once the
-- row is locked (or being inserted), so per key they increase in grant order, and only after
-- secure_token_timeline(), so a promoted standby never repeats one.
CREATE FUNCTION lease_acquire_one(
    p_idem text, p_fp bytea, p_principal text, p_key_id bigint, p_key text, p_owner text,
    p_ttl_ms bigint, p_metadata text, p_crash_recovery boolean, p_reconciled boolean,
    p_request_id text, p_remote_addr text, p_reconciling boolean, p_waiter bigint,
    p_last_try boolean,
    OUT gate text, OUT prior_fingerprint bytea, OUT answer json)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l leases;
    v_state text;
    v_reason text;
    v_verdict text;
    v_waiters bigint;
    v_keeps boolean := false;
    v_token bigint;
    v_current json;
    v_granted json;
    v_expired boolean := false;
    v_settled boolean;
    -- The key's record as it stands: the one the row keeps, else its newest lease's own.
    v_rec_owner text;
    v_rec_token bigint;
    v_rec_acquired_at timestamptz;
    v_rec_ended_at timestamptz;
    v_rec_metadata json;
BEGIN
    SELECT g.gate, g.prior_fingerprint, g.answer INTO gate, prior_fingerprint, answer
    FROM change_gate(p_idem, p_principal, p_key_id) g;
    IF gate <> 'run' THEN
        -- Answered by the gate, which settles a waiter's wait: it leaves its queue.
        DELETE FROM lease_waiters WHERE id = p_waiter;
        RETURN;
    END IF;

    LOOP
        SELECT * INTO l FROM leases WHERE key = p_key FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            -- The key's first grant (no queue can exist for a key without a row).
            PERFORM secure_token_timeline();
            INSERT INTO leases (key, token, owner, ttl_ms, metadata, crash_recovery,
                acquired_at, expires_at)
            VALUES (p_key, nextval('fencing_token_seq'), p_owner, p_ttl_ms, p_metadata::json,
                p_crash_recovery, now(), now() + p_ttl_ms * interval '1 millisecond')
            ON CONFLICT (key) DO NOTHING
            RETURNING token INTO v_token;
            IF FOUND THEN
                v_verdict := 'insert';
                EXIT;
            END IF;
            -- Another first acquire won and has committed: its row is there to lock now.
            CONTINUE;
        END IF;

        v_state := key_state(l.kept_reason, l.end_reason, l.expires_at, l.crash_recovery,
            l.recovery_required, now());
        v_reason := key_recovery_reason(l.kept_reason, l.end_reason, l.expires_at,
            l.crash_recovery, l.recovery_required, now());
        IF v_state = 'held' THEN
            v_verdict := 'held';
        ELSIF v_reason IS NOT NULL AND NOT p_reconciled AND NOT p_reconciling THEN
            v_verdict := 'recovery_required';
        ELSE
            -- Waiting acquire (v1.1): a free key goes to the first live waiter of its queue; any
            -- other acquire finds it held by the live waiters queued before it, and says how many
            -- (the rule GET's `waiters` counts by, status.sql). The row lock above keeps two
            -- waiters from both passing.
            SELECT count(*) INTO v_waiters FROM lease_waiters w
            WHERE w.key = p_key AND w.id < coalesce(p_waiter, 9223372036854775807)
                AND waiter_instance_alive(w.instance);
            v_verdict := CASE WHEN v_waiters > 0 THEN 'held' ELSE 'grant' END;
        END IF;

        v_rec_owner := CASE WHEN l.kept_token IS NULL THEN l.owner ELSE l.kept_owner END;
        v_rec_token := coalesce(l.kept_token, l.token);
        v_rec_acquired_at := coalesce(l.kept_acquired_at, l.acquired_at);
        v_rec_ended_at := coalesce(l.kept_ended_at, l.ended_at, l.expires_at);
        v_rec_metadata := CASE WHEN l.kept_token IS NULL THEN l.metadata ELSE l.kept_metadata END;
        -- What the answer says of the row as it was found: a refusal's holder or record, or the
        -- record a grant replaces or keeps; `held` names the holder and the state alone.
        IF v_verdict <> 'grant' OR v_reason IS NOT NULL THEN
            v_current := json_build_object(
                'key', l.key, 'token', l.token, 'owner', l.owner, 'ttl_ms', l.ttl_ms,
                'metadata', l.metadata, 'crash_recovery', l.crash_recovery,
                'recovery_required', l.recovery_required, 'acquired_at', l.acquired_at,
                'expires_at', l.expires_at, 'ended_at', l.ended_at,
                'recovery_reason', v_reason, 'state', v_state,
                'kept_owner', l.kept_owner, 'kept_token', l.kept_token,
                'kept_acquired_at', l.kept_acquired_at, 'kept_ended_at', l.kept_ended_at,
                'kept_metadata', CASE WHEN v_verdict <> 'held' THEN l.kept_metadata END);
        END IF;
        EXIT WHEN v_verdict <> 'grant';

        -- v1.2: a reconciling grant over a record keeps it (migrations/
        -- 20261204200000_reconciling.sql); any other grant here replaces it.
        v_keeps := p_reconciling AND v_reason IS NOT NULL;
        PERFORM secure_token_timeline();
        v_token := nextval('fencing_token_seq');
        UPDATE leases SET token = v_token, owner = p_owner, ttl_ms = p_ttl_ms,
            metadata = p_metadata::json, crash_recovery = p_crash_recovery,
            recovery_required = false, acquired_at = now(),
            expires_at = now() + p_ttl_ms * interval '1 millisecond',
            end_reason = NULL, ended_at = NULL,
            kept_reason = CASE WHEN v_keeps THEN v_reason END,
            kept_owner = CASE WHEN v_keeps THEN v_rec_owner END,
            kept_token = CASE WHEN v_keeps THEN v_rec_token END,
            kept_acquired_at = CASE WHEN v_keeps THEN v_rec_acquired_at END,
            kept_ended_at = CASE WHEN v_keeps THEN v_rec_ended_at END,
            kept_metadata = CASE WHEN v_keeps THEN v_rec_metadata END
        WHERE key = p_key;
        IF v_reason IS NOT NULL THEN
            INSERT INTO recoveries (key, reason, record_owner, record_token, record_acquired_at,
                record_ended_at, record_metadata, reconciled_by, new_token, request_id,
                remote_addr, principal, operation)
            VALUES (p_key, v_reason, v_rec_owner, v_rec_token, v_rec_acquired_at,
                v_rec_ended_at, v_rec_metadata, p_owner, v_token, p_request_id, p_remote_addr,
                p_principal, CASE WHEN v_keeps THEN 'reconciling' ELSE 'reconcile' END);
        END IF;
        -- The expiry of the unended lease this grant replaces, unless the relay reported it
        -- (watch/sql/expire.sql): the report's row updated in place, inserted when the key has
        -- none. Not an upsert every time: that locks the row even when it changes nothing, a WAL
        -- record per grant over an expiry already reported, which is most of them.
        IF l.ended_at IS NULL THEN
            UPDATE expiry_reports SET token = l.token WHERE key = p_key AND token < l.token;
            v_expired := FOUND;
            IF NOT v_expired AND NOT EXISTS (SELECT FROM expiry_reports WHERE key = p_key) THEN
                INSERT INTO expiry_reports (key, token) VALUES (p_key, l.token)
                ON CONFLICT (key) DO UPDATE SET token = excluded.token
                WHERE expiry_reports.token < excluded.token;
                v_expired := FOUND;
            END IF;
        END IF;
        EXIT;
    END LOOP;

    IF v_verdict IN ('grant', 'insert') THEN
        v_granted := json_build_object(
            'key', p_key, 'token', v_token, 'owner', p_owner, 'ttl_ms', p_ttl_ms,
            'metadata', p_metadata::json, 'crash_recovery', p_crash_recovery,
            'recovery_required', false, 'acquired_at', now(),
            'expires_at', now() + p_ttl_ms * interval '1 millisecond', 'ended_at', NULL);
        -- The watch's changes of the grant (migrations/20261205000000_change_log.sql), in order:
        -- the expiry of the lease it replaced, the reconciliation of a record it replaced (one a
        -- reconciling grant keeps is reconciled at its confirmation, reconciled.sql), the grant.
        INSERT INTO change_log (kind, key, token, at, owner, expires_at, reason, record_token)
        SELECT e.kind, p_key, e.token, e.at, e.owner, e.expires_at, e.reason, e.record_token
        FROM (VALUES
            (1, CASE WHEN v_expired THEN 'lease.expired' END, l.token, l.expires_at, l.owner,
                NULL::timestamptz, NULL::text, NULL::bigint),
            (2, CASE WHEN NOT v_keeps AND v_reason IS NOT NULL THEN 'lease.reconciled' END,
                v_token, now(), p_owner, NULL, v_reason, v_rec_token),
            (3, 'lease.granted', v_token, now(), p_owner,
                now() + p_ttl_ms * interval '1 millisecond', NULL, NULL)
        ) AS e (rank, kind, token, at, owner, expires_at, reason, record_token)
        WHERE e.kind IS NOT NULL
        ORDER BY e.rank;
    END IF;

    -- A waiter's `held` that is not its last try is not settled: it waits on. A waiter leaves
    -- its queue with its final answer (a trigger on lease_waiters wakes the ones behind it).
    v_settled := p_last_try OR v_verdict <> 'held';
    answer := json_build_object('verdict', v_verdict, 'granted', v_granted,
        'current', v_current, 'waiters', CASE WHEN v_verdict = 'held' THEN v_waiters END,
        'keeps', v_keeps, 'settled', v_settled, 'clock', now());
    IF v_settled AND p_waiter IS NOT NULL THEN
        DELETE FROM lease_waiters WHERE id = p_waiter;
    END IF;
    -- The answer is stored under the request's Idempotency-Key in the same transaction, so the
    -- record commits exactly when the change does.
    IF p_idem IS NOT NULL AND v_settled THEN
        INSERT INTO idempotency_records (principal, key, fingerprint, answer)
        VALUES (coalesce(p_principal, ''), p_idem, p_fp, answer);
    END IF;
END
$$;

-- A fenced write of a bound body (src/store/snapshots/sql/fenced.sql and put.sql, as a
-- function): refused and audited unless its token is the key's newest granted one and that lease
-- is not ended; else checked against If-Match, then written as the key's next version, with the
-- versions past the key's `keep` pruned (migrations/20261208000000_versions_pruned_through.sql).
CREATE FUNCTION snapshot_put_one(
    p_idem text, p_fp bytea, p_principal text, p_key_id bigint, p_key text, p_token bigint,
    p_has_if_match boolean, p_tags text[], p_request_id text, p_remote_addr text,
    p_operation text, p_etag text, p_size bigint, p_content_type text, p_body bytea,
    p_keep bigint,
    OUT gate text, OUT prior_fingerprint bytea, OUT answer json)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l record;
    v_found boolean;
    v_outcome text;
    v_audit_id bigint;
    v_audit_at timestamptz;
    v_version bigint;
    v_updated_at timestamptz;
BEGIN
    SELECT g.gate, g.prior_fingerprint, g.answer INTO gate, prior_fingerprint, answer
    FROM change_gate(p_idem, p_principal, p_key_id) g;
    IF gate <> 'run' THEN
        RETURN;
    END IF;
    SELECT key, token, owner, end_reason, snapshot_version, snapshot_etag,
        versions_pruned_through
    INTO l FROM leases WHERE key = p_key FOR NO KEY UPDATE;
    v_found := FOUND;
    v_outcome := CASE
        WHEN NOT v_found OR p_token > l.token THEN 'unknown_token'
        WHEN p_token < l.token OR l.end_reason IS NOT NULL THEN 'stale_token'
        WHEN p_has_if_match AND (l.snapshot_etag IS NULL
                OR NOT (p_tags IS NULL OR l.snapshot_etag = ANY(p_tags)))
            THEN 'precondition_failed'
        ELSE 'accepted'
    END;
    IF v_outcome IN ('stale_token', 'unknown_token') THEN
        INSERT INTO rejections (key, reason, presented_token, highest_token, holder,
            operation, request_id, remote_addr, principal)
        VALUES (p_key, v_outcome, p_token, l.token, l.owner, p_operation, p_request_id,
            p_remote_addr, p_principal)
        RETURNING id, at INTO v_audit_id, v_audit_at;
        INSERT INTO change_log (kind, key, token, at, owner, reason, audit_id, operation,
            highest_token)
        VALUES ('write.refused', p_key, p_token, v_audit_at, l.owner, v_outcome, v_audit_id,
            p_operation, l.token);
    ELSIF v_outcome = 'accepted' THEN
        v_version := l.snapshot_version + 1;
        UPDATE leases SET snapshot_version = v_version, snapshot_etag = p_etag,
            versions_pruned_through = greatest(versions_pruned_through, v_version - p_keep)
        WHERE key = p_key;
        INSERT INTO snapshot_versions (key, version, token, etag, size, content_type,
            updated_at, body)
        VALUES (p_key, v_version, p_token, p_etag, p_size, p_content_type, now(), p_body)
        RETURNING updated_at INTO v_updated_at;
        INSERT INTO change_log (kind, key, token, at, version, etag)
        VALUES ('snapshot.written', p_key, p_token, now(), v_version, p_etag);
        DELETE FROM snapshot_versions
        WHERE key = p_key AND version > l.versions_pruned_through
            AND version <= v_version - p_keep;
    END IF;
    answer := json_build_object('outcome', v_outcome, 'highest_token', l.token,
        'created', NOT v_found OR l.snapshot_etag IS NULL, 'audit_id', v_audit_id,
        'version', v_version, 'updated_at', v_updated_at, 'settled', true);
    IF p_idem IS NOT NULL THEN
        INSERT INTO idempotency_records (principal, key, fingerprint, answer)
        VALUES (coalesce(p_principal, ''), p_idem, p_fp, answer);
    END IF;
END
$$;
