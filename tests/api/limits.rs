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
    // Two uploads that send their first part at once and the rest only once `finish` says so,
    // so that they hold both slots for as long as the test needs.
    let (finish, finished) = tokio::sync::watch::channel(false);
    let upload = || {
        let finished = finished.clone();
        let body = stream::iter(0..8u32).then(move |i| {
            let mut finished = finished.clone();
            async move {
                if i > 0 {
                    let _ = finished.wait_for(|go| *go).await;
                }
                Ok::<_, std::io::Error>(format!("{i};"))
            }
        });
        let put = app
            .request(Method::PUT, "/v1/snapshots/slow")
            .header("Fencing-Token", t.to_string())
            .body(Body::wrap_stream(body));
        tokio::spawn(put.send())
    };
    let mut uploads = vec![upload(), upload()];
    // Both are being served once a probe is shed, however long they took to arrive. A probe
    // served meanwhile held a slot for a moment: an upload it pushed out (the only way one
    // answers before `finish`) is sent again.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while app.get("/v1/leases/probe").await.status() != StatusCode::SERVICE_UNAVAILABLE {
        assert!(
            std::time::Instant::now() < deadline,
            "the uploads never took both slots"
        );
        for u in uploads.iter_mut().filter(|u| u.is_finished()) {
            *u = upload();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    let _ = finish.send(true);
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
