//! The two forms of each hot call give the same answers and make the same changes. A request
//! alone in its batch runs a function that takes only its branch (`lease_acquire_one()`,
//! `snapshot_put_one()`), batches of several run the batch statement; both carry every rule of
//! the call, so each state a key can be in is set up, the call made by each form in a
//! transaction that is then rolled back, and the answer and every row it touched compared. The
//! token sequence is set to one value before each, the setup's clock is the test's, and the
//! transaction's own clock is written as `<now>`, so that what differs between two transactions
//! is not taken for a difference of the forms.

use serde_json::Value;
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{Connection, PgConnection, Postgres, Row};

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
    /// A try by the waiter the setup queued.
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
/// A waiter of `{key}` (id 5000) queued by a live instance (4242, whose lock the test holds).
const QUEUED: &str = "INSERT INTO lease_waiters (id, key, instance) OVERRIDING SYSTEM VALUE VALUES (5000, '{key}', 4242);";
/// API key 777, revoked.
const REVOKED: &str = "INSERT INTO api_keys (id, name, scope, secret_sha256, revoked_at) \
    OVERRIDING SYSTEM VALUE VALUES (777, 'gone', 'write', sha256('x'), now());";
/// A record of Idempotency-Key `idem` (no principal) that answered `answer`.
fn recorded(idem: &str, answer: &str) -> String {
    format!(
        "INSERT INTO idempotency_records (principal, key, fingerprint, answer) \
         VALUES ('', '{idem}', '\\x01', '{answer}');"
    )
}
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
            recorded("idem-seen", r#"{"verdict": "grant"}"#),
            Request {
                idem: Some("idem-seen"),
                ..PLAIN
            },
        ),
        (
            "an Idempotency-Key with a record, a waiter's try",
            format!(
                "{HELD} {QUEUED} {}",
                recorded("idem-waited", r#"{"verdict": "grant"}"#)
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
            REVOKED.into(),
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

/// Everything an acquire of `$1` (with Idempotency-Key `$2`) may have touched, as JSON.
const ACQUIRE_EFFECTS: &str = "SELECT json_build_object(
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
    to_json(now())::text, to_json(now() + interval '30 seconds')::text, NULL::bigint";

/// Everything a write to `$1` (with Idempotency-Key `$2`) may have touched, as JSON; the audit
/// row's id (drawn from a sequence, so not the same in two transactions) is the fourth column.
const PUT_EFFECTS: &str = "SELECT json_build_object(
    'lease', (SELECT to_jsonb(l) FROM leases l WHERE l.key = $1),
    'versions', (SELECT coalesce(jsonb_agg(to_jsonb(v) - 'body' || jsonb_build_object(
            'body', md5(v.body)) ORDER BY v.version), '[]')
        FROM snapshot_versions v WHERE v.key = $1),
    'refusals', (SELECT coalesce(jsonb_agg(to_jsonb(r) - 'id' ORDER BY r.id), '[]')
        FROM rejections r WHERE r.key = $1),
    'changes', (SELECT coalesce(jsonb_agg(to_jsonb(c) - 'xid' - 'seq' - 'audit_id'
            || jsonb_build_object('audit_id', c.audit_id = (SELECT max(id) FROM rejections x
                WHERE x.key = $1)) ORDER BY c.seq), '[]')
        FROM change_log c WHERE c.key = $1),
    'records', (SELECT coalesce(jsonb_agg(to_jsonb(r) - 'answer' || jsonb_build_object(
            'answer', r.answer::jsonb - 'i' - 'audit_id') ORDER BY r.principal), '[]')
        FROM idempotency_records r WHERE r.key = $2))::text,
    to_json(now())::text, to_json(now() + interval '30 seconds')::text,
    (SELECT max(id) FROM rejections WHERE key = $1)";

/// Runs `call` (a statement over one request of `key`) after `setup`, in a transaction it rolls
/// back; answers its row (gate, answer) and what `effects` finds it changed, with the
/// transaction's clock as `<now>`.
async fn run(
    conn: &mut PgConnection,
    t0: &str,
    (key, setup, idem): (&str, &str, Option<&str>),
    call: Query<'_, Postgres, PgArguments>,
    effects: &str,
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
    let row = call.fetch_one(&mut *tx).await.unwrap();
    let gate: String = row.get("gate");
    let prior: Option<Vec<u8>> = row.get("prior_fingerprint");
    let mut answer: Value = row.get("answer");
    let (effects, now, expires, audit_id): (String, String, String, Option<i64>) =
        sqlx::query_as(effects)
            .bind(key)
            .bind(idem.unwrap_or(""))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    tx.rollback().await.unwrap();
    if let Some(fields) = answer.as_object_mut() {
        fields.remove("i");
        // An audit row's id: whether it is the refusal's row.
        if let Some(id) = fields.get_mut("audit_id").filter(|id| !id.is_null()) {
            *id = Value::Bool(id.as_i64() == audit_id);
        }
    }
    // A refused gate's answer is not read (only its verdict is); the forms need not agree on it.
    if gate == "revoked" || gate == "in_progress" {
        answer = Value::Null;
    }
    let effects: Value = serde_json::from_str(&effects).unwrap();
    let whole =
        serde_json::json!({ "gate": gate, "prior": prior, "answer": answer, "effects": effects });
    let text = whole
        .to_string()
        .replace(now.trim_matches('"'), "<now>")
        .replace(expires.trim_matches('"'), "<now + ttl>");
    serde_json::from_str(&text).unwrap()
}

/// `req` of `key` bound as the acquire statements take it.
fn acquire<'q>(statement: &'q str, key: &'q str, req: Request) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(statement)
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
        .bind(vec![req.waiter.then_some(5000_i64)])
        .bind(vec![req.last_try])
}

/// The statements named `name` and `name_one`, as the service runs them.
fn forms(name: &str) -> (&'static str, &'static str) {
    let statements = snapfence::store::hot_statements();
    let text = |name: &str| statements.iter().find(|(n, _)| *n == name).unwrap().1;
    let (batch, one) = (text(name), text(&format!("{name}_one")));
    assert_ne!(batch, one);
    (batch, one)
}

/// How a case's request is bound to a statement of its call.
type Bind<R> = for<'q> fn(&'q str, &'q str, R) -> Query<'q, Postgres, PgArguments>;

/// Runs each case by both forms, asserts they agree, and answers the gate and verdict (or
/// outcome) of each, for the caller to check that the cases reach every one.
async fn compare<R: Copy>(
    app: &TestApp,
    name: &str,
    cases: Vec<(&'static str, String, R)>,
    idem: fn(&R) -> Option<&'static str>,
    bind: Bind<R>,
    effects: &str,
) -> std::collections::BTreeSet<String> {
    let (batch, one) = forms(name);
    let mut conn = PgConnection::connect_with(&app.options).await.unwrap();
    let t0: String = sqlx::query_scalar("SELECT now()::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let (mut differ, mut seen) = (Vec::new(), std::collections::BTreeSet::new());
    for (n, (case, setup, req)) in cases.into_iter().enumerate() {
        let key = format!("forms/{name}/{n}");
        let at = (key.as_str(), setup.as_str(), idem(&req));
        let by_batch = run(&mut conn, &t0, at, bind(batch, &key, req), effects).await;
        let by_one = run(&mut conn, &t0, at, bind(one, &key, req), effects).await;
        let answer = &by_batch["answer"];
        let verdict = answer.get("verdict").or(answer.get("outcome"));
        seen.insert(format!(
            "{}/{}",
            by_batch["gate"].as_str().unwrap(),
            verdict.and_then(Value::as_str).unwrap_or("-")
        ));
        if by_batch != by_one {
            let [batch, one] =
                [by_batch, by_one].map(|v| serde_json::to_string_pretty(&v).unwrap());
            differ.push(format!("{case}:\n--- batch\n{batch}\n--- one\n{one}"));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
    conn.close().await.unwrap();
    seen
}

#[tokio::test]
async fn a_lone_acquire_and_a_batched_one_answer_and_change_the_same() {
    let app = TestApp::spawn().await;
    let mut instance = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(waiter_lock_class(), 4242)")
        .execute(&mut instance)
        .await
        .unwrap();
    let seen = compare(
        &app,
        "acquire",
        cases(),
        |r| r.idem,
        acquire,
        ACQUIRE_EFFECTS,
    )
    .await;
    let every = [
        "run/insert",
        "run/grant",
        "run/held",
        "run/recovery_required",
        "replay/grant",
    ];
    for outcome in every.into_iter().chain(["revoked/-"]) {
        assert!(
            seen.contains(outcome),
            "no case answers {outcome}: {seen:?}"
        );
    }
    instance.close().await.unwrap();
    app.stop().await;
}

/// One fenced write, as the put statements take it (one element of each array).
#[derive(Clone, Copy)]
struct Write {
    idem: Option<&'static str>,
    key_id: Option<i64>,
    token: i64,
    /// If-Match: `Some(None)` for `*`, `Some(Some(tags))` for a JSON array of strong tags.
    if_match: Option<Option<&'static str>>,
    keep: i64,
}

const WRITE: Write = Write {
    idem: None,
    key_id: None,
    token: 100,
    if_match: None,
    keep: 2,
};

/// `w` of `key` bound as the put statements take it.
fn put<'q>(statement: &'q str, key: &'q str, w: Write) -> Query<'q, Postgres, PgArguments> {
    sqlx::query(statement)
        .bind(vec![w.idem])
        .bind(vec![w.idem.map(|_| vec![2u8])])
        .bind(vec![None::<&str>])
        .bind(vec![w.key_id])
        .bind(vec![key])
        .bind(vec![w.token])
        .bind(vec![w.if_match.is_some()])
        .bind(vec![w.if_match.flatten()])
        .bind(vec!["request-1"])
        .bind(vec!["127.0.0.1"])
        .bind(vec!["put"])
        .bind(vec!["etag-new"])
        .bind(vec![3_i64])
        .bind(vec!["text/plain"])
        .bind(vec![b"new".to_vec()])
        .bind(vec![w.keep])
}

/// Each state a key can be in before a fenced write, with the write made of it.
fn writes() -> Vec<(&'static str, String, Write)> {
    let written = format!(
        "{HELD} UPDATE leases SET snapshot_version = 3, snapshot_etag = 'etag-3' WHERE key = '{{key}}'; \
         INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body) \
         SELECT '{{key}}', v, 100, 'etag-' || v, 1, 'text/plain', now(), 'x' FROM generate_series(1, 3) v;"
    );
    vec![
        ("a first write", HELD.into(), WRITE),
        ("a write that prunes", written.clone(), WRITE),
        (
            "a write with an Idempotency-Key",
            written.clone(),
            Write {
                idem: Some("idem-put"),
                ..WRITE
            },
        ),
        (
            "a stale token",
            written.clone(),
            Write { token: 99, ..WRITE },
        ),
        (
            "a token never granted",
            written.clone(),
            Write {
                token: 101,
                ..WRITE
            },
        ),
        ("a key never leased", String::new(), WRITE),
        ("a released lease", ended("released"), WRITE),
        (
            "If-Match, matching",
            written.clone(),
            Write {
                if_match: Some(Some("[\"etag-1\", \"etag-3\"]")),
                ..WRITE
            },
        ),
        (
            "If-Match, not matching",
            written.clone(),
            Write {
                if_match: Some(Some("[\"etag-2\"]")),
                ..WRITE
            },
        ),
        (
            "If-Match: * with a snapshot",
            written.clone(),
            Write {
                if_match: Some(None),
                ..WRITE
            },
        ),
        (
            "If-Match: * without one",
            HELD.into(),
            Write {
                if_match: Some(None),
                ..WRITE
            },
        ),
        (
            "an Idempotency-Key with a record",
            recorded("idem-put-seen", r#"{"outcome": "accepted"}"#),
            Write {
                idem: Some("idem-put-seen"),
                ..WRITE
            },
        ),
        (
            "a revoked API key",
            REVOKED.into(),
            Write {
                key_id: Some(777),
                ..WRITE
            },
        ),
    ]
}

#[tokio::test]
async fn a_lone_write_and_a_batched_one_answer_and_change_the_same() {
    let app = TestApp::spawn().await;
    let seen = compare(&app, "put", writes(), |w| w.idem, put, PUT_EFFECTS).await;
    let every = [
        "accepted",
        "stale_token",
        "unknown_token",
        "precondition_failed",
    ];
    for outcome in every
        .map(|o| format!("run/{o}"))
        .into_iter()
        .chain(["replay/accepted".into(), "revoked/-".into()])
    {
        assert!(
            seen.contains(&outcome),
            "no case answers {outcome}: {seen:?}"
        );
    }
    app.stop().await;
}
