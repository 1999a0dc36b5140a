//! Request limits: concurrent requests shed with 503, slow bodies answered 408, oversized
//! headers answered 431; each refusal changes nothing.

use std::time::Duration;

use futures_util::{StreamExt, stream};
use reqwest::{Body, Method, StatusCode};
use serde_json::json;

use crate::harness::{TestApp, problem, rules, token};

/// A body that sends `parts` small chunks, one every `every`.
fn slow_body(parts: u64, every: Duration) -> Body {
    Body::wrap_stream(stream::iter(0..parts).then(move |i| async move {
        tokio::time::sleep(every).await;
        Ok::<_, std::io::Error>(format!("{i};"))
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_above_the_concurrency_cap_is_shed_with_503_and_changes_nothing() {
    let mut r = rules();
    r.max_concurrent_requests = 2;
    let app = TestApp::spawn_with(r).await;
    let t = token(&app.acquire("slow", "w", 30000).await);
    let uploads: Vec<_> = (0..2)
        .map(|_| {
            let put = app
                .request(Method::PUT, "/v1/snapshots/slow")
                .header("Fencing-Token", t.to_string())
                .body(slow_body(8, Duration::from_millis(100)));
            tokio::spawn(put.send())
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let shed = app
        .acquire_with("shed", json!({"owner": "w", "ttl_ms": 30000}))
        .await;
    assert_eq!(shed.headers()["retry-after"], "1");
    let body = problem(shed, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    assert!(
        body["detail"].as_str().unwrap().contains("concurrent"),
        "{body}"
    );
    let health = app.get("/healthz").await;
    assert_eq!(
        health.status(),
        StatusCode::OK,
        "health checks are never shed"
    );
    for upload in uploads {
        let r = upload.await.unwrap().unwrap();
        assert!(
            r.status().is_success(),
            "the admitted uploads finish: {}",
            r.status()
        );
    }
    problem(
        app.get("/v1/leases/shed").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_body_that_arrives_too_slowly_is_answered_408_and_nothing_is_stored() {
    let mut r = rules();
    r.body_timeout = Duration::from_millis(300);
    let app = TestApp::spawn_with(r).await;
    let t = token(&app.acquire("k", "w", 30000).await);
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", t.to_string())
        .body(slow_body(10, Duration::from_millis(100)))
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::REQUEST_TIMEOUT, "request_timeout").await;
    problem(
        app.get("/v1/snapshots/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn headers_over_the_limit_are_answered_431_and_change_nothing() {
    let app = TestApp::spawn().await;
    let r = app
        .request(Method::POST, "/v1/leases/k")
        .header("x-padding", "p".repeat(20 * 1024))
        .json(&json!({"owner": "w", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    problem(
        r,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        "invalid_request",
    )
    .await;
    problem(
        app.get("/v1/leases/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.stop().await;
}
