//! `Idempotency-Key` (contract v1.1): a changing call sent again with its key is answered as the
//! first time and changes nothing; a key reused for another request, or whose first request is
//! still running, is refused; records are scoped to the principal.

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::{Method, Response, StatusCode};
use serde_json::{Value, json};
use snapfence::domain::Scope;
use tokio::io::AsyncWriteExt;

use crate::harness::{TestApp, enc, problem, token};
use crate::raw;

/// A changing call with an Idempotency-Key.
fn acquire_keyed(app: &TestApp, key: &str, idem: &str, body: Value) -> reqwest::RequestBuilder {
    app.request(Method::POST, &format!("/v1/leases/{}", enc(key)))
        .header("Idempotency-Key", idem)
        .json(&body)
}

fn put_keyed(app: &TestApp, key: &str, t: i64, idem: &str, body: &str) -> reqwest::RequestBuilder {
    app.request(Method::PUT, &format!("/v1/snapshots/{}", enc(key)))
        .header("Fencing-Token", t.to_string())
        .header("Idempotency-Key", idem)
        .body(body.to_owned())
}

fn replayed(r: &Response) -> bool {
    r.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

/// An acquire of `k` with Idempotency-Key `try-1` sent again with `body`: replayed as the
/// `lease_held` answered the first time (`first`).
async fn refusal_replayed(app: &TestApp, body: Value, first: &Value) {
    let again = acquire_keyed(app, "k", "try-1", body).send().await.unwrap();
    assert!(replayed(&again));
    assert_eq!(
        &problem(again, StatusCode::CONFLICT, "lease_held").await,
        first
    );
}

async fn count(app: &TestApp, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(app.db()).await.unwrap()
}

#[tokio::test]
async fn an_acquire_sent_again_with_its_key_answers_the_same_grant_and_mints_no_token() {
    let app = TestApp::spawn().await;
    let body = json!({"owner": "a", "ttl_ms": 30000, "metadata": {"z": 1, "a": 2}});
    let first = acquire_keyed(&app, "k", "grant-1", body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(!replayed(&first), "a first answer is not a replay");
    let first: Value = first.json().await.unwrap();
    let again = acquire_keyed(&app, "k", "grant-1", body)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(replayed(&again), "Idempotent-Replayed: true");
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    // No token was drawn for the replay: the next grant anywhere has the next token.
    let next = app.acquire("other", "b", 30000).await;
    assert_eq!(token(&next), token(&first) + 1);
    app.stop().await;
}

#[tokio::test]
async fn a_refusal_is_stored_too_and_answered_again_while_the_key_has_changed() {
    let app = TestApp::spawn().await;
    app.acquire("k", "holder", 30000).await;
    let body = json!({"owner": "late", "ttl_ms": 30000});
    let first = acquire_keyed(&app, "k", "try-1", body.clone())
        .send()
        .await
        .unwrap();
    let first = problem(first, StatusCode::CONFLICT, "lease_held").await;
    let held = app.get("/v1/leases/k").await.json::<Value>().await.unwrap();
    app.release("k", held["lease"]["token"].as_i64().unwrap())
        .await;
    // The key is free now, but the request was answered before: it is answered the same.
    refusal_replayed(&app, body, &first).await;
    app.stop().await;
}

/// A refused acquire's record holds the answer a replay needs: the holder with its metadata,
/// once (a 4 KiB metadata made a record of 8.7 KB when the answer carried it twice).
#[tokio::test]
async fn a_refused_acquires_record_holds_the_holders_metadata_once() {
    let app = TestApp::spawn().await;
    let metadata = json!({"note": "m".repeat(4000)});
    let held = app
        .acquire_with(
            "k",
            json!({"owner": "holder", "ttl_ms": 30000, "metadata": metadata}),
        )
        .await;
    assert_eq!(held.status(), StatusCode::CREATED);
    let body = json!({"owner": "late", "ttl_ms": 30000});
    let first = acquire_keyed(&app, "k", "try-1", body.clone())
        .send()
        .await
        .unwrap();
    let first = problem(first, StatusCode::CONFLICT, "lease_held").await;
    assert_eq!(first["holder"]["metadata"], metadata);
    let size = count(
        &app,
        "SELECT octet_length(answer::text)::bigint FROM idempotency_records WHERE key = 'try-1'",
    )
    .await;
    assert!(
        (4000..5000).contains(&size),
        "a refusal's record is {size} bytes"
    );
    refusal_replayed(&app, body, &first).await;
    app.stop().await;
}

#[tokio::test]
async fn a_write_sent_again_with_its_key_stores_one_version() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let first = put_keyed(&app, "k", t, "w-1", "one").send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let etag = first.headers()["etag"].clone();
    let first: Value = first.json().await.unwrap();
    let again = put_keyed(&app, "k", t, "w-1", "one").send().await.unwrap();
    assert_eq!(
        again.status(),
        StatusCode::CREATED,
        "answered as the first time"
    );
    assert!(replayed(&again));
    assert_eq!(again.headers()["etag"], etag);
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    let versions = count(&app, "SELECT count(*) FROM snapshot_versions").await;
    assert_eq!(versions, 1, "one version stored");
    app.stop().await;
}

#[tokio::test]
async fn a_stale_write_sent_again_with_its_key_writes_no_second_audit_row() {
    let app = TestApp::spawn().await;
    let old = token(&app.acquire("k", "a", 100).await);
    tokio::time::sleep(Duration::from_millis(150)).await;
    app.acquire("k", "b", 30000).await;
    let first = put_keyed(&app, "k", old, "w-1", "late")
        .send()
        .await
        .unwrap();
    let first = problem(first, StatusCode::CONFLICT, "stale_token").await;
    let again = put_keyed(&app, "k", old, "w-1", "late")
        .send()
        .await
        .unwrap();
    assert!(replayed(&again));
    let again = problem(again, StatusCode::CONFLICT, "stale_token").await;
    assert_eq!(again["audit_id"], first["audit_id"]);
    assert_eq!(count(&app, "SELECT count(*) FROM rejections").await, 1);
    app.stop().await;
}

#[tokio::test]
async fn a_key_sent_with_a_different_request_answers_422_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let first = put_keyed(&app, "k", t, "w-1", "one").send().await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let other_body = put_keyed(&app, "k", t, "w-1", "two").send().await.unwrap();
    problem(
        other_body,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    let other_key = put_keyed(&app, "elsewhere", t, "w-1", "one")
        .send()
        .await
        .unwrap();
    problem(
        other_key,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    let stored = app.get("/v1/snapshots/k").await.bytes().await.unwrap();
    assert_eq!(&stored[..], b"one");
    assert_eq!(
        count(&app, "SELECT count(*) FROM snapshot_versions").await,
        1
    );
    app.stop().await;
}

#[tokio::test]
async fn lease_calls_sent_again_with_their_key_are_answered_again() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let renew = || {
        app.request(Method::POST, "/v1/leases/k/renew")
            .header("Idempotency-Key", "renew-1")
            .json(&json!({"token": t, "ttl_ms": 60000}))
            .send()
    };
    let first: Value = renew().await.unwrap().json().await.unwrap();
    let again = renew().await.unwrap();
    assert!(replayed(&again));
    assert_eq!(again.json::<Value>().await.unwrap(), first, "same expiry");
    let release = || {
        app.request(Method::DELETE, "/v1/leases/k")
            .header("Fencing-Token", t.to_string())
            .header("Idempotency-Key", "release-1")
            .send()
    };
    assert_eq!(release().await.unwrap().status(), StatusCode::NO_CONTENT);
    let again = release().await.unwrap();
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    assert!(replayed(&again));
    // Without the key, the same release is a new request, and the lease is gone.
    problem(
        app.release("k", t).await,
        StatusCode::CONFLICT,
        "lease_lost",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_fenced_delete_sent_again_with_its_key_is_answered_again() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    assert_eq!(app.put("k", t, "x").await.status(), StatusCode::CREATED);
    let delete = || {
        app.request(Method::DELETE, "/v1/snapshots/k")
            .header("Fencing-Token", t.to_string())
            .header("Idempotency-Key", "del-1")
            .send()
    };
    assert_eq!(delete().await.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(app.put("k", t, "y").await.status(), StatusCode::CREATED);
    let again = delete().await.unwrap();
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    assert!(replayed(&again));
    let kept = app.get("/v1/snapshots/k").await;
    assert_eq!(kept.status(), StatusCode::OK, "the replay deleted nothing");
    assert_eq!(&kept.bytes().await.unwrap()[..], b"y");
    app.stop().await;
}

#[tokio::test]
async fn a_request_whose_key_is_running_elsewhere_answers_409_request_in_progress() {
    let app = TestApp::spawn().await;
    // Another session holds the key's lock, as a running request with that key does.
    let mut holder = app.db().acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('busy', hashtext('')))")
        .execute(&mut *holder)
        .await
        .unwrap();
    let r = acquire_keyed(&app, "k", "busy", json!({"owner": "a", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["retry-after"], "1");
    problem(r, StatusCode::CONFLICT, "request_in_progress").await;
    assert_eq!(count(&app, "SELECT count(*) FROM leases").await, 0);
    drop(holder);
    app.stop().await;
}

#[tokio::test]
async fn concurrent_requests_with_one_key_through_two_instances_grant_once() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let body = json!({"owner": "a", "ttl_ms": 30000});
    let sends = (0..32).map(|i| {
        let instance = if i % 2 == 0 { &app.instance } else { &second };
        app.request_to(instance, Method::POST, "/v1/leases/k")
            .header("Idempotency-Key", "once")
            .json(&body)
            .send()
    });
    let mut tokens = Vec::new();
    for r in join_all(sends).await {
        let r = r.unwrap();
        match r.status() {
            StatusCode::CREATED => tokens.push(token(&r.json::<Value>().await.unwrap())),
            _ => {
                problem(r, StatusCode::CONFLICT, "request_in_progress").await;
            }
        }
    }
    assert!(!tokens.is_empty(), "at least the first is granted");
    assert!(
        tokens.iter().all(|t| *t == tokens[0]),
        "one grant: {tokens:?}"
    );
    // The key's lease is that one grant. (A statement that lost the race for the key's record
    // may have drawn a sequence value before it was rolled back: a gap, never a grant.)
    let held = count(&app, "SELECT token FROM leases WHERE key = 'k'").await;
    assert_eq!(
        held, tokens[0],
        "the key holds the one grant every answer named"
    );
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn records_are_scoped_to_the_api_key_that_made_them() {
    let app = TestApp::spawn().await;
    let alice = app.make_key("alice", Scope::Write, "").await;
    let bob = app.make_key("bob", Scope::Write, "").await;
    let send = |bearer: &str, key: &str| {
        app.request(Method::POST, &format!("/v1/leases/{key}"))
            .bearer_auth(bearer)
            .header("Idempotency-Key", "same")
            .json(&json!({"owner": "w", "ttl_ms": 30000}))
            .send()
    };
    assert_eq!(
        send(&alice, "a").await.unwrap().status(),
        StatusCode::CREATED
    );
    let r = send(&bob, "b").await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "bob's key is his own");
    assert!(!replayed(&r));
    let records = count(&app, "SELECT count(*) FROM idempotency_records").await;
    assert_eq!(records, 2);
    app.stop().await;
}

#[tokio::test]
async fn a_write_whose_key_was_revoked_while_its_body_arrived_is_refused_401() {
    let app = TestApp::spawn().await;
    let bearer = app.make_key("ci", Scope::Write, "").await;
    let grant = app
        .request(Method::POST, "/v1/leases/k")
        .bearer_auth(&bearer)
        .json(&json!({"owner": "w", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    let t = token(&grant.json::<Value>().await.unwrap());
    let mut stream = raw::connect(&app.instance.base).await;
    let head = format!(
        "PUT /v1/snapshots/k HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {bearer}\r\n\
         fencing-token: {t}\r\ncontent-length: 4\r\nexpect: 100-continue\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // `100 Continue` comes once the request was authenticated and its body is being read.
    assert_eq!(raw::read_answer(&mut stream).await.status, 100);
    app.revoke_key("ci").await;
    stream.write_all(b"data").await.unwrap();
    let answer = raw::read_answer(&mut stream).await;
    answer.problem(401, "unauthorized");
    assert_eq!(
        count(&app, "SELECT count(*) FROM snapshot_versions").await,
        0
    );
    app.stop().await;
}

#[tokio::test]
async fn a_malformed_idempotency_key_answers_400_and_changes_nothing() {
    let app = TestApp::spawn().await;
    for bad in ["", "has space", &"x".repeat(256)] {
        let r = acquire_keyed(&app, "k", bad, json!({"owner": "a", "ttl_ms": 30000}))
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    assert_eq!(count(&app, "SELECT count(*) FROM leases").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_record_past_its_retention_is_pruned_and_the_key_runs_anew() {
    let app = TestApp::spawn().await;
    let body = json!({"owner": "a", "ttl_ms": 100});
    let first = acquire_keyed(&app, "k", "old", body.clone())
        .send()
        .await
        .unwrap();
    let first = token(&first.json::<Value>().await.unwrap());
    let pruned = snapfence::store::idempotency::prune(app.db(), Duration::ZERO, 1000)
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    tokio::time::sleep(Duration::from_millis(150)).await;
    let again = acquire_keyed(&app, "k", "old", body).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(!replayed(&again));
    assert!(token(&again.json::<Value>().await.unwrap()) > first);
    app.stop().await;
}

#[tokio::test]
async fn a_key_reused_for_another_operation_answers_422_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let renewed = app
        .request(Method::POST, "/v1/leases/k/renew")
        .header("Idempotency-Key", "shared")
        .json(&json!({"token": t}))
        .send()
        .await
        .unwrap();
    assert_eq!(renewed.status(), StatusCode::OK);
    let acquire = acquire_keyed(
        &app,
        "other",
        "shared",
        json!({"owner": "b", "ttl_ms": 1000}),
    );
    let acquire = acquire.send().await.unwrap();
    problem(
        acquire,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    let put = put_keyed(&app, "k", t, "shared", "x").send().await.unwrap();
    problem(
        put,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    let delete = app
        .request(Method::DELETE, "/v1/snapshots/k")
        .header("Fencing-Token", t.to_string())
        .header("Idempotency-Key", "shared")
        .send()
        .await
        .unwrap();
    problem(
        delete,
        StatusCode::UNPROCESSABLE_ENTITY,
        "idempotency_key_reused",
    )
    .await;
    assert_eq!(count(&app, "SELECT count(*) FROM leases").await, 1);
    assert_eq!(
        count(&app, "SELECT count(*) FROM snapshot_versions").await,
        0
    );
    app.stop().await;
}

#[tokio::test]
async fn two_idempotency_key_headers_answer_400_and_change_nothing() {
    let app = TestApp::spawn().await;
    let two = |req: reqwest::RequestBuilder| {
        req.header("Idempotency-Key", "one")
            .header("Idempotency-Key", "two")
    };
    let r = two(app.request(Method::POST, "/v1/leases/k"))
        .json(&json!({"owner": "a", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    let body = problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert!(body["detail"].as_str().unwrap().contains("once"), "{body}");
    assert_eq!(count(&app, "SELECT count(*) FROM leases").await, 0);
    // The same on a fenced write and a lease call: refused before anything is read or changed.
    let t = token(&app.acquire("k", "a", 30000).await);
    let r = two(app.request(Method::PUT, "/v1/snapshots/k"))
        .header("Fencing-Token", t.to_string())
        .body("x")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    let r = two(app.request(Method::DELETE, "/v1/leases/k"))
        .header("Fencing-Token", t.to_string())
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert_eq!(
        count(&app, "SELECT count(*) FROM snapshot_versions").await,
        0
    );
    assert_eq!(
        count(&app, "SELECT count(*) FROM leases WHERE end_reason IS NULL").await,
        1
    );
    assert_eq!(
        count(&app, "SELECT count(*) FROM idempotency_records").await,
        0
    );
    app.stop().await;
}
