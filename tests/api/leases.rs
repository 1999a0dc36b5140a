//! Leases: one test per rule of the contract's lease section.

use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, enc, problem, token};

fn time(v: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v.as_str().expect("a time string"))
        .expect("RFC 3339")
        .with_timezone(&Utc)
}

async fn renew(app: &TestApp, key: &str, body: Value) -> reqwest::Response {
    app.request(Method::POST, &format!("/v1/leases/{}/renew", enc(key)))
        .json(&body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_grant_has_every_field_of_the_contract() {
    let app = TestApp::spawn().await;
    let r = app
        .acquire_with(
            "jobs/42",
            json!({"owner": "worker-7", "ttl_ms": 30000, "metadata": {"pid": 4242}}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["content-type"], "application/json");
    let g: Value = r.json().await.unwrap();
    assert_eq!(g["key"], "jobs/42");
    assert_eq!(g["owner"], "worker-7");
    assert!(token(&g) >= 1);
    assert_eq!(g["ttl_ms"], 30000);
    assert_eq!(g["metadata"], json!({"pid": 4242}));
    assert_eq!(g["crash_recovery"], false);
    let (acquired, expires) = (time(&g["acquired_at"]), time(&g["expires_at"]));
    assert_eq!((expires - acquired).num_milliseconds(), 30000);
    assert!(g["acquired_at"].as_str().unwrap().ends_with('Z'));
    app.stop().await;
}

#[tokio::test]
async fn every_grant_mints_a_new_greater_token_also_for_the_same_owner() {
    let app = TestApp::spawn().await;
    let first = token(&app.acquire("k", "w", 30000).await);
    assert_eq!(
        app.release("k", first).await.status(),
        StatusCode::NO_CONTENT
    );
    let second = token(&app.acquire("k", "w", 30000).await);
    assert!(second > first, "{second} > {first}");
    let other_key = token(&app.acquire("other", "w", 30000).await);
    assert!(other_key > second, "tokens increase across keys too");
    app.stop().await;
}

#[tokio::test]
async fn acquire_while_held_answers_lease_held_with_the_holder_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let g = app
        .acquire_with(
            "k",
            json!({"owner": "a", "ttl_ms": 30000, "metadata": {"x": 1}}),
        )
        .await
        .json::<Value>()
        .await
        .unwrap();
    let r = app
        .acquire_with("k", json!({"owner": "b", "ttl_ms": 30000}))
        .await;
    let body = problem(r, StatusCode::CONFLICT, "lease_held").await;
    assert_eq!(body["holder"]["owner"], "a");
    assert_eq!(body["holder"]["acquired_at"], g["acquired_at"]);
    assert_eq!(body["holder"]["expires_at"], g["expires_at"]);
    assert_eq!(body["holder"]["metadata"], json!({"x": 1}));
    assert_eq!(body["state"], "held");
    assert!(body.get("waiters").is_none(), "{body}");
    // The same owner is refused too: a grant is never re-entrant.
    let again = app
        .acquire_with("k", json!({"owner": "a", "ttl_ms": 30000}))
        .await;
    problem(again, StatusCode::CONFLICT, "lease_held").await;
    let status: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(status["lease"], g);
    app.stop().await;
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_with_a_greater_token() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 150).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = app.acquire("k", "b", 30000).await;
    assert_eq!(b["owner"], "b");
    assert!(token(&b) > a);
    app.stop().await;
}

#[tokio::test]
async fn renew_keeps_the_token_and_moves_the_expiry() {
    let app = TestApp::spawn().await;
    let g = app.acquire("k", "a", 30000).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = renew(&app, "k", json!({"token": token(&g), "ttl_ms": 60000})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let renewed: Value = r.json().await.unwrap();
    assert_eq!(renewed["token"], g["token"]);
    assert_eq!(renewed["acquired_at"], g["acquired_at"]);
    assert_eq!(renewed["ttl_ms"], 60000);
    assert!(time(&renewed["expires_at"]) > time(&g["expires_at"]));
    app.stop().await;
}

#[tokio::test]
async fn renew_without_ttl_keeps_the_lease_ttl() {
    let app = TestApp::spawn().await;
    let g = app.acquire("k", "a", 30000).await;
    let renewed: Value = renew(&app, "k", json!({"token": token(&g)}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(renewed["ttl_ms"], 30000);
    assert!(time(&renewed["expires_at"]) >= time(&g["expires_at"]));
    app.stop().await;
}

#[tokio::test]
async fn renew_after_expiry_answers_lease_lost() {
    let app = TestApp::spawn().await;
    let g = app.acquire("k", "a", 120).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let r = renew(&app, "k", json!({"token": token(&g)})).await;
    problem(r, StatusCode::CONFLICT, "lease_lost").await;
    let status: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(status["state"], "expired");
    assert_eq!(status["lease"]["expires_at"], g["expires_at"]);
    app.stop().await;
}

#[tokio::test]
async fn renew_with_a_superseded_token_answers_lease_lost() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 120).await);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let b = app.acquire("k", "b", 30000).await;
    let r = renew(&app, "k", json!({"token": a})).await;
    problem(r, StatusCode::CONFLICT, "lease_lost").await;
    let status: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(status["lease"], b, "the new holder is untouched");
    app.stop().await;
}

#[tokio::test]
async fn renew_of_a_never_issued_token_answers_lease_lost() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 30000).await);
    let r = renew(&app, "k", json!({"token": a + 1000})).await;
    problem(r, StatusCode::CONFLICT, "lease_lost").await;
    let r = renew(&app, "never-leased", json!({"token": 1})).await;
    problem(r, StatusCode::CONFLICT, "lease_lost").await;
    app.stop().await;
}

#[tokio::test]
async fn release_frees_the_key_at_once() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 30000).await);
    assert_eq!(app.release("k", a).await.status(), StatusCode::NO_CONTENT);
    let status: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(status["state"], "released");
    let b = app.acquire("k", "b", 30000).await;
    assert!(token(&b) > a);
    app.stop().await;
}

#[tokio::test]
async fn a_released_lease_cannot_be_released_or_renewed_again() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 30000).await);
    app.release("k", a).await;
    problem(
        app.release("k", a).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    let r = renew(&app, "k", json!({"token": a})).await;
    problem(r, StatusCode::CONFLICT, "lease_lost").await;
    app.stop().await;
}

#[tokio::test]
async fn a_stale_release_leaves_the_newer_holder_untouched() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 120).await);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let b = app.acquire("k", "b", 30000).await;
    problem(
        app.release("k", a).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    let status: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(status["state"], "held");
    assert_eq!(status["lease"], b);
    app.stop().await;
}

#[tokio::test]
async fn release_without_a_token_answers_token_required() {
    let app = TestApp::spawn().await;
    app.acquire("k", "a", 30000).await;
    let r = app
        .request(Method::DELETE, "/v1/leases/k")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::PRECONDITION_REQUIRED, "token_required").await;
    let status: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(status["state"], "held");
    app.stop().await;
}

#[tokio::test]
async fn get_shows_the_state_the_newest_lease_and_the_newest_token() {
    let app = TestApp::spawn().await;
    let g = app.acquire("jobs/1", "a", 30000).await;
    let r = app.get("/v1/leases/jobs%2F1").await;
    assert_eq!(r.status(), StatusCode::OK);
    let s: Value = r.json().await.unwrap();
    assert_eq!(s["key"], "jobs/1");
    assert_eq!(s["state"], "held");
    assert_eq!(s["lease"], g);
    assert_eq!(s["recovery"], Value::Null);
    assert_eq!(s["newest_token"], g["token"]);
    app.stop().await;
}

#[tokio::test]
async fn get_of_a_never_leased_key_is_not_found() {
    let app = TestApp::spawn().await;
    problem(
        app.get("/v1/leases/nope").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn list_pages_through_every_key_under_a_prefix_in_key_order() {
    let app = TestApp::spawn().await;
    for i in 0..7 {
        app.acquire(&format!("a/{i}"), "w", 30000).await;
    }
    for key in ["a", "b/1", "a0", "`"] {
        app.acquire(key, "w", 30000).await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = "/v1/leases?prefix=a%2F&limit=3".to_string();
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page: Value = app.get(&path).await.json().await.unwrap();
        pages += 1;
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 3);
        seen.extend(items.iter().map(|i| i["key"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let expected: Vec<String> = (0..7).map(|i| format!("a/{i}")).collect();
    assert_eq!(seen, expected);
    assert_eq!(pages, 3);
    let all: Value = app.get("/v1/leases").await.json().await.unwrap();
    assert_eq!(all["items"].as_array().unwrap().len(), 11);
    assert_eq!(all["next_cursor"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn list_filters_by_state() {
    let app = TestApp::spawn().await;
    app.acquire("held", "w", 30000).await;
    let r = token(&app.acquire("released", "w", 30000).await);
    app.release("released", r).await;
    let page: Value = app
        .get("/v1/leases?state=released")
        .await
        .json()
        .await
        .unwrap();
    let keys: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["released"]);
    let page: Value = app.get("/v1/leases?state=held").await.json().await.unwrap();
    assert_eq!(page["items"][0]["key"], "held");
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn every_answer_carries_a_request_id_taken_or_made() {
    let app = TestApp::spawn().await;
    let r = app
        .request(Method::GET, "/healthz")
        .header("x-request-id", "my-id-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "my-id-1");
    let r = app.get("/v1/leases/nope").await;
    let made = r.headers()["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(made.len(), 36, "a UUID: {made}");
    app.stop().await;
}

#[tokio::test]
async fn healthz_and_readyz_answer_when_the_database_is_up() {
    let app = TestApp::spawn().await;
    let r = app.get("/healthz").await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = app.get("/readyz").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "ready");
    app.stop().await;
}

#[tokio::test]
async fn unknown_paths_and_methods_answer_problems() {
    let app = TestApp::spawn().await;
    problem(
        app.get("/v2/nothing").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let r = app
        .request(Method::PATCH, "/v1/leases/k")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
    app.stop().await;
}
