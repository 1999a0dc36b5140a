//! Recovery records: each way one appears or is kept, reconciliation, and the reconcile race.

use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, problem, token};

async fn fenced_post(app: &TestApp, key: &str, action: &str, token: i64) -> Response {
    app.request(Method::POST, &format!("/v1/leases/{key}/{action}"))
        .header("Fencing-Token", token.to_string())
        .send()
        .await
        .unwrap()
}

async fn status(app: &TestApp, key: &str) -> Value {
    app.get(&format!("/v1/leases/{key}"))
        .await
        .json()
        .await
        .unwrap()
}

async fn crash_recovery_lease(app: &TestApp, key: &str, ttl_ms: i64) -> Value {
    let r = app
        .acquire_with(
            key,
            json!({"owner": "crasher", "ttl_ms": ttl_ms, "crash_recovery": true, "metadata": {"pid": 7}}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let g: Value = r.json().await.unwrap();
    assert_eq!(g["crash_recovery"], true);
    g
}

async fn expire() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_crash_recovery_lease_that_expires_keeps_a_record_of_reason_expired() {
    let app = TestApp::spawn().await;
    let g = crash_recovery_lease(&app, "k", 150).await;
    expire().await;
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "recovery_pending");
    let rec = &s["recovery"];
    assert_eq!(rec["reason"], "expired");
    assert_eq!(rec["owner"], "crasher");
    assert_eq!(rec["token"], g["token"]);
    assert_eq!(rec["acquired_at"], g["acquired_at"]);
    assert_eq!(rec["ended_at"], g["expires_at"]);
    assert_eq!(rec["metadata"], json!({"pid": 7}));
    app.stop().await;
}

#[tokio::test]
async fn a_plain_lease_that_expires_keeps_no_record() {
    let app = TestApp::spawn().await;
    app.acquire("k", "a", 150).await;
    expire().await;
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "expired");
    assert_eq!(s["recovery"], Value::Null);
    app.acquire("k", "b", 30000).await;
    app.stop().await;
}

#[tokio::test]
async fn a_released_crash_recovery_lease_keeps_no_record() {
    let app = TestApp::spawn().await;
    let g = crash_recovery_lease(&app, "k", 30000).await;
    assert_eq!(
        app.release("k", token(&g)).await.status(),
        StatusCode::NO_CONTENT
    );
    assert_eq!(status(&app, "k").await["state"], "released");
    app.acquire("k", "b", 30000).await;
    app.stop().await;
}

#[tokio::test]
async fn abandon_unlocks_at_once_but_keeps_a_record_of_reason_abandoned() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    assert_eq!(
        fenced_post(&app, "k", "abandon", t).await.status(),
        StatusCode::NO_CONTENT
    );
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "recovery_pending");
    assert_eq!(s["recovery"]["reason"], "abandoned");
    let r = app
        .acquire_with("k", json!({"owner": "b", "ttl_ms": 30000}))
        .await;
    let body = problem(r, StatusCode::CONFLICT, "recovery_required").await;
    assert_eq!(body["recovery"], s["recovery"]);
    app.stop().await;
}

#[tokio::test]
async fn a_write_with_the_old_token_after_abandon_is_refused_as_stale() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    app.put("k", t, "before").await;
    fenced_post(&app, "k", "abandon", t).await;
    problem(
        app.put("k", t, "after").await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(
        app.get("/v1/snapshots/k").await.text().await.unwrap(),
        "before"
    );
    app.stop().await;
}

#[tokio::test]
async fn require_recovery_keeps_the_lease_live_renewable_and_writable() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let r = fenced_post(&app, "k", "require-recovery", t).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "held");
    assert_eq!(s["recovery"], Value::Null);
    assert_eq!(s["lease"]["recovery_required"], true);
    let renew = app
        .request(Method::POST, "/v1/leases/k/renew")
        .json(&json!({"token": t}))
        .send()
        .await
        .unwrap();
    assert_eq!(renew.status(), StatusCode::OK);
    assert_eq!(
        app.put("k", t, "still mine").await.status(),
        StatusCode::CREATED
    );
    app.stop().await;
}

#[tokio::test]
async fn require_recovery_then_release_keeps_a_record() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    fenced_post(&app, "k", "require-recovery", t).await;
    assert_eq!(app.release("k", t).await.status(), StatusCode::NO_CONTENT);
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "recovery_pending");
    assert_eq!(s["recovery"]["reason"], "recovery_required");
    let r = app
        .acquire_with("k", json!({"owner": "b", "ttl_ms": 30000}))
        .await;
    problem(r, StatusCode::CONFLICT, "recovery_required").await;
    app.stop().await;
}

#[tokio::test]
async fn require_recovery_then_expiry_keeps_a_record() {
    let app = TestApp::spawn().await;
    let g = app.acquire("k", "a", 30000).await;
    fenced_post(&app, "k", "require-recovery", token(&g)).await;
    // Shortened to expire only once marked, so that the mark finds it live on a loaded machine.
    let renewed: Value = app
        .request(Method::POST, "/v1/leases/k/renew")
        .json(&json!({"token": token(&g), "ttl_ms": 150}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    expire().await;
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "recovery_pending");
    assert_eq!(s["recovery"]["reason"], "recovery_required");
    assert_eq!(s["recovery"]["ended_at"], renewed["expires_at"]);
    app.stop().await;
}

#[tokio::test]
async fn release_after_abandon_is_lease_lost_and_the_record_stays() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    fenced_post(&app, "k", "abandon", t).await;
    problem(
        app.release("k", t).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    assert_eq!(status(&app, "k").await["recovery"]["reason"], "abandoned");
    app.stop().await;
}

#[tokio::test]
async fn abandon_and_require_recovery_need_the_live_token() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    for action in ["abandon", "require-recovery"] {
        problem(
            fenced_post(&app, "k", action, t + 1).await,
            StatusCode::CONFLICT,
            "lease_lost",
        )
        .await;
        let r = app
            .request(Method::POST, &format!("/v1/leases/k/{action}"))
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::PRECONDITION_REQUIRED, "token_required").await;
    }
    assert_eq!(status(&app, "k").await["state"], "held");
    app.stop().await;
}

#[tokio::test]
async fn a_refused_acquire_leaves_the_record_untouched() {
    let app = TestApp::spawn().await;
    crash_recovery_lease(&app, "k", 150).await;
    expire().await;
    let before = status(&app, "k").await;
    for _ in 0..3 {
        let r = app
            .acquire_with("k", json!({"owner": "b", "ttl_ms": 30000}))
            .await;
        let body = problem(r, StatusCode::CONFLICT, "recovery_required").await;
        assert_eq!(body["recovery"], before["recovery"]);
    }
    assert_eq!(status(&app, "k").await, before);
    app.stop().await;
}

#[tokio::test]
async fn a_reconciled_acquire_replaces_the_record_and_writes_it_to_the_audit_log() {
    let app = TestApp::spawn().await;
    let old = crash_recovery_lease(&app, "k", 150).await;
    expire().await;
    let record = status(&app, "k").await["recovery"].clone();
    let r = app
        .request(Method::POST, "/v1/leases/k")
        .header("x-request-id", "reconcile-1")
        .json(&json!({"owner": "fixer", "ttl_ms": 30000, "reconciled": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let g: Value = r.json().await.unwrap();
    assert_eq!(g["recovered"], record);
    assert!(token(&g) > token(&old));
    let s = status(&app, "k").await;
    assert_eq!(s["state"], "held");
    assert_eq!(s["recovery"], Value::Null);
    let audit: Value = app.get("/v1/audit/recoveries").await.json().await.unwrap();
    let row = &audit["items"][0];
    assert_eq!(row["key"], "k");
    assert_eq!(row["reason"], "expired");
    assert_eq!(row["recovery"], record);
    assert_eq!(row["reconciled_by"], "fixer");
    assert_eq!(row["holder"], "fixer");
    assert_eq!(row["highest_token"], g["token"]);
    assert_eq!(row["operation"], "reconcile");
    assert_eq!(row["request_id"], "reconcile-1");
    assert_eq!(audit["items"].as_array().unwrap().len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn reconciled_on_a_key_without_a_record_is_a_plain_grant() {
    let app = TestApp::spawn().await;
    let r = app
        .acquire_with(
            "k",
            json!({"owner": "a", "ttl_ms": 30000, "reconciled": true}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let g: Value = r.json().await.unwrap();
    assert!(g.get("recovered").is_none());
    let audit: Value = app.get("/v1/audit/recoveries").await.json().await.unwrap();
    assert_eq!(audit["items"], json!([]));
    app.stop().await;
}

#[tokio::test]
async fn reconciled_never_overrides_a_live_lease() {
    let app = TestApp::spawn().await;
    app.acquire("k", "a", 30000).await;
    let r = app
        .acquire_with(
            "k",
            json!({"owner": "b", "ttl_ms": 30000, "reconciled": true}),
        )
        .await;
    problem(r, StatusCode::CONFLICT, "lease_held").await;
    app.stop().await;
}

#[tokio::test]
async fn the_list_finds_keys_with_pending_records() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("abandoned", "a", 30000).await);
    fenced_post(&app, "abandoned", "abandon", t).await;
    app.acquire("held", "a", 30000).await;
    let page: Value = app
        .get("/v1/leases?state=recovery_pending")
        .await
        .json()
        .await
        .unwrap();
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["key"], "abandoned");
    assert_eq!(items[0]["recovery"]["reason"], "abandoned");
    app.stop().await;
}

#[tokio::test]
async fn recoveries_page_and_filter_like_rejections() {
    let app = TestApp::spawn().await;
    for (i, key) in ["a", "b", "a"].iter().enumerate() {
        let t = token(&app.acquire(key, &format!("w{i}"), 30000).await);
        fenced_post(&app, key, "abandon", t).await;
        app.acquire_with(
            key,
            json!({"owner": "fixer", "ttl_ms": 30000, "reconciled": true}),
        )
        .await;
        let t = token(&status(&app, key).await["lease"]);
        app.release(key, t).await;
    }
    let page: Value = app
        .get("/v1/audit/recoveries?key=a&limit=1")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_eq!(page["items"][0]["recovery"]["owner"], "w2", "newest first");
    let c = page["next_cursor"].as_str().unwrap();
    let next: Value = app
        .get(&format!("/v1/audit/recoveries?key=a&limit=1&cursor={c}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(next["items"][0]["recovery"]["owner"], "w0");
    assert_eq!(next["next_cursor"], Value::Null);
    let abandoned: Value = app
        .get("/v1/audit/recoveries?reason=abandoned")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(abandoned["items"].as_array().unwrap().len(), 3);
    let expired: Value = app
        .get("/v1/audit/recoveries?reason=expired")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(expired["items"], json!([]));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reconcilers_through_two_instances_get_exactly_one_grant() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let bases = [app.instance.base.clone(), second.base.clone()];
    for round in 0..10 {
        let key = format!("rec-{round}");
        let t = token(&app.acquire(&key, "crasher", 30000).await);
        fenced_post(&app, &key, "abandon", t).await;
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let http = app.http.clone();
                let url = format!("{}/v1/leases/{key}", bases[i % 2]);
                tokio::spawn(async move {
                    let r = http
                        .post(url)
                        .json(&json!({"owner": format!("fixer-{i}"), "ttl_ms": 30000, "reconciled": true}))
                        .send()
                        .await
                        .unwrap();
                    (r.status(), r.json::<Value>().await.unwrap())
                })
            })
            .collect();
        let mut granted = 0;
        for task in tasks {
            let (status, body) = task.await.unwrap();
            match status {
                StatusCode::CREATED => {
                    granted += 1;
                    assert_eq!(body["recovered"]["reason"], "abandoned");
                }
                StatusCode::CONFLICT => assert_eq!(body["code"], "lease_held", "{body}"),
                other => panic!("unexpected {other}: {body}"),
            }
        }
        assert_eq!(granted, 1, "round {round}");
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM recoveries WHERE key = $1")
            .bind(&key)
            .fetch_one(app.db())
            .await
            .unwrap();
        assert_eq!(rows, 1, "one audit row per replaced record");
    }
    second.stop().await;
    app.stop().await;
}
