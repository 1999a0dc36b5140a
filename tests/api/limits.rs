//! Request limits: concurrent requests shed with 503, slow bodies answered 408, oversized
//! targets and headers answered 414 and 431, and every head hyper refuses by itself answered
//! problem+json with an `x-request-id` too; each refusal changes nothing. Request ids are kept
//! only when usable.

use std::time::Duration;

use futures_util::{StreamExt, stream};
use reqwest::{Body, Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, problem, rules, token};
use crate::raw;

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

/// A GET of /healthz with `fields` header fields in all (`host` and `connection` among them).
fn head_with_fields(fields: usize) -> String {
    let extra: String = (2..fields).map(|i| format!("x-f{i}: v\r\n")).collect();
    format!("GET /healthz HTTP/1.1\r\nhost: x\r\n{extra}connection: close\r\n\r\n")
}

#[tokio::test]
async fn a_request_with_as_many_header_fields_as_the_limit_is_served() {
    let app = TestApp::spawn().await;
    let request = head_with_fields(snapfence::conn::MAX_HEADER_FIELDS);
    let answer = raw::exchange(&app.instance.base, request.as_bytes()).await;
    assert_eq!(answer.status, 200);
    app.stop().await;
}

#[tokio::test]
async fn one_header_field_over_the_limit_is_answered_431_problem_json_with_a_request_id() {
    let app = TestApp::spawn().await;
    let limit = snapfence::conn::MAX_HEADER_FIELDS;
    let answer = raw::exchange(&app.instance.base, head_with_fields(limit + 1).as_bytes()).await;
    let body = answer.problem(431, "invalid_request");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(&format!("{limit} header fields")), "{body}");
    app.stop().await;
}

#[tokio::test]
async fn a_head_over_hyper_s_buffer_is_answered_431_problem_json_with_a_request_id() {
    let app = TestApp::spawn().await;
    let request = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "b".repeat(200 * 1024)
    );
    let answer = raw::exchange(&app.instance.base, request.as_bytes()).await;
    answer.problem(431, "invalid_request");
    app.stop().await;
}

#[tokio::test]
async fn a_target_over_the_limit_is_answered_414_problem_json_with_a_request_id() {
    let app = TestApp::spawn().await;
    let prefix = "p".repeat(snapfence::http::MAX_URI_BYTES);
    let r = app.get(&format!("/v1/leases?prefix={prefix}")).await;
    assert!(r.headers().contains_key("x-request-id"));
    let body = problem(r, StatusCode::URI_TOO_LONG, "invalid_request").await;
    assert!(body["detail"].as_str().unwrap().contains("8192"), "{body}");
    app.stop().await;
}

#[tokio::test]
async fn conflicting_content_lengths_are_answered_400_problem_json_with_a_request_id() {
    let app = TestApp::spawn().await;
    let body = r#"{"owner":"w","ttl_ms":30000}"#;
    let request = format!(
        "POST /v1/leases/k HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len(),
        body.len() + 1
    );
    let answer = raw::exchange(&app.instance.base, request.as_bytes()).await;
    answer.problem(400, "invalid_request");
    problem(
        app.get("/v1/leases/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_malformed_request_line_is_answered_400_problem_json_with_a_request_id() {
    let app = TestApp::spawn().await;
    let answer = raw::exchange(&app.instance.base, b"NOT HTTP AT ALL\r\n\r\n").await;
    answer.problem(400, "invalid_request");
    app.stop().await;
}

#[tokio::test]
async fn a_head_refused_after_an_answered_request_on_the_same_connection_is_problem_json_too() {
    let app = TestApp::spawn().await;
    let mut stream = raw::connect(&app.instance.base).await;
    use tokio::io::AsyncWriteExt;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(raw::read_answer(&mut stream).await.status, 200);
    stream
        .write_all(
            b"GET /healthz HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
        )
        .await
        .unwrap();
    raw::read_answer(&mut stream)
        .await
        .problem(400, "invalid_request");
    app.stop().await;
}

/// The `x-request-id` an answer carries, for a request that sent `id`.
async fn echoed_request_id(app: &TestApp, id: &str) -> String {
    let r = app
        .request(Method::GET, "/healthz")
        .header("x-request-id", id)
        .send()
        .await
        .unwrap();
    r.headers()["x-request-id"].to_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_request_id_of_128_visible_characters_is_kept() {
    let app = TestApp::spawn().await;
    let id = "~!".repeat(64);
    assert_eq!(echoed_request_id(&app, &id).await, id);
    app.stop().await;
}

#[tokio::test]
async fn a_request_id_over_128_characters_is_replaced_in_the_answer_and_the_audit_row() {
    let app = TestApp::spawn().await;
    let sent = "r".repeat(200);
    let r = app
        .request(Method::PUT, "/v1/snapshots/never-leased")
        .header("Fencing-Token", "7")
        .header("x-request-id", &sent)
        .body("x")
        .send()
        .await
        .unwrap();
    let made = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    problem(r, StatusCode::CONFLICT, "unknown_token").await;
    assert_ne!(made, sent);
    assert_eq!(made.len(), 36, "a UUID: {made}");
    let page: Value = app.get("/v1/audit/rejections").await.json().await.unwrap();
    assert_eq!(page["items"][0]["request_id"], made.as_str());
    app.stop().await;
}

#[tokio::test]
async fn a_request_id_with_a_space_or_a_control_character_is_replaced() {
    let app = TestApp::spawn().await;
    for id in ["two words", "tab\there"] {
        let echoed = echoed_request_id(&app, id).await;
        assert_ne!(echoed, id);
        assert_eq!(echoed.len(), 36, "a UUID: {echoed}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_request_id_sent_twice_is_replaced() {
    let app = TestApp::spawn().await;
    let r = app
        .request(Method::GET, "/healthz")
        .header("x-request-id", "one")
        .header("x-request-id", "two")
        .send()
        .await
        .unwrap();
    let echoed = r.headers()["x-request-id"].to_str().unwrap();
    assert_eq!(echoed.len(), 36, "a UUID: {echoed}");
    app.stop().await;
}
