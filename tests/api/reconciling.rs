//! Reconciling while holding the key (contract v1.2): `reconciling: true` on acquire keeps a
//! retained recovery record under a live lease, `POST /v1/leases/{key}/reconciled` moves it to
//! the audit log, and every way the lease can end before that leaves the record as it was.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::harness::{TestApp, problem, token};

/// How long a condition that must come about may take at most (a ceiling, never a speed
/// expectation).
const CEILING: Duration = Duration::from_secs(30);

async fn fenced_post(app: &TestApp, key: &str, action: &str, token: i64) -> Response {
    app.request(Method::POST, &format!("/v1/leases/{key}/{action}"))
        .header("Fencing-Token", token.to_string())
        .send()
        .await
        .unwrap()
}

async fn confirm(app: &TestApp, key: &str, token: i64) -> Response {
    fenced_post(app, key, "reconciled", token).await
}

async fn status(app: &TestApp, key: &str) -> Value {
    app.get(&format!("/v1/leases/{key}"))
        .await
        .json()
        .await
        .unwrap()
}

async fn recoveries(app: &TestApp, key: &str) -> Vec<Value> {
    let page: Value = app
        .get(&format!("/v1/audit/recoveries?key={key}"))
        .await
        .json()
        .await
        .unwrap();
    page["items"].as_array().unwrap().clone()
}

/// The recovery rows of `key` with this operation.
async fn audited(app: &TestApp, key: &str, operation: &str) -> Vec<Value> {
    recoveries(app, key)
        .await
        .into_iter()
        .filter(|r| r["operation"] == operation)
        .collect()
}

/// An abandoned lease on `key`: the key keeps a record of reason `abandoned`, returned.
async fn abandoned(app: &TestApp, key: &str) -> Value {
    let g = app
        .acquire_with(
            key,
            json!({"owner": "crasher", "ttl_ms": 30000, "metadata": {"pid": 7}}),
        )
        .await;
    assert_eq!(g.status(), StatusCode::CREATED);
    let t = token(&g.json().await.unwrap());
    assert_eq!(
        fenced_post(app, key, "abandon", t).await.status(),
        StatusCode::NO_CONTENT
    );
    let s = status(app, key).await;
    assert_eq!(s["state"], "recovery_pending");
    s["recovery"].clone()
}

fn reconciling(owner: &str, ttl_ms: i64) -> Value {
    json!({"owner": owner, "ttl_ms": ttl_ms, "reconciling": true})
}

/// A reconciling grant on `key`, which must be granted.
async fn reconcile(app: &TestApp, key: &str, owner: &str, ttl_ms: i64) -> Value {
    let r = app.acquire_with(key, reconciling(owner, ttl_ms)).await;
    assert_eq!(r.status(), StatusCode::CREATED, "reconciling acquire");
    r.json().await.unwrap()
}

async fn expire() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_reconciling_acquire_over_a_record_is_granted_and_keeps_the_record() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    assert!(token(&g) > record["token"].as_i64().unwrap());
    assert_eq!(g["owner"], "fixer");
    assert_eq!(g["recovery"], record);
    assert!(g.get("recovered").is_none());
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "held");
    assert_eq!(s["lease"]["token"], g["token"]);
    assert_eq!(s["recovery"], record);
    app.stop().await;
}

#[tokio::test]
async fn a_reconciling_grant_notes_the_reconciling_holder_in_the_audit_log() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    let rows = recoveries(&app, "k").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(row["operation"], "reconciling");
    assert_eq!(row["recovery"], record);
    assert_eq!(row["reason"], "abandoned");
    assert_eq!(row["reconciled_by"], "fixer");
    assert_eq!(row["holder"], "fixer");
    assert_eq!(row["highest_token"], g["token"]);
    assert_eq!(row["presented_token"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn others_are_refused_lease_held_naming_the_reconciling_holder() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    for body in [
        json!({"owner": "plain", "ttl_ms": 30000}),
        json!({"owner": "other", "ttl_ms": 30000, "reconciled": true}),
        reconciling("rival", 30000),
    ] {
        let r = app.acquire_with("k", body.clone()).await;
        let p = problem(r, StatusCode::CONFLICT, "lease_held").await;
        assert_eq!(p["holder"]["owner"], "fixer", "{body}");
        assert_eq!(p["holder"]["expires_at"], g["expires_at"]);
    }
    let s = status(&app, "k").await;
    assert_eq!(s["lease"]["token"], g["token"]);
    assert_eq!(s["recovery"], record);
    assert_eq!(recoveries(&app, "k").await.len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn others_are_refused_while_reconciling_through_another_instance() {
    let app = TestApp::spawn().await;
    let other = app.another_instance().await;
    abandoned(&app, "k").await;
    reconcile(&app, "k", "fixer", 30000).await;
    for body in [
        json!({"owner": "plain", "ttl_ms": 30000}),
        reconciling("rival", 30000),
    ] {
        let r = app
            .request_to(&other, Method::POST, "/v1/leases/k")
            .json(&body)
            .send()
            .await
            .unwrap();
        let p = problem(r, StatusCode::CONFLICT, "lease_held").await;
        assert_eq!(p["holder"]["owner"], "fixer");
    }
    other.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn concurrent_reconciling_acquires_grant_exactly_one() {
    let app = TestApp::spawn().await;
    let other = app.another_instance().await;
    let record = abandoned(&app, "k").await;
    let mut calls = Vec::new();
    for i in 0..8 {
        let base = if i % 2 == 0 {
            app.instance.base.clone()
        } else {
            other.base.clone()
        };
        let http = app.http.clone();
        calls.push(tokio::spawn(async move {
            http.post(format!("{base}/v1/leases/k"))
                .json(&reconciling(&format!("r{i}"), 30000))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    let mut granted = 0;
    for call in calls {
        match call.await.unwrap() {
            StatusCode::CREATED => granted += 1,
            StatusCode::CONFLICT => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(granted, 1);
    assert_eq!(status(&app, "k").await["recovery"], record);
    assert_eq!(audited(&app, "k", "reconciling").await.len(), 1);
    other.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_reconciling_lease_writes_fenced_as_usual() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    let old = record["token"].as_i64().unwrap();
    problem(
        app.put("k", old, "late").await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(
        app.put("k", token(&g), "fixed").await.status(),
        StatusCode::CREATED
    );
    app.stop().await;
}

#[tokio::test]
async fn reconciled_moves_the_record_to_the_audit_log_and_the_lease_goes_on() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    let r = app
        .request(Method::POST, "/v1/leases/k/reconciled")
        .header("Fencing-Token", token(&g).to_string())
        .header("x-request-id", "confirm-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let lease: Value = r.json().await.unwrap();
    for field in [
        "key",
        "owner",
        "token",
        "acquired_at",
        "expires_at",
        "ttl_ms",
    ] {
        assert_eq!(lease[field], g[field], "{field}");
    }
    assert!(lease.get("recovery").is_none());
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "held");
    assert_eq!(s["recovery"], Value::Null);
    let rows = audited(&app, "k", "reconciled").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["recovery"], record);
    assert_eq!(rows[0]["reconciled_by"], "fixer");
    assert_eq!(rows[0]["presented_token"], g["token"]);
    assert_eq!(rows[0]["highest_token"], g["token"]);
    assert_eq!(rows[0]["request_id"], "confirm-1");
    // The lease goes on: renewable, and its release frees the key.
    let renew = app
        .request(Method::POST, "/v1/leases/k/renew")
        .json(&json!({"token": token(&g)}))
        .send()
        .await
        .unwrap();
    assert_eq!(renew.status(), StatusCode::OK);
    assert_eq!(
        app.release("k", token(&g)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(status(&app, "k").await["state"], "released");
    app.acquire("k", "next", 30000).await;
    app.stop().await;
}

#[tokio::test]
async fn the_confirmation_is_audited_once() {
    let app = TestApp::spawn().await;
    abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    for _ in 0..3 {
        let r = confirm(&app, "k", token(&g)).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    assert_eq!(audited(&app, "k", "reconciled").await.len(), 1);
    assert_eq!(
        recoveries(&app, "k").await.len(),
        2,
        "reconciling + reconciled"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_release_before_the_confirmation_leaves_the_record_exactly_as_it_was() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    assert_eq!(
        app.release("k", token(&g)).await.status(),
        StatusCode::NO_CONTENT
    );
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "recovery_pending");
    assert_eq!(s["recovery"], record);
    assert_eq!(s["lease"]["token"], g["token"]);
    let r = app
        .acquire_with("k", json!({"owner": "plain", "ttl_ms": 30000}))
        .await;
    let p = problem(r, StatusCode::CONFLICT, "recovery_required").await;
    assert_eq!(p["recovery"], record);
    assert!(audited(&app, "k", "reconciled").await.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn an_abandon_before_the_confirmation_leaves_the_record_exactly_as_it_was() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    assert_eq!(
        fenced_post(&app, "k", "abandon", token(&g)).await.status(),
        StatusCode::NO_CONTENT
    );
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "recovery_pending");
    assert_eq!(s["recovery"], record);
    app.stop().await;
}

#[tokio::test]
async fn an_expiry_before_the_confirmation_leaves_the_record_exactly_as_it_was() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    // A crash_recovery lease of its own, marked too: its expiry still leaves the one record.
    let r = app
        .acquire_with(
            "k",
            json!({"owner": "fixer", "ttl_ms": 30000, "reconciling": true, "crash_recovery": true}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let g: Value = r.json().await.unwrap();
    fenced_post(&app, "k", "require-recovery", token(&g)).await;
    // Shortened to expire only once marked, so that the mark finds it live on a loaded machine.
    let renew = app
        .request(Method::POST, "/v1/leases/k/renew")
        .json(&json!({"token": token(&g), "ttl_ms": 150}))
        .send()
        .await
        .unwrap();
    assert_eq!(renew.status(), StatusCode::OK);
    expire().await;
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "recovery_pending");
    assert_eq!(s["recovery"], record);
    app.stop().await;
}

#[tokio::test]
async fn reconciled_after_the_lease_expired_is_lease_lost_and_the_record_stays() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 150).await;
    expire().await;
    problem(
        confirm(&app, "k", token(&g)).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    assert_eq!(status(&app, "k").await["recovery"], record);
    assert!(audited(&app, "k", "reconciled").await.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn reconciled_with_a_stale_token_is_lease_lost_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    for stale in [record["token"].as_i64().unwrap(), token(&g) + 1] {
        problem(
            confirm(&app, "k", stale).await,
            StatusCode::CONFLICT,
            "lease_lost",
        )
        .await;
    }
    let r = app
        .request(Method::POST, "/v1/leases/k/reconciled")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::PRECONDITION_REQUIRED, "token_required").await;
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "held");
    assert_eq!(s["recovery"], record);
    assert!(audited(&app, "k", "reconciled").await.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn reconciled_by_a_released_reconciler_is_lease_lost() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    app.release("k", token(&g)).await;
    problem(
        confirm(&app, "k", token(&g)).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    assert_eq!(status(&app, "k").await["recovery"], record);
    app.stop().await;
}

#[tokio::test]
async fn a_second_reconciler_after_a_failed_one_keeps_and_confirms_the_same_record() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let first = reconcile(&app, "k", "fixer-1", 30000).await;
    app.release("k", token(&first)).await;
    let second = reconcile(&app, "k", "fixer-2", 30000).await;
    assert_eq!(second["recovery"], record);
    assert_eq!(
        confirm(&app, "k", token(&second)).await.status(),
        StatusCode::OK
    );
    let rows = audited(&app, "k", "reconciled").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["recovery"], record);
    assert_eq!(rows[0]["reconciled_by"], "fixer-2");
    let attempts = audited(&app, "k", "reconciling").await;
    let by: Vec<&Value> = attempts.iter().map(|r| &r["reconciled_by"]).collect();
    assert_eq!(by, [&json!("fixer-2"), &json!("fixer-1")]);
    assert_eq!(status(&app, "k").await["recovery"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn a_reconciled_acquire_after_a_failed_reconciler_replaces_the_original_record() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let first = reconcile(&app, "k", "fixer", 30000).await;
    fenced_post(&app, "k", "abandon", token(&first)).await;
    let r = app
        .acquire_with(
            "k",
            json!({"owner": "cleaner", "ttl_ms": 30000, "reconciled": true}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let g: Value = r.json().await.unwrap();
    assert_eq!(g["recovered"], record);
    let rows = audited(&app, "k", "reconcile").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["recovery"], record);
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "held");
    assert_eq!(s["recovery"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn reconciling_on_a_key_without_a_record_is_a_plain_grant() {
    let app = TestApp::spawn().await;
    let g = reconcile(&app, "k", "a", 30000).await;
    assert!(g.get("recovery").is_none());
    assert!(g.get("recovered").is_none());
    // Confirming then has nothing to move: the lease is answered as it is.
    assert_eq!(confirm(&app, "k", token(&g)).await.status(), StatusCode::OK);
    assert!(recoveries(&app, "k").await.is_empty());
    assert_eq!(
        app.release("k", token(&g)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(status(&app, "k").await["state"], "released");
    app.stop().await;
}

#[tokio::test]
async fn reconciled_and_reconciling_together_are_refused() {
    let app = TestApp::spawn().await;
    abandoned(&app, "k").await;
    let r = app
        .acquire_with(
            "k",
            json!({"owner": "a", "ttl_ms": 30000, "reconciled": true, "reconciling": true}),
        )
        .await;
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert_eq!(status(&app, "k").await["state"], "recovery_pending");
    app.stop().await;
}

#[tokio::test]
async fn an_idempotency_key_replays_a_reconciling_grant() {
    let app = TestApp::spawn().await;
    abandoned(&app, "k").await;
    let send = || {
        app.request(Method::POST, "/v1/leases/k")
            .header("Idempotency-Key", "grant-1")
            .json(&reconciling("fixer", 30000))
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    let again = send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(audited(&app, "k", "reconciling").await.len(), 1);
    assert_eq!(status(&app, "k").await["lease"]["token"], first["token"]);
    app.stop().await;
}

#[tokio::test]
async fn an_idempotency_key_replays_a_confirmation() {
    let app = TestApp::spawn().await;
    abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    let send = |t: i64| {
        app.request(Method::POST, "/v1/leases/k/reconciled")
            .header("Idempotency-Key", "confirm-1")
            .header("Fencing-Token", t.to_string())
            .send()
    };
    let first = send(token(&g)).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let first: Value = first.json().await.unwrap();
    let again = send(token(&g)).await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    assert_eq!(audited(&app, "k", "reconciled").await.len(), 1);
    problem(
        send(token(&g) + 1).await.unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_refused_confirmation_is_replayed_as_lease_lost() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    let send = || {
        app.request(Method::POST, "/v1/leases/k/reconciled")
            .header("Idempotency-Key", "confirm-stale")
            .header("Fencing-Token", (token(&g) + 1).to_string())
            .send()
    };
    problem(send().await.unwrap(), StatusCode::CONFLICT, "lease_lost").await;
    let again = send().await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    problem(again, StatusCode::CONFLICT, "lease_lost").await;
    assert_eq!(status(&app, "k").await["recovery"], record);
    app.stop().await;
}

#[tokio::test]
async fn a_waiting_reconciling_acquire_gets_the_record_when_the_reconciler_gives_up() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let first = reconcile(&app, "k", "fixer-1", 30000).await;
    let waiter = {
        let http = app.http.clone();
        let base = app.instance.base.clone();
        tokio::spawn(async move {
            http.post(format!("{base}/v1/leases/k"))
                .json(
                    &json!({"owner": "fixer-2", "ttl_ms": 30000, "reconciling": true,
                    "wait_ms": 30000}),
                )
                .send()
                .await
                .unwrap()
        })
    };
    // The waiter is queued once the key's queue has a row.
    let deadline = Instant::now() + CEILING;
    loop {
        let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_waiters WHERE key = 'k'")
            .fetch_one(app.db())
            .await
            .unwrap();
        if queued == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.release("k", token(&first)).await;
    let r = tokio::time::timeout(CEILING, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let g: Value = r.json().await.unwrap();
    assert_eq!(g["owner"], "fixer-2");
    assert_eq!(g["recovery"], record);
    app.stop().await;
}

#[tokio::test]
async fn a_waiting_plain_acquire_is_told_recovery_required_when_the_reconciler_gives_up() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "k").await;
    let first = reconcile(&app, "k", "fixer", 30000).await;
    let waiter = {
        let http = app.http.clone();
        let base = app.instance.base.clone();
        tokio::spawn(async move {
            http.post(format!("{base}/v1/leases/k"))
                .json(&json!({"owner": "plain", "ttl_ms": 30000, "wait_ms": 30000}))
                .send()
                .await
                .unwrap()
        })
    };
    let deadline = Instant::now() + CEILING;
    loop {
        let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_waiters WHERE key = 'k'")
            .fetch_one(app.db())
            .await
            .unwrap();
        if queued == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.release("k", token(&first)).await;
    let r = tokio::time::timeout(CEILING, waiter)
        .await
        .unwrap()
        .unwrap();
    let p = problem(r, StatusCode::CONFLICT, "recovery_required").await;
    assert_eq!(p["recovery"], record);
    app.stop().await;
}

#[tokio::test]
async fn the_list_and_the_gauge_count_a_key_left_by_its_reconciler_as_recovery_pending() {
    let app = TestApp::spawn().await;
    abandoned(&app, "k").await;
    let g = reconcile(&app, "k", "fixer", 30000).await;
    let held: Value = app.get("/v1/leases?state=held").await.json().await.unwrap();
    assert_eq!(held["items"][0]["key"], "k");
    app.release("k", token(&g)).await;
    let pending: Value = app
        .get("/v1/leases?state=recovery_pending")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(pending["items"][0]["key"], "k");
    assert_eq!(pending["items"].as_array().unwrap().len(), 1);
    let open: i64 = sqlx::query_scalar(include_str!(
        "../../src/store/leases/sql/recovery_pending.sql"
    ))
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(open, 1);
    app.stop().await;
}

/// The events of `GET /v1/watch?prefix={prefix}&since=0`, read until `n` came.
async fn watched(app: &TestApp, prefix: &str, n: usize) -> Vec<(String, Value)> {
    let r = app.get(&format!("/v1/watch?prefix={prefix}&since=0")).await;
    assert_eq!(r.status(), StatusCode::OK);
    let mut body = r.bytes_stream();
    let mut buffer = String::new();
    let mut events = Vec::new();
    let deadline = Instant::now() + CEILING;
    while events.len() < n {
        if let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut event, mut data) = (None, None);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data = Some(serde_json::from_str::<Value>(v.trim()).unwrap());
                }
            }
            if let (Some(event), Some(data)) = (event, data) {
                events.push((event, data));
            }
            continue;
        }
        let chunk = tokio::time::timeout_at(deadline, body.next())
            .await
            .unwrap_or_else(|_| panic!("only {events:?} within the ceiling"));
        buffer.push_str(std::str::from_utf8(&chunk.unwrap().unwrap()).unwrap());
    }
    events
}

fn kinds(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(e, _)| e.as_str()).collect()
}

#[tokio::test]
async fn the_watch_sends_lease_reconciled_at_the_confirmation_not_at_the_grant() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "w").await;
    let g = reconcile(&app, "w", "fixer", 30000).await;
    assert_eq!(confirm(&app, "w", token(&g)).await.status(), StatusCode::OK);
    app.release("w", token(&g)).await;
    let events = watched(&app, "w", 5).await;
    assert_eq!(
        kinds(&events),
        [
            "lease.granted",
            "lease.abandoned",
            "lease.granted",
            "lease.reconciled",
            "lease.released"
        ]
    );
    let (_, granted) = &events[2];
    assert_eq!(granted["token"], g["token"]);
    assert_eq!(granted["owner"], "fixer");
    let (_, reconciled) = &events[3];
    assert_eq!(reconciled["token"], g["token"]);
    assert_eq!(reconciled["owner"], "fixer");
    assert_eq!(reconciled["reason"], "abandoned");
    assert_eq!(reconciled["record_token"], record["token"]);
    app.stop().await;
}

#[tokio::test]
async fn the_watch_sends_no_lease_reconciled_when_the_reconciler_gives_up() {
    let app = TestApp::spawn().await;
    let record = abandoned(&app, "w").await;
    let first = reconcile(&app, "w", "fixer-1", 30000).await;
    app.release("w", token(&first)).await;
    // A `reconciled: true` grant then replaces the record the first reconciler kept.
    let r = app
        .acquire_with(
            "w",
            json!({"owner": "cleaner", "ttl_ms": 30000, "reconciled": true}),
        )
        .await;
    let g: Value = r.json().await.unwrap();
    let events = watched(&app, "w", 6).await;
    assert_eq!(
        kinds(&events),
        [
            "lease.granted",
            "lease.abandoned",
            "lease.granted",
            "lease.released",
            "lease.reconciled",
            "lease.granted"
        ]
    );
    let (_, reconciled) = &events[4];
    assert_eq!(reconciled["token"], g["token"]);
    assert_eq!(reconciled["record_token"], record["token"]);
    assert_eq!(reconciled["reason"], "abandoned");
    app.stop().await;
}
