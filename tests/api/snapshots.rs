//! Fenced snapshots: one test per rule of the contract's snapshot section.

use std::time::Duration;

use futures_util::{StreamExt, stream};
use rand::RngCore;
use reqwest::{Body, Method, StatusCode};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::harness::{Instance, TestApp, problem, rules, token};

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::rng().fill_bytes(&mut v);
    v
}

async fn rejection_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM rejections")
        .fetch_one(app.db())
        .await
        .unwrap()
}

#[tokio::test]
async fn the_first_write_answers_201_and_later_ones_200_counting_versions_from_one() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let first = app.put("k", t, "one").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(first.json::<Value>().await.unwrap()["version"], 1);
    for v in 2..=4 {
        let r = app.put("k", t, format!("v{v}")).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.json::<Value>().await.unwrap()["version"], v);
    }
    app.stop().await;
}

#[tokio::test]
async fn an_accepted_write_answers_every_field_and_the_etag_header() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("jobs/1", "a", 30000).await);
    let r = app
        .request(Method::PUT, "/v1/snapshots/jobs%2F1")
        .header("Fencing-Token", t.to_string())
        .header("Content-Type", "application/json")
        .body(r#"{"step":3}"#)
        .send()
        .await
        .unwrap();
    let etag = r.headers()["etag"].to_str().unwrap().to_string();
    let w: Value = r.json().await.unwrap();
    assert_eq!(w["key"], "jobs/1");
    assert_eq!(w["version"], 1);
    assert_eq!(w["token"], t);
    assert_eq!(w["etag"], etag.as_str());
    assert!(
        etag.starts_with('"') && etag.ends_with('"') && etag.len() == 66,
        "{etag}"
    );
    assert_eq!(w["size"], 10);
    assert_eq!(w["content_type"], "application/json");
    assert!(w["updated_at"].as_str().unwrap().ends_with('Z'));
    app.stop().await;
}

#[tokio::test]
async fn get_returns_random_binary_bytes_exactly_with_the_contract_headers() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("bin", "a", 30000).await);
    let body = random_bytes(200_000);
    let w: Value = app
        .request(Method::PUT, "/v1/snapshots/bin")
        .header("Fencing-Token", t.to_string())
        .header("Content-Type", "image/png")
        .body(body.clone())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let r = app.get("/v1/snapshots/bin").await;
    assert_eq!(r.status(), StatusCode::OK);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "image/png");
    assert_eq!(h["etag"], w["etag"].as_str().unwrap());
    assert_eq!(h["fencing-token"], t.to_string().as_str());
    assert_eq!(h["snapshot-version"], "1");
    let modified = h["last-modified"].to_str().unwrap();
    assert!(modified.ends_with(" GMT"), "{modified}");
    assert_eq!(r.bytes().await.unwrap().as_ref(), body.as_slice());
    app.stop().await;
}

#[tokio::test]
async fn the_content_type_defaults_to_octet_stream() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let w: Value = app.put("k", t, vec![1u8, 2, 3]).await.json().await.unwrap();
    assert_eq!(w["content_type"], "application/octet-stream");
    let r = app.get("/v1/snapshots/k").await;
    assert_eq!(r.headers()["content-type"], "application/octet-stream");
    app.stop().await;
}

#[tokio::test]
async fn head_answers_the_headers_without_the_body() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    app.put("k", t, "twelve bytes").await;
    let r = app
        .request(Method::HEAD, "/v1/snapshots/k")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["snapshot-version"], "1");
    assert_eq!(r.headers()["content-length"], "12");
    assert!(r.headers().contains_key("etag"));
    assert!(r.bytes().await.unwrap().is_empty());
    app.stop().await;
}

#[tokio::test]
async fn if_none_match_with_the_current_etag_answers_304() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let etag = app.put("k", t, "x").await.headers()["etag"].clone();
    let r = app
        .request(Method::GET, "/v1/snapshots/k")
        .header("If-None-Match", etag.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(r.headers()["etag"], etag);
    let r = app
        .request(Method::GET, "/v1/snapshots/k")
        .header("If-None-Match", "\"something-else\"")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn a_weak_if_none_match_of_the_current_etag_answers_304_on_get_and_head_of_snapshot_and_version()
 {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let etag = app.put("k", t, "x").await.headers()["etag"].clone();
    let weak = format!("W/{}", etag.to_str().unwrap());
    for method in [Method::GET, Method::HEAD] {
        for path in ["/v1/snapshots/k", "/v1/snapshots/k/versions/1"] {
            let r = app
                .request(method.clone(), path)
                .header("If-None-Match", &weak)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{method} {path}");
            assert_eq!(r.headers()["etag"], etag);
        }
    }
    app.stop().await;
}

#[tokio::test]
async fn if_none_match_star_or_a_list_naming_the_current_etag_answers_304_and_any_other_the_body() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let etag = app.put("k", t, "the bytes").await.headers()["etag"].clone();
    let etag = etag.to_str().unwrap();
    let get = |condition: String| {
        app.request(Method::GET, "/v1/snapshots/k")
            .header("If-None-Match", condition)
            .send()
    };
    for condition in [
        "*".to_owned(),
        format!("\"other\", W/{etag}"),
        format!("\"other\",{etag}"),
    ] {
        let r = get(condition.clone()).await.unwrap();
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{condition}");
        assert!(r.bytes().await.unwrap().is_empty(), "{condition}");
    }
    for condition in ["\"other\"", "W/\"other\", \"another\""] {
        let r = get(condition.to_owned()).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{condition}");
        assert_eq!(r.bytes().await.unwrap(), "the bytes", "{condition}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_weak_if_match_never_matches_the_current_etag() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let etag = app.put("k", t, "one").await.headers()["etag"].clone();
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", t.to_string())
        .header("If-Match", format!("W/{}", etag.to_str().unwrap()))
        .body("two")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::PRECONDITION_FAILED, "precondition_failed").await;
    assert_eq!(
        app.get("/v1/snapshots/k").await.text().await.unwrap(),
        "one"
    );
    app.stop().await;
}

#[tokio::test]
async fn if_match_writes_on_a_match_and_answers_412_otherwise_changing_nothing() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let etag = app.put("k", t, "one").await.headers()["etag"].clone();
    let put_if = |tag: &str, body: &'static str| {
        app.request(Method::PUT, "/v1/snapshots/k")
            .header("Fencing-Token", t.to_string())
            .header("If-Match", tag)
            .body(body)
            .send()
    };
    let r = put_if("\"0000\"", "two").await.unwrap();
    problem(r, StatusCode::PRECONDITION_FAILED, "precondition_failed").await;
    assert_eq!(
        app.get("/v1/snapshots/k").await.text().await.unwrap(),
        "one"
    );
    let r = put_if(etag.to_str().unwrap(), "two").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.json::<Value>().await.unwrap()["version"], 2);
    let r = put_if("*", "three").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        rejection_count(&app).await,
        0,
        "a 412 is not a fencing refusal"
    );
    app.stop().await;
}

#[tokio::test]
async fn if_match_on_a_key_without_a_snapshot_answers_412() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", t.to_string())
        .header("If-Match", "*")
        .body("x")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::PRECONDITION_FAILED, "precondition_failed").await;
    problem(
        app.get("/v1/snapshots/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_lower_token_is_refused_as_stale_and_the_snapshot_is_unchanged() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 150).await);
    app.put("k", a, "from a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = token(&app.acquire("k", "b", 30000).await);
    app.put("k", b, "from b").await;
    let body = problem(
        app.put("k", a, "late a").await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(body["presented_token"], a);
    assert_eq!(body["highest_token"], b);
    assert!(body["audit_id"].as_i64().is_some());
    assert_eq!(
        app.get("/v1/snapshots/k").await.text().await.unwrap(),
        "from b"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_superseded_holder_is_refused_even_before_its_successor_writes() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 150).await);
    app.put("k", a, "from a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = token(&app.acquire("k", "b", 30000).await);
    let body = problem(
        app.put("k", a, "late a").await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(body["highest_token"], b);
    let snap = app.get("/v1/snapshots/k").await;
    assert_eq!(snap.headers()["fencing-token"], a.to_string().as_str());
    assert_eq!(snap.text().await.unwrap(), "from a");
    let audit: Value = app
        .get("/v1/audit/rejections?key=k")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(audit["items"][0]["id"], body["audit_id"]);
    assert_eq!(audit["items"][0]["reason"], "stale_token");
    assert_eq!(audit["items"][0]["highest_token"], b);
    assert_eq!(audit["items"][0]["holder"], "b");
    app.stop().await;
}

#[tokio::test]
async fn a_higher_token_is_refused_as_unknown() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 30000).await);
    let body = problem(
        app.put("k", a + 1, "x").await,
        StatusCode::CONFLICT,
        "unknown_token",
    )
    .await;
    assert_eq!(body["presented_token"], a + 1);
    assert_eq!(body["highest_token"], a);
    app.stop().await;
}

#[tokio::test]
async fn a_write_to_a_key_that_never_had_a_lease_is_refused_as_unknown() {
    let app = TestApp::spawn().await;
    let body = problem(
        app.put("fresh", 5, "x").await,
        StatusCode::CONFLICT,
        "unknown_token",
    )
    .await;
    assert_eq!(body["highest_token"], Value::Null);
    assert_eq!(rejection_count(&app).await, 1);
    app.stop().await;
}

#[tokio::test]
async fn a_token_of_another_key_is_refused() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("a", "w", 30000).await);
    let b = token(&app.acquire("b", "w", 30000).await);
    problem(
        app.put("b", a, "x").await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    problem(
        app.put("a", b, "x").await,
        StatusCode::CONFLICT,
        "unknown_token",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_released_lease_can_no_longer_write() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 30000).await);
    app.release("k", a).await;
    let body = problem(
        app.put("k", a, "x").await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(body["highest_token"], a);
    app.stop().await;
}

#[tokio::test]
async fn an_expired_lease_with_no_newer_grant_may_still_write() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 120).await);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(app.put("k", a, "x").await.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test]
async fn a_write_without_a_token_answers_428_and_a_malformed_one_400_auditing_neither() {
    let app = TestApp::spawn().await;
    token(&app.acquire("k", "a", 30000).await);
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .body("x")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::PRECONDITION_REQUIRED, "token_required").await;
    for bad in ["x", "0", "-4", "99999999999999999999"] {
        let r = app
            .request(Method::PUT, "/v1/snapshots/k")
            .header("Fencing-Token", bad)
            .body("x")
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", "1")
        .header("If-Match", "\"unterminated")
        .body("x")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert_eq!(rejection_count(&app).await, 0);
    problem(
        app.get("/v1/snapshots/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn old_versions_are_retained_newest_first_and_pruned_past_the_limit() {
    let mut r = rules();
    r.keep_versions = 3;
    let app = TestApp::spawn_with(r).await;
    let t = token(&app.acquire("k", "a", 30000).await);
    for v in 1..=5 {
        app.put("k", t, format!("body {v}")).await;
    }
    let page: Value = app
        .get("/v1/snapshots/k/versions")
        .await
        .json()
        .await
        .unwrap();
    let versions: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["version"].as_i64().unwrap())
        .collect();
    assert_eq!(versions, [5, 4, 3]);
    assert_eq!(page["items"][0]["token"], t);
    assert_eq!(page["next_cursor"], Value::Null);
    let v4 = app.get("/v1/snapshots/k/versions/4").await;
    assert_eq!(v4.headers()["snapshot-version"], "4");
    assert_eq!(v4.text().await.unwrap(), "body 4");
    let pruned = app.get("/v1/snapshots/k/versions/2").await;
    problem(pruned, StatusCode::NOT_FOUND, "not_found").await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM snapshot_versions")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(rows, 3, "pruned rows are deleted, not only hidden");
    app.stop().await;
}

/// The rows of `k`'s versions, oldest first.
async fn stored_versions(app: &TestApp) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM snapshot_versions WHERE key = 'k' ORDER BY version")
        .fetch_all(app.db())
        .await
        .unwrap()
}

/// Writes versions `versions` of `k` with `token` through `instance`.
async fn write_through(
    app: &TestApp,
    instance: &Instance,
    token: i64,
    versions: std::ops::RangeInclusive<i64>,
) {
    for v in versions {
        let r = app
            .request_to(instance, Method::PUT, "/v1/snapshots/k")
            .header("Fencing-Token", token.to_string())
            .body(format!("body {v}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16() / 100, 2, "write {v}");
    }
}

#[tokio::test]
async fn instances_keeping_fewer_and_more_versions_each_prune_what_falls_out_of_their_window() {
    let mut r = rules();
    r.keep_versions = 5;
    let app = TestApp::spawn_with(r).await;
    let mut fewer = rules();
    fewer.keep_versions = 2;
    let fewer = Instance::start(app.options.clone(), fewer).await;
    let t = token(&app.acquire("k", "a", 30000).await);
    write_through(&app, &app.instance, t, 1..=10).await;
    assert_eq!(stored_versions(&app).await, [6, 7, 8, 9, 10]);
    write_through(&app, &fewer, t, 11..=11).await;
    assert_eq!(stored_versions(&app).await, [10, 11]);
    write_through(&app, &app.instance, t, 12..=14).await;
    assert_eq!(stored_versions(&app).await, [10, 11, 12, 13, 14]);
    write_through(&app, &app.instance, t, 15..=15).await;
    assert_eq!(stored_versions(&app).await, [11, 12, 13, 14, 15]);
    fewer.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn versions_page_with_a_cursor() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    for v in 1..=7 {
        app.put("k", t, format!("{v}")).await;
    }
    let mut seen = Vec::new();
    let mut path = "/v1/snapshots/k/versions?limit=3".to_string();
    loop {
        let page: Value = app.get(&path).await.json().await.unwrap();
        seen.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["version"].as_i64().unwrap()),
        );
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/snapshots/k/versions?limit=3&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, [7, 6, 5, 4, 3, 2, 1]);
    app.stop().await;
}

#[tokio::test]
async fn snapshot_reads_of_unknown_keys_and_versions_are_not_found() {
    let app = TestApp::spawn().await;
    problem(
        app.get("/v1/snapshots/none").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    problem(
        app.get("/v1/snapshots/none/versions").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let t = token(&app.acquire("k", "a", 30000).await);
    app.put("k", t, "x").await;
    problem(
        app.get("/v1/snapshots/k/versions/9").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let r = app.get("/v1/snapshots/k/versions/zero").await;
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.stop().await;
}

#[tokio::test]
async fn a_fenced_delete_removes_the_snapshot_and_its_versions() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    app.put("k", t, "one").await;
    app.put("k", t, "two").await;
    let del = |token: i64| {
        app.request(Method::DELETE, "/v1/snapshots/k")
            .header("Fencing-Token", token.to_string())
            .send()
    };
    assert_eq!(del(t).await.unwrap().status(), StatusCode::NO_CONTENT);
    problem(
        app.get("/v1/snapshots/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    problem(
        app.get("/v1/snapshots/k/versions/1").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    // Deleting what is already gone is not an error, as in S3.
    assert_eq!(del(t).await.unwrap().status(), StatusCode::NO_CONTENT);
    // The next write creates the snapshot again; version numbers are never reused.
    let r = app.put("k", t, "three").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.json::<Value>().await.unwrap()["version"], 3);
    app.stop().await;
}

#[tokio::test]
async fn a_stale_delete_is_refused_audited_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let a = token(&app.acquire("k", "a", 120).await);
    app.put("k", a, "keep me").await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    token(&app.acquire("k", "b", 30000).await);
    let r = app
        .request(Method::DELETE, "/v1/snapshots/k")
        .header("Fencing-Token", a.to_string())
        .send()
        .await
        .unwrap();
    let body = problem(r, StatusCode::CONFLICT, "stale_token").await;
    assert_eq!(
        app.get("/v1/snapshots/k").await.text().await.unwrap(),
        "keep me"
    );
    let audit: Value = app.get("/v1/audit/rejections").await.json().await.unwrap();
    assert_eq!(audit["items"][0]["id"], body["audit_id"]);
    assert_eq!(audit["items"][0]["operation"], "delete");
    let r = app
        .request(Method::DELETE, "/v1/snapshots/k")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::PRECONDITION_REQUIRED, "token_required").await;
    app.stop().await;
}

fn small_limit() -> snapfence::Rules {
    let mut r = rules();
    r.max_snapshot_bytes = 1024;
    r
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413_and_nothing_is_stored() {
    let app = TestApp::spawn_with(small_limit()).await;
    let t = token(&app.acquire("k", "a", 30000).await);
    assert_eq!(
        app.put("k", t, vec![7u8; 1024]).await.status(),
        StatusCode::CREATED
    );
    let r = app.put("k", t, vec![8u8; 1025]).await;
    problem(r, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    let current = app.get("/v1/snapshots/k").await;
    assert_eq!(current.headers()["snapshot-version"], "1");
    assert_eq!(
        current.bytes().await.unwrap().as_ref(),
        vec![7u8; 1024].as_slice()
    );
    app.stop().await;
}

#[tokio::test]
async fn an_endless_upload_without_a_length_is_cut_off_at_the_limit() {
    let app = TestApp::spawn_with(small_limit()).await;
    let t = token(&app.acquire("k", "a", 30000).await);
    // A chunked body that would never end: the server must answer without reading it all.
    let endless = stream::repeat_with(|| Ok::<_, std::io::Error>(vec![0u8; 256])).take(1_000_000);
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", t.to_string())
        .body(Body::wrap_stream(endless))
        .send()
        .await;
    let r = r.expect("the server answers while the client is still sending");
    problem(r, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    problem(
        app.get("/v1/snapshots/k").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM snapshot_versions")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(rows, 0);
    app.stop().await;
}

/// A body large enough to be uploaded before its fenced write rather than bound to it.
fn uploaded_body() -> Vec<u8> {
    random_bytes(snapfence::store::snapshots::UPLOAD_FROM + 12345)
}

#[tokio::test]
async fn a_large_body_is_stored_and_read_back_byte_for_byte_version_after_version() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("big", "a", 30000).await);
    let (one, two) = (uploaded_body(), uploaded_body());
    assert_eq!(
        app.put("big", t, one.clone()).await.status(),
        StatusCode::CREATED
    );
    let r = app.put("big", t, two.clone()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let w: Value = r.json().await.unwrap();
    assert_eq!(
        (w["version"].as_i64(), w["size"].as_u64()),
        (Some(2), Some(two.len() as u64))
    );
    let current = app.get("/v1/snapshots/big").await;
    assert_eq!(current.headers()["snapshot-version"], "2");
    assert_eq!(current.bytes().await.unwrap(), two);
    let first = app.get("/v1/snapshots/big/versions/1").await;
    assert_eq!(first.bytes().await.unwrap(), one);
    let head = app
        .request(Method::HEAD, "/v1/snapshots/big/versions/1")
        .send()
        .await
        .unwrap();
    assert_eq!(
        head.headers()["content-length"],
        one.len().to_string().as_str()
    );
    app.stop().await;
}

#[tokio::test]
async fn a_large_write_with_a_stale_token_is_refused_audited_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let old = token(&app.acquire("big", "a", 100).await);
    let kept = uploaded_body();
    assert_eq!(
        app.put("big", old, kept.clone()).await.status(),
        StatusCode::CREATED
    );
    tokio::time::sleep(Duration::from_millis(150)).await;
    token(&app.acquire("big", "b", 30000).await);
    let body = problem(
        app.put("big", old, uploaded_body()).await,
        StatusCode::CONFLICT,
        "stale_token",
    )
    .await;
    assert_eq!(body["presented_token"], old);
    assert_eq!(rejection_count(&app).await, 1);
    let stored: (i64, i64) =
        sqlx::query_as("SELECT count(*), max(version) FROM snapshot_versions WHERE key = 'big'")
            .fetch_one(app.db())
            .await
            .unwrap();
    assert_eq!(stored, (1, 1));
    assert_eq!(
        app.get("/v1/snapshots/big").await.bytes().await.unwrap(),
        kept
    );
    app.stop().await;
}

#[tokio::test]
async fn a_large_write_with_a_wrong_if_match_answers_412_and_the_connection_serves_on() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("big", "a", 30000).await);
    let first = app.put("big", t, uploaded_body()).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    for _ in 0..3 {
        let r = app
            .request(Method::PUT, "/v1/snapshots/big")
            .header("Fencing-Token", t.to_string())
            .header("If-Match", "\"not-the-etag\"")
            .body(uploaded_body())
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::PRECONDITION_FAILED, "precondition_failed").await;
    }
    // Small and large writes after the refusals, on the same pool of connections.
    assert_eq!(app.put("big", t, "small").await.status(), StatusCode::OK);
    let last = uploaded_body();
    let r = app.put("big", t, last.clone()).await;
    assert_eq!(r.json::<Value>().await.unwrap()["version"], 3);
    assert_eq!(
        app.get("/v1/snapshots/big").await.bytes().await.unwrap(),
        last
    );
    app.stop().await;
}

/// A token of `k` that a newer grant superseded.
async fn superseded_token(app: &TestApp) -> i64 {
    let old = token(&app.acquire("k", "a", 100).await);
    tokio::time::sleep(Duration::from_millis(150)).await;
    app.acquire("k", "b", 30000).await;
    old
}

/// The head of a PUT to `k` with `token` and a body of `length` bytes (not sent), with
/// `extra` headers.
fn withheld_put(token: i64, length: usize, extra: &str) -> String {
    format!(
        "PUT /v1/snapshots/k HTTP/1.1\r\nhost: x\r\nfencing-token: {token}\r\n\
         content-length: {length}\r\n{extra}\r\n"
    )
}

#[tokio::test]
async fn a_stale_token_is_refused_and_audited_before_the_body_is_sent() {
    let app = TestApp::spawn().await;
    let old = superseded_token(&app).await;
    let mut stream = crate::raw::connect(&app.instance.base).await;
    let head = withheld_put(old, 4 * 1024 * 1024, "");
    stream.write_all(head.as_bytes()).await.unwrap();
    // No byte of the body is ever sent: the answer comes from the head alone.
    let answer = crate::raw::read_answer(&mut stream).await;
    let p = answer.problem(409, "stale_token");
    assert!(p["audit_id"].is_i64());
    assert_eq!(rejection_count(&app).await, 1);
    app.stop().await;
}

#[tokio::test]
async fn a_refusal_before_the_body_is_replayed_for_its_idempotency_key_whatever_the_body() {
    let app = TestApp::spawn().await;
    let old = superseded_token(&app).await;
    let mut stream = crate::raw::connect(&app.instance.base).await;
    let head = withheld_put(old, 1000, "idempotency-key: early\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let first = crate::raw::read_answer(&mut stream).await;
    let first = first.problem(409, "stale_token");
    // Sent again whole, with its key: the refusal is the answer, and it is not audited twice.
    let again = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", old.to_string())
        .header("Idempotency-Key", "early")
        .body(vec![b'x'; 1000])
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let again = problem(again, StatusCode::CONFLICT, "stale_token").await;
    assert_eq!(again["audit_id"], first["audit_id"]);
    assert_eq!(rejection_count(&app).await, 1);
    app.stop().await;
}

#[tokio::test]
async fn a_live_token_whose_body_comes_after_its_head_is_written() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    let mut stream = crate::raw::connect(&app.instance.base).await;
    let head = withheld_put(t, 5, "expect: 100-continue\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    // The token passed its check before the body was read; the body is asked for.
    assert_eq!(crate::raw::read_answer(&mut stream).await.status, 100);
    stream.write_all(b"later").await.unwrap();
    let answer = crate::raw::read_answer(&mut stream).await;
    assert_eq!(answer.status, 201);
    let stored = app.get("/v1/snapshots/k").await.bytes().await.unwrap();
    assert_eq!(&stored[..], b"later");
    app.stop().await;
}

#[tokio::test]
async fn a_stale_token_that_asked_to_continue_is_refused_instead_of_told_to_send_its_body() {
    let app = TestApp::spawn().await;
    let old = superseded_token(&app).await;
    let mut stream = crate::raw::connect(&app.instance.base).await;
    let head = withheld_put(old, 1000, "expect: 100-continue\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = crate::raw::read_answer(&mut stream).await;
    answer.problem(409, "stale_token");
    assert_eq!(rejection_count(&app).await, 1);
    app.stop().await;
}

/// Writes a snapshot of each of `keys`, each under a lease of its own.
async fn write_each(app: &TestApp, keys: &[&str]) {
    for key in keys {
        let t = token(&app.acquire(key, "a", 30000).await);
        assert!(
            app.put(key, t, format!("body of {key}"))
                .await
                .status()
                .is_success()
        );
    }
}

/// The keys of a list of snapshots.
fn listed_keys(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn listing_snapshots_answers_the_keys_with_a_current_snapshot_in_byte_order() {
    let app = TestApp::spawn().await;
    write_each(&app, &["b", "a", "Z"]).await;
    let t = token(&app.acquire("deleted", "a", 30000).await);
    app.put("deleted", t, "gone soon").await;
    let deleted = app
        .request(Method::DELETE, "/v1/snapshots/deleted")
        .header("Fencing-Token", t.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    app.acquire("leased-only", "a", 30000).await;
    let page: Value = app.get("/v1/snapshots").await.json().await.unwrap();
    assert_eq!(listed_keys(&page), ["Z", "a", "b"]);
    assert_eq!(page["next_cursor"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn a_listed_snapshot_has_the_metadata_of_its_current_version() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    app.put("k", t, "one").await;
    let written: Value = app.put("k", t, "second").await.json().await.unwrap();
    let page: Value = app
        .get("/v1/snapshots?include=metadata")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["items"], serde_json::json!([written]));
    app.stop().await;
}

#[tokio::test]
async fn listing_snapshots_pages_through_next_cursor_without_gap_or_repeat() {
    let app = TestApp::spawn().await;
    write_each(&app, &["k1", "k2", "k3", "k4", "k5"]).await;
    let mut seen = Vec::new();
    let mut path = "/v1/snapshots?limit=2".to_owned();
    loop {
        let page: Value = app.get(&path).await.json().await.unwrap();
        assert!(page["items"].as_array().unwrap().len() <= 2);
        seen.extend(listed_keys(&page).into_iter().map(str::to_owned));
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/snapshots?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, ["k1", "k2", "k3", "k4", "k5"]);
    app.stop().await;
}

#[tokio::test]
async fn listing_snapshots_by_prefix_answers_only_the_keys_that_start_with_it() {
    let app = TestApp::spawn().await;
    write_each(&app, &["jobs/1", "jobs/2", "jobsx", "other"]).await;
    let page: Value = app
        .get("/v1/snapshots?prefix=jobs%2F")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed_keys(&page), ["jobs/1", "jobs/2"]);
    app.stop().await;
}

#[tokio::test]
async fn a_prefixed_api_key_lists_snapshots_only_under_its_prefix() {
    let app = TestApp::spawn().await;
    write_each(&app, &["jobs/1", "other"]).await;
    let jobs = app
        .make_key("jobs", snapfence::domain::Scope::Read, "jobs/")
        .await;
    let list = |path: &str| {
        app.request(Method::GET, path)
            .header("Authorization", format!("Bearer {jobs}"))
            .send()
    };
    for outside in ["/v1/snapshots", "/v1/snapshots?prefix=j"] {
        problem(
            list(outside).await.unwrap(),
            StatusCode::FORBIDDEN,
            "forbidden",
        )
        .await;
    }
    let page: Value = list("/v1/snapshots?prefix=jobs%2F")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed_keys(&page), ["jobs/1"]);
    app.stop().await;
}

#[tokio::test]
async fn listing_snapshots_with_a_bad_limit_cursor_prefix_or_parameter_is_invalid_request() {
    let app = TestApp::spawn().await;
    for query in [
        "limit=0",
        "limit=1001",
        "limit=ten",
        "cursor=%21%21",
        "prefix=a%01",
        "after=a",
    ] {
        let r = app.get(&format!("/v1/snapshots?{query}")).await;
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}
