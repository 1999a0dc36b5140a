//! What one tenant may hold of an instance: requests in flight and a rate per API key (429
//! with `Retry-After`), and the budget of the bodies being received (503, nothing changed), so
//! that one key withholding bodies or uploading many large ones cannot keep another key from
//! being served, nor take the service's memory. Every refusal is problem+json with an
//! `x-request-id`.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{StreamExt, stream};
use reqwest::{Body, Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use snapfence::domain::Scope;
use snapfence::rules::RateLimit;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use crate::connections::raise_file_limit;
use crate::harness::{TestApp, migrated_database, problem, rules, token, url_of};
use crate::raw::{self, Answer};
use crate::serve::{serve_with, short_tempdir};

fn bearer(r: RequestBuilder, key: &str) -> RequestBuilder {
    r.header("Authorization", format!("Bearer {key}"))
}

/// The head of a PUT of `length` body bytes to `key` with `token`, as the API key `key_token`
/// (none: without one). With `expect`, it asks for `100 Continue`, which the server sends once
/// it starts reading the body: the request has been admitted, and its body charged to the
/// budget.
fn put_head(key: &str, token: i64, key_token: Option<&str>, length: usize, expect: bool) -> String {
    let auth = key_token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
    let expect = if expect {
        "expect: 100-continue\r\n"
    } else {
        ""
    };
    format!(
        "PUT /v1/snapshots/{key} HTTP/1.1\r\nhost: x\r\n{auth}fencing-token: {token}\r\ncontent-length: {length}\r\n{expect}\r\n"
    )
}

/// A PUT that is being served and reading its body, which it is never sent: a connection
/// whose head asked for `100 Continue` and got it.
async fn held_put(
    app: &TestApp,
    key: &str,
    token: i64,
    key_token: Option<&str>,
    length: usize,
) -> TcpStream {
    let mut stream = raw::connect(&app.instance.base).await;
    let head = put_head(key, token, key_token, length, true);
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = raw::read_answer(&mut stream).await;
    assert_eq!(
        answer.status, 100,
        "admitted and reading: {:?}",
        answer.body
    );
    stream
}

/// Rules under which a body that is never sent holds its request for longer than any test.
fn patient() -> snapfence::Rules {
    let mut r = rules();
    r.body_timeout = Duration::from_secs(600);
    r
}

/// Two write keys of their own; returns their tokens.
async fn two_tenants(app: &TestApp) -> (String, String) {
    let a = app.make_key("tenant-a", Scope::Write, "").await;
    let b = app.make_key("tenant-b", Scope::Write, "").await;
    (a, b)
}

/// Acquires `key` as the API key `key_token`; returns the grant's token.
async fn acquire_as(app: &TestApp, key_token: &str, key: &str) -> i64 {
    let r = bearer(
        app.request(Method::POST, &format!("/v1/leases/{key}")),
        key_token,
    )
    .json(&json!({"owner": "w", "ttl_ms": 600_000}))
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "acquire {key}");
    token(&r.json::<Value>().await.unwrap())
}

/// Asserts a refusal that changed nothing: problem+json of `status` and `code` with an
/// `x-request-id` and a `Retry-After`, whose detail says nothing was changed; returns the
/// seconds `Retry-After` says.
async fn refused(r: Response, status: StatusCode, code: &str) -> u64 {
    assert!(r.headers().contains_key("x-request-id"));
    let after = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let body = problem(r, status, code).await;
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("nothing was changed"), "{detail}");
    after
}

/// [`refused`] with `429 too_many_requests`.
async fn too_many(r: Response) -> u64 {
    refused(r, StatusCode::TOO_MANY_REQUESTS, "too_many_requests").await
}

/// Asserts a raw `503 unavailable` for a body over the budget: problem+json with an
/// `x-request-id` and `Retry-After: 1`, whose detail says nothing was changed.
fn over_budget(answer: &Answer) {
    let body = answer.problem(503, "unavailable");
    assert_eq!(answer.header("retry-after"), Some("1"));
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("--max-body-bytes-in-flight") && detail.contains("nothing was changed"),
        "{detail}"
    );
}

/// The calls of a tenant that must be served while another misbehaves: a grant, a write and
/// two reads, each answered within a second.
async fn served_within_a_second(app: &TestApp, key_token: &str, key: &str) {
    let ceiling = Duration::from_secs(1);
    let started = Instant::now();
    let t = acquire_as(app, key_token, key).await;
    assert!(
        started.elapsed() < ceiling,
        "acquire: {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let put = bearer(
        app.request(Method::PUT, &format!("/v1/snapshots/{key}")),
        key_token,
    )
    .header("Fencing-Token", t.to_string())
    .body("state");
    assert_eq!(put.send().await.unwrap().status(), StatusCode::CREATED);
    assert!(started.elapsed() < ceiling, "put: {:?}", started.elapsed());
    for path in [format!("/v1/snapshots/{key}"), "/v1/leases".to_owned()] {
        let started = Instant::now();
        let r = bearer(app.request(Method::GET, &path), key_token);
        assert_eq!(r.send().await.unwrap().status(), StatusCode::OK, "{path}");
        assert!(
            started.elapsed() < ceiling,
            "{path}: {:?}",
            started.elapsed()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_65th_request_in_flight_of_one_key_is_answered_429_with_retry_after_while_another_key_is_served()
 {
    let app = TestApp::spawn_with(patient()).await;
    let (a, b) = two_tenants(&app).await;
    let t = acquire_as(&app, &a, "a").await;
    let mut held = Vec::new();
    for _ in 0..app.rules.max_in_flight_per_key {
        held.push(held_put(&app, "a", t, Some(&a), 1).await);
    }
    let r = bearer(app.request(Method::GET, "/v1/leases/a"), &a);
    assert_eq!(too_many(r.send().await.unwrap()).await, 1);
    let r = bearer(app.request(Method::GET, "/v1/leases/a"), &b);
    assert_eq!(r.send().await.unwrap().status(), StatusCode::OK);
    // One of the 64 sends its body and is answered: its place is free again at once.
    let mut finished = held.pop().unwrap();
    finished.write_all(b"x").await.unwrap();
    assert_eq!(raw::read_answer(&mut finished).await.status, 201);
    let r = bearer(app.request(Method::GET, "/v1/leases/a"), &a);
    assert_eq!(r.send().await.unwrap().status(), StatusCode::OK);
    drop(held);
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withheld_bodies_of_one_key_do_not_keep_another_key_from_being_served() {
    const WITHHELD: usize = 1024;
    // Both ends of every connection are files of this process.
    assert!(
        raise_file_limit() > 2 * WITHHELD as u64 + 600,
        "the open-file limit leaves no room for {WITHHELD} connections"
    );
    let app = TestApp::spawn_with(patient()).await;
    let (a, b) = two_tenants(&app).await;
    let t = acquire_as(&app, &a, "a").await;
    // One after another, so that none waits in a full listen queue.
    let mut streams = Vec::with_capacity(WITHHELD);
    for _ in 0..WITHHELD {
        streams.push(raw::connect(&app.instance.base).await);
    }
    let head = put_head("a", t, Some(&a), 1024, false);
    let mut answers = JoinSet::new();
    for mut stream in streams {
        let head = head.clone();
        answers.spawn(async move {
            stream.write_all(head.as_bytes()).await.unwrap();
            raw::read_answer(&mut stream).await
        });
    }
    // The key's first 64 are served and wait for their bodies; every other one is refused at
    // once. Once all of those are answered, the 64 hold their places.
    let cap = app.rules.max_in_flight_per_key;
    for _ in 0..WITHHELD - cap {
        let answer = answers.join_next().await.unwrap().unwrap();
        answer.problem(429, "too_many_requests");
        assert_eq!(answer.header("retry-after"), Some("1"));
    }
    assert_eq!(answers.len(), cap, "the rest wait for their bodies");
    served_within_a_second(&app, &b, "b").await;
    let r = bearer(app.request(Method::GET, "/v1/leases/a"), &a);
    too_many(r.send().await.unwrap()).await;
    // Their connections close, and with them their requests.
    answers.abort_all();
    app.stop().await;
}

#[tokio::test]
async fn a_key_over_its_rate_limit_is_answered_429_with_the_seconds_until_its_next_request() {
    let mut r = rules();
    r.rate_limit_per_key = Some(RateLimit {
        per_second: 0.1,
        burst: NonZeroU32::new(2).unwrap(),
    });
    let app = TestApp::spawn_with(r).await;
    let (a, b) = two_tenants(&app).await;
    let get = |key: &str| bearer(app.request(Method::GET, "/v1/leases"), key).send();
    for _ in 0..2 {
        assert_eq!(get(&a).await.unwrap().status(), StatusCode::OK, "the burst");
    }
    // The next one is allowed 10 s after the first: less whatever time has passed since.
    let after = too_many(get(&a).await.unwrap()).await;
    assert!((2..=10).contains(&after), "Retry-After: {after}");
    assert_eq!(
        get(&b).await.unwrap().status(),
        StatusCode::OK,
        "another key has a rate of its own"
    );
    app.stop().await;
}

#[tokio::test]
async fn requests_without_an_api_key_are_bounded_by_the_instance_s_limits_only() {
    let mut r = patient();
    r.max_in_flight_per_key = 1;
    let app = TestApp::spawn_with(r).await;
    let t = token(&app.acquire("k", "w", 600_000).await);
    let first = held_put(&app, "k", t, None, 1).await;
    let second = held_put(&app, "k", t, None, 1).await;
    assert_eq!(app.get("/v1/leases/k").await.status(), StatusCode::OK);
    drop((first, second));
    app.stop().await;
}

/// Rules with a budget of 1 MiB for bodies, and room for a body of most of it.
fn small_budget() -> snapfence::Rules {
    let mut r = patient();
    r.max_body_bytes_in_flight = 1024 * 1024;
    r
}

/// Most of [`small_budget`]: two such bodies do not fit in it together.
const MOST: usize = 600 * 1024;

#[tokio::test]
async fn a_put_whose_announced_length_would_pass_the_body_budget_is_answered_503_before_its_body_is_read()
 {
    let app = TestApp::spawn_with(small_budget()).await;
    let t = token(&app.acquire("k", "w", 600_000).await);
    let mut held = held_put(&app, "k", t, None, MOST).await;
    // Asked to confirm before it sends its body, the client is refused instead: nothing of
    // the body was read.
    let head = put_head("k", t, None, MOST, true);
    over_budget(&raw::exchange(&app.instance.base, head.as_bytes()).await);
    held.write_all(&vec![1u8; MOST]).await.unwrap();
    assert_eq!(raw::read_answer(&mut held).await.status, 201);
    // Stored, its body no longer counts.
    assert_eq!(
        app.put("k", t, vec![2u8; MOST]).await.status(),
        StatusCode::OK
    );
    let versions: Value = app
        .get("/v1/snapshots/k/versions")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        versions["items"].as_array().unwrap().len(),
        2,
        "the refused PUT stored nothing"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_body_without_a_length_that_would_pass_the_body_budget_is_refused_503_as_it_arrives() {
    let app = TestApp::spawn_with(small_budget()).await;
    let t = token(&app.acquire("k", "w", 600_000).await);
    let mut held = held_put(&app, "k", t, None, MOST).await;
    let endless = stream::repeat_with(|| Ok::<_, std::io::Error>(vec![0u8; 4096])).take(1_000_000);
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", t.to_string())
        .body(Body::wrap_stream(endless))
        .send()
        .await
        .expect("the server answers while the client is still sending");
    assert_eq!(
        refused(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await,
        1
    );
    problem(
        app.get("/v1/snapshots/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    held.write_all(&vec![1u8; MOST]).await.unwrap();
    assert_eq!(raw::read_answer(&mut held).await.status, 201);
    app.stop().await;
}

/// The peak resident memory of a process, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/PID/status");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("VmHWM in kB");
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_8_mib_uploads_with_unissued_tokens_keep_the_server_under_the_body_budget_plus_64_mib()
 {
    const UPLOADS: usize = 256;
    const MIB: u64 = 1024 * 1024;
    const BUDGET: u64 = 64 * MIB;
    assert!(raise_file_limit() > 2 * UPLOADS as u64 + 600);
    // The server in a process of its own, so that its memory is all that is measured.
    let database = migrated_database().await;
    let dir = short_tempdir();
    let url = url_of(database.options());
    let budget = BUDGET.to_string();
    let args = [
        "--database-url",
        url.as_str(),
        "--max-body-bytes-in-flight",
        budget.as_str(),
    ]
    .map(std::ffi::OsStr::new);
    let served = serve_with(&args, &dir.path().join("serve.log")).await;
    let body = Bytes::from(vec![7u8; 8 * MIB as usize]);
    let head = format!(
        "PUT /v1/snapshots/big HTTP/1.1\r\nhost: x\r\nfencing-token: 1000000\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut uploads = JoinSet::new();
    for _ in 0..UPLOADS {
        let mut stream = raw::connect(&served.base).await;
        let (head, body) = (head.clone(), body.clone());
        uploads.spawn(async move {
            let (mut reader, mut writer) = stream.split();
            // The whole body is sent whatever the server answers: a refused upload's server
            // closes the connection, and what could not be sent does not matter.
            let send = async {
                let _ = writer.write_all(head.as_bytes()).await;
                let _ = writer.write_all(&body).await;
            };
            let ((), answer) = tokio::join!(send, raw::read_answer(&mut reader));
            answer
        });
    }
    while let Some(answer) = uploads.join_next().await {
        let answer = answer.unwrap();
        match answer.status {
            409 => answer.problem(409, "unknown_token"),
            _ => answer.problem(503, "unavailable"),
        };
    }
    let peak = peak_rss(served.pid());
    assert!(
        peak < BUDGET + 64 * MIB,
        "peak RSS {} MiB, over the budget of {} MiB plus 64",
        peak / MIB,
        BUDGET / MIB
    );
    served.terminate();
    assert!(served.wait().await.success());
    drop(database);
}
