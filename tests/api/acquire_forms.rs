//! The two forms of acquire give the same answers and make the same changes. A request alone in
//! its batch runs `lease_acquire_one()` (a function that takes only its branch), batches of
//! several run the batch statement; both carry every rule of acquire, so each state a key can be
//! in is set up, acquired by each form in a transaction that is then rolled back, and the answer
//! and every row it touched (the lease, the watch's changes, the recovery records, the expiry
//! report, the queue, the Idempotency-Key's record) compared. The token sequence is set to one
//! value before each, and the transaction's clock is written as `<now>`, so that what differs
//! between two transactions is not taken for a difference of the forms.

use serde_json::Value;
use sqlx::{Connection, PgConnection, Row};

use crate::harness::TestApp;

/// One acquire, as the statements take it (one element of each array).
#[derive(Clone, Copy)]
struct Request {
    idem: Option<&'static str>,
    principal: Option<&'static str>,
    key_id: Option<i64>,
    metadata: Option<&'static str>,
    crash_recovery: bool,
    reconciled: bool,
    reconciling: bool,
    /// A try by the first waiter the setup queued.
    waiter: bool,
    last_try: bool,
}

const PLAIN: Request = Request {
    idem: None,
    principal: None,
    key_id: None,
    metadata: None,
    crash_recovery: false,
    reconciled: false,
    reconciling: false,
    waiter: false,
    last_try: true,
};

/// A lease of `{key}` (token 100, owner `prev`) that expired a minute ago, unended.
const EXPIRED: &str = "INSERT INTO leases (key, token, owner, ttl_ms, metadata, crash_recovery, \
    acquired_at, expires_at) VALUES ('{key}', 100, 'prev', 1000, '{\"job\": 1}', false, \
    now() - interval '1 minute', now() - interval '59 seconds');";
/// A lease of `{key}` held for another minute.
const HELD: &str = "INSERT INTO leases (key, token, owner, ttl_ms, crash_recovery, acquired_at, \
    expires_at) VALUES ('{key}', 100, 'prev', 60000, false, now(), now() + interval '1 minute');";
/// A waiter of `{key}` queued by a live instance (4242, whose lock the test holds).
const QUEUED: &str = "INSERT INTO lease_waiters (key, instance) VALUES ('{key}', 4242);";
/// The lease of `{key}` ended by its holder a second ago, as `how`.
fn ended(how: &str) -> String {
    format!(
        "{EXPIRED} UPDATE leases SET end_reason = '{how}', ended_at = now() - interval '1 second' \
         WHERE key = '{{key}}';"
    )
}
/// The lease of `{key}` released after a reconciling holder, keeping the record it reconciles.
fn keeping() -> String {
    ended("released")
        + " UPDATE leases SET kept_reason = 'abandoned', kept_owner = 'older', kept_token = 90, \
           kept_acquired_at = now() - interval '1 hour', \
           kept_ended_at = now() - interval '30 minutes', kept_metadata = '{\"k\": true}' \
           WHERE key = '{key}';"
}

/// Each state a key can be in before an acquire (the SQL that makes it, `{key}` standing for
/// the key), with the acquire made of it.
fn cases() -> Vec<(&'static str, String, Request)> {
    let crashed =
        format!("{EXPIRED} UPDATE leases SET crash_recovery = true WHERE key = '{{key}}';");
    vec![
        ("a new key", String::new(), PLAIN),
        (
            "a new key, with metadata, a principal and an Idempotency-Key",
            String::new(),
            Request {
                idem: Some("idem-new"),
                principal: Some("alice"),
                metadata: Some("{\"a\": [1]}"),
                ..PLAIN
            },
        ),
        ("an expired lease, not reported", EXPIRED.into(), PLAIN),
        (
            "an expired lease, reported",
            format!("{EXPIRED} INSERT INTO expiry_reports VALUES ('{{key}}', 100);"),
            PLAIN,
        ),
        (
            "an expired lease, an older one reported",
            format!("{EXPIRED} INSERT INTO expiry_reports VALUES ('{{key}}', 7);"),
            PLAIN,
        ),
        ("a released lease", ended("released"), PLAIN),
        ("a held lease", HELD.into(), PLAIN),
        (
            "a held lease, a waiter's try",
            format!("{HELD} {QUEUED}"),
            Request {
                waiter: true,
                last_try: false,
                ..PLAIN
            },
        ),
        (
            "a held lease, a waiter's last try",
            format!("{HELD} {QUEUED}"),
            Request {
                waiter: true,
                ..PLAIN
            },
        ),
        (
            "a free key with a live waiter",
            format!("{EXPIRED} {QUEUED}"),
            PLAIN,
        ),
        (
            "a free key, its first waiter's try",
            format!("{EXPIRED} {QUEUED}"),
            Request {
                waiter: true,
                last_try: false,
                ..PLAIN
            },
        ),
        ("an abandoned lease", ended("abandoned"), PLAIN),
        (
            "an abandoned lease, reconciled",
            ended("abandoned"),
            Request {
                reconciled: true,
                ..PLAIN
            },
        ),
        (
            "an abandoned lease, reconciling",
            ended("abandoned"),
            Request {
                reconciling: true,
                ..PLAIN
            },
        ),
        ("an expired crash-recovery lease", crashed.clone(), PLAIN),
        (
            "an expired crash-recovery lease, reconciled",
            crashed,
            Request {
                reconciled: true,
                ..PLAIN
            },
        ),
        ("a released lease that keeps a record", keeping(), PLAIN),
        (
            "a released lease that keeps a record, reconciling",
            keeping(),
            Request {
                reconciling: true,
                crash_recovery: true,
                ..PLAIN
            },
        ),
        (
            "a required recovery",
            format!(
                "{} UPDATE leases SET recovery_required = true WHERE key = '{{key}}';",
                ended("released")
            ),
            PLAIN,
        ),
        (
            "an Idempotency-Key with a record",
            "INSERT INTO idempotency_records (principal, key, fingerprint, answer) \
             VALUES ('', 'idem-seen', '\\x01', '{\"verdict\": \"grant\"}');"
                .into(),
            Request {
                idem: Some("idem-seen"),
                ..PLAIN
            },
        ),
        (
            "an Idempotency-Key with a record, a waiter's try",
            format!(
                "{HELD} {QUEUED} INSERT INTO idempotency_records (principal, key, fingerprint, \
                 answer) VALUES ('', 'idem-waited', '\\x01', '{{\"verdict\": \"grant\"}}');"
            ),
            Request {
                idem: Some("idem-waited"),
                waiter: true,
                last_try: false,
                ..PLAIN
            },
        ),
        (
            "a revoked API key",
            "INSERT INTO api_keys (id, name, scope, secret_sha256, revoked_at) OVERRIDING SYSTEM \
             VALUE VALUES (777, 'gone', 'write', sha256('x'), now());"
                .into(),
            Request {
                key_id: Some(777),
                ..PLAIN
            },
        ),
        (
            "a live API key",
            "INSERT INTO api_keys (id, name, scope, secret_sha256) OVERRIDING SYSTEM VALUE \
             VALUES (778, 'live', 'write', sha256('y'));"
                .into(),
            Request {
                key_id: Some(778),
                ..PLAIN
            },
        ),
    ]
}

/// Everything an acquire of `key` may have touched, as JSON.
const EFFECTS: &str = "SELECT json_build_object(
    'lease', (SELECT to_jsonb(l) FROM leases l WHERE l.key = $1),
    'changes', (SELECT coalesce(jsonb_agg(to_jsonb(c) - 'xid' - 'seq' ORDER BY c.seq), '[]')
        FROM change_log c WHERE c.key = $1),
    'recoveries', (SELECT coalesce(jsonb_agg(to_jsonb(r) - 'id' ORDER BY r.id), '[]')
        FROM recoveries r WHERE r.key = $1),
    'expiry', (SELECT to_jsonb(x) FROM expiry_reports x WHERE x.key = $1),
    'queue', (SELECT count(*) FROM lease_waiters w WHERE w.key = $1),
    'records', (SELECT coalesce(jsonb_agg(to_jsonb(r) - 'answer' || jsonb_build_object(
            'answer', r.answer::jsonb - 'i') ORDER BY r.principal), '[]')
        FROM idempotency_records r WHERE r.key = $2))::text,
    to_json(now())::text, to_json(now() + interval '30 seconds')::text";

/// Runs `statement` over the one request `req` of `key`, after `setup`, in a transaction it
/// rolls back; answers its row (gate, answer) and what it changed, with the transaction's clock
/// as `<now>`.
async fn acquire(
    conn: &mut PgConnection,
    statement: &str,
    t0: &str,
    (key, setup, req): (&str, &str, Request),
) -> Value {
    let mut tx = conn.begin().await.unwrap();
    // The setup's times are the test's, so that both forms find the same rows.
    let setup = setup
        .replace("{key}", key)
        .replace("now()", &format!("'{t0}'::timestamptz"));
    sqlx::raw_sql(&setup).execute(&mut *tx).await.unwrap();
    sqlx::query("SELECT setval('fencing_token_seq', 900000)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let waiter: Option<i64> = if req.waiter {
        sqlx::query_scalar("SELECT min(id) FROM lease_waiters WHERE key = $1")
            .bind(key)
            .fetch_one(&mut *tx)
            .await
            .unwrap()
    } else {
        None
    };
    let row = sqlx::query(statement)
        .bind(vec![req.idem])
        .bind(vec![req.idem.map(|_| vec![2u8])])
        .bind(vec![req.principal])
        .bind(vec![req.key_id])
        .bind(vec![key])
        .bind(vec!["next"])
        .bind(vec![30_000_i64])
        .bind(vec![req.metadata])
        .bind(vec![req.crash_recovery])
        .bind(vec![req.reconciled])
        .bind(vec!["request-1"])
        .bind(vec!["127.0.0.1"])
        .bind(vec![req.reconciling])
        .bind(vec![waiter])
        .bind(vec![req.last_try])
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let gate: String = row.get("gate");
    let prior: Option<Vec<u8>> = row.get("prior_fingerprint");
    let answer: Value = row.get("answer");
    let (effects, now, expires): (String, String, String) = sqlx::query_as(EFFECTS)
        .bind(key)
        .bind(req.idem.unwrap_or(""))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut answer = answer;
    if let Some(fields) = answer.as_object_mut() {
        fields.remove("i");
    }
    // A refused gate's answer is not read (only its verdict is); the forms need not agree on it.
    if gate == "revoked" || gate == "in_progress" {
        answer = Value::Null;
    }
    let answer: Value = serde_json::from_str(&answer.to_string()).unwrap();
    let effects: Value = serde_json::from_str(&effects).unwrap();
    let whole =
        serde_json::json!({ "gate": gate, "prior": prior, "answer": answer, "effects": effects });
    let text = whole
        .to_string()
        .replace(now.trim_matches('"'), "<now>")
        .replace(expires.trim_matches('"'), "<now + ttl>");
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn a_lone_acquire_and_a_batched_one_answer_and_change_the_same() {
    let app = TestApp::spawn().await;
    let statements = snapfence::store::hot_statements();
    let text = |name: &str| statements.iter().find(|(n, _)| *n == name).unwrap().1;
    let (batch, one) = (text("acquire"), text("acquire_one"));
    assert_ne!(batch, one);
    let mut instance = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(waiter_lock_class(), 4242)")
        .execute(&mut instance)
        .await
        .unwrap();
    let mut conn = PgConnection::connect_with(&app.options).await.unwrap();
    let t0: String = sqlx::query_scalar("SELECT now()::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let (mut differ, mut seen) = (Vec::new(), std::collections::BTreeSet::new());
    for (n, (name, setup, req)) in cases().into_iter().enumerate() {
        let key = format!("forms/{n}");
        let by_batch = acquire(&mut conn, batch, &t0, (&key, &setup, req)).await;
        let by_one = acquire(&mut conn, one, &t0, (&key, &setup, req)).await;
        let verdict = &by_batch["answer"]["verdict"];
        seen.insert(format!(
            "{}/{}",
            by_batch["gate"].as_str().unwrap(),
            verdict.as_str().unwrap_or("-")
        ));
        if by_batch != by_one {
            let [batch, one] =
                [by_batch, by_one].map(|v| serde_json::to_string_pretty(&v).unwrap());
            differ.push(format!("{name}:\n--- batch\n{batch}\n--- one\n{one}"));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
    // The cases reach every verdict and every answer of the gate.
    let every = [
        "run/insert",
        "run/grant",
        "run/held",
        "run/recovery_required",
        "replay/grant",
    ]
    .into_iter()
    .chain(["revoked/-"]);
    for outcome in every {
        assert!(
            seen.contains(outcome),
            "no case answers {outcome}: {seen:?}"
        );
    }
    conn.close().await.unwrap();
    instance.close().await.unwrap();
    app.stop().await;
}
