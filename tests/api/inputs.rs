//! Bad input: every bound of the contract answers `400 invalid_request` (or the code the
//! contract names) with a detail, and changes nothing.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, problem, token};

/// Asserts that an acquire body is refused as invalid and left no lease behind.
async fn refused_acquire(app: &TestApp, key_path: &str, body: &str) -> Value {
    let r = app
        .request(Method::POST, &format!("/v1/leases/{key_path}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let problem = problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    let list: Value = app.get("/v1/leases").await.json().await.unwrap();
    assert_eq!(list["items"], json!([]), "nothing was created by {body}");
    problem
}

#[tokio::test]
async fn a_key_over_512_bytes_is_refused() {
    let app = TestApp::spawn().await;
    let body = r#"{"owner":"w","ttl_ms":1000}"#;
    let p = refused_acquire(&app, &"k".repeat(513), body).await;
    assert!(p["detail"].as_str().unwrap().contains("512"));
    // 512 bytes of two-byte characters is fine.
    let r = app
        .acquire_with(&"é".repeat(256), json!({"owner": "w", "ttl_ms": 1000}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test]
async fn a_key_with_control_characters_or_bad_encoding_is_refused() {
    let app = TestApp::spawn().await;
    let body = r#"{"owner":"w","ttl_ms":1000}"#;
    refused_acquire(&app, "a%0Ab", body).await;
    refused_acquire(&app, "a%00", body).await;
    refused_acquire(&app, "%FF%FE", body).await;
    app.stop().await;
}

#[tokio::test]
async fn a_key_with_a_malformed_percent_escape_is_refused() {
    let app = TestApp::spawn().await;
    let body = r#"{"owner":"w","ttl_ms":1000}"#;
    for bad in ["a%ZZb", "a%2", "a%", "%g0"] {
        let p = refused_acquire(&app, bad, body).await;
        assert!(p["detail"].as_str().unwrap().contains("%25"), "{p}");
    }
    // A `%` in a key is sent as %25.
    let r = app
        .acquire_with("a%ZZb", json!({"owner": "w", "ttl_ms": 1000}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let lease: Value = r.json().await.unwrap();
    assert_eq!(lease["key"], "a%ZZb");
    app.stop().await;
}

#[tokio::test]
async fn a_missing_empty_or_oversized_owner_is_refused() {
    let app = TestApp::spawn().await;
    refused_acquire(&app, "k", r#"{"ttl_ms":1000}"#).await;
    refused_acquire(&app, "k", r#"{"owner":"","ttl_ms":1000}"#).await;
    let long = format!(r#"{{"owner":"{}","ttl_ms":1000}}"#, "o".repeat(257));
    refused_acquire(&app, "k", &long).await;
    refused_acquire(&app, "k", r#"{"owner":7,"ttl_ms":1000}"#).await;
    app.stop().await;
}

#[tokio::test]
async fn a_ttl_outside_the_bounds_or_of_the_wrong_type_is_refused() {
    let app = TestApp::spawn().await;
    for ttl in ["99", "86400001", "-1", "\"1000\"", "1.5", "null"] {
        let p = refused_acquire(&app, "k", &format!(r#"{{"owner":"w","ttl_ms":{ttl}}}"#)).await;
        assert!(p["detail"].as_str().unwrap().contains("ttl_ms"), "{p}");
    }
    refused_acquire(&app, "k", r#"{"owner":"w"}"#).await;
    app.stop().await;
}

#[tokio::test]
async fn metadata_that_is_not_a_small_object_is_refused() {
    let app = TestApp::spawn().await;
    refused_acquire(&app, "k", r#"{"owner":"w","ttl_ms":1000,"metadata":[1]}"#).await;
    refused_acquire(&app, "k", r#"{"owner":"w","ttl_ms":1000,"metadata":"x"}"#).await;
    let big = format!(
        r#"{{"owner":"w","ttl_ms":1000,"metadata":{{"x":"{}"}}}}"#,
        "y".repeat(4096)
    );
    refused_acquire(&app, "k", &big).await;
    app.stop().await;
}

#[tokio::test]
async fn unknown_fields_and_malformed_json_are_refused() {
    let app = TestApp::spawn().await;
    let p = refused_acquire(&app, "k", r#"{"owner":"w","ttl_ms":1000,"ttl":5}"#).await;
    assert!(p["detail"].as_str().unwrap().contains("ttl"), "{p}");
    refused_acquire(&app, "k", r#"{"owner":"w","#).await;
    refused_acquire(&app, "k", "").await;
    refused_acquire(&app, "k", "[]").await;
    refused_acquire(
        &app,
        "k",
        r#"{"owner":"w","ttl_ms":1000,"crash_recovery":"yes"}"#,
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_field_of_the_wrong_type_is_named_in_the_detail() {
    let app = TestApp::spawn().await;
    let p = refused_acquire(
        &app,
        "k",
        r#"{"owner":"w","ttl_ms":1000,"crash_recovery":"yes"}"#,
    )
    .await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("request body field `crash_recovery`: "),
        "{p}"
    );
    let r = app
        .request(Method::POST, "/v1/txn")
        .header("Fencing-Key", "ns")
        .header("Fencing-Token", "1")
        .body(r#"{"ops":[{"op":"delete","key":"ns/a"},{"op":"delete","key":7}]}"#)
        .send()
        .await
        .unwrap();
    let p = problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("request body field `ops[1]`: "),
        "{p}"
    );
    app.stop().await;
}

#[tokio::test]
async fn malformed_fencing_tokens_are_refused_and_change_nothing() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "w", 30000).await);
    for bad in [
        "abc",
        "0",
        "-1",
        "+1",
        "1.0",
        "9223372036854775808",
        "0x1",
        " ",
    ] {
        let r = app
            .request(Method::DELETE, "/v1/leases/k")
            .header("Fencing-Token", bad)
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let r = app
        .request(Method::DELETE, "/v1/leases/k")
        .header("Fencing-Token", t.to_string())
        .header("Fencing-Token", t.to_string())
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    let s: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(s["state"], "held");
    app.stop().await;
}

#[tokio::test]
async fn the_largest_token_is_well_formed() {
    let app = TestApp::spawn().await;
    app.acquire("k", "w", 30000).await;
    let r = app
        .request(Method::DELETE, "/v1/leases/k")
        .header("Fencing-Token", "9223372036854775807")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::CONFLICT, "lease_lost").await;
    app.stop().await;
}

#[tokio::test]
async fn renew_refuses_tokens_out_of_range_and_of_the_wrong_type() {
    let app = TestApp::spawn().await;
    app.acquire("k", "w", 30000).await;
    for body in [
        r#"{"token":0}"#,
        r#"{"token":-3}"#,
        r#"{"token":9223372036854775808}"#,
        r#"{"token":"17"}"#,
        r#"{"token":1.5}"#,
        r#"{}"#,
        r#"{"token":1,"ttl_ms":5}"#,
        r#"{"token":1,"extra":true}"#,
    ] {
        let r = app
            .request(Method::POST, "/v1/leases/k/renew")
            .body(body)
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}

#[tokio::test]
async fn list_refuses_bad_limits_cursors_states_and_unknown_parameters() {
    let app = TestApp::spawn().await;
    for query in [
        "limit=0",
        "limit=1001",
        "limit=ten",
        "cursor=%25%25",
        "state=gone",
        "colour=blue",
    ] {
        let r = app.get(&format!("/v1/leases?{query}")).await;
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let r = app.get("/v1/leases?limit=1000").await;
    assert_eq!(r.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn integers_written_as_floats_without_a_fraction_are_accepted() {
    let app = TestApp::spawn().await;
    let r = app
        .request(Method::POST, "/v1/leases/k")
        .body(r#"{"owner":"w","ttl_ms":30000.0}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let t = token(&r.json().await.unwrap());
    let r = app
        .request(Method::POST, "/v1/leases/k/renew")
        .body(format!(r#"{{"token":{t}.0,"ttl_ms":1000.0}}"#))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn a_cursor_that_decodes_to_a_nul_byte_is_a_position_not_a_server_error() {
    let app = TestApp::spawn().await;
    app.acquire("b", "w", 30000).await;
    // "YQBi" is base64url of "a\0b".
    let r = app.get("/v1/leases?cursor=YQBi").await;
    assert_eq!(r.status(), StatusCode::OK);
    let page: Value = r.json().await.unwrap();
    assert_eq!(page["items"][0]["key"], "b");
    app.stop().await;
}

#[tokio::test]
async fn metadata_holding_a_nul_character_is_stored_and_shown_as_sent() {
    let app = TestApp::spawn().await;
    let metadata = json!({"x": "a\u{0}b", "n\u{0}": [{"deep": "\u{0}"}]});
    let r = app
        .acquire_with(
            "k",
            json!({"owner": "w", "ttl_ms": 100, "metadata": metadata}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.json::<Value>().await.unwrap()["metadata"], metadata);
    let status: Value = app.get("/v1/leases/k").await.json().await.unwrap();
    assert_eq!(status["lease"]["metadata"], metadata);
    app.stop().await;
}

#[tokio::test]
async fn a_query_string_on_a_call_that_takes_none_is_refused_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "w", 60_000).await);
    let put = app
        .request(Method::PUT, "/v1/snapshots/k?versionId=3")
        .header("Fencing-Token", t.to_string())
        .body("x")
        .send()
        .await
        .unwrap();
    problem(put, StatusCode::BAD_REQUEST, "invalid_request").await;
    let read = app.get("/v1/snapshots/k?versionId=3").await;
    problem(read, StatusCode::BAD_REQUEST, "invalid_request").await;
    let acquire = app
        .request(Method::POST, "/v1/leases/other?ttl_ms=5")
        .json(&json!({"owner": "w", "ttl_ms": 1000}))
        .send()
        .await
        .unwrap();
    problem(acquire, StatusCode::BAD_REQUEST, "invalid_request").await;
    // Nothing was written or granted; a bare `?` is no parameter.
    assert_eq!(
        app.get("/v1/snapshots/k?").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/v1/leases/other?").await.status(),
        StatusCode::NOT_FOUND
    );
    app.stop().await;
}

#[tokio::test]
async fn an_empty_key_segment_is_refused_and_a_trailing_slash_is_no_route() {
    let app = TestApp::spawn().await;
    let renew = app
        .request(Method::POST, "/v1/leases//renew")
        .json(&json!({"token": 1}))
        .send()
        .await
        .unwrap();
    problem(renew, StatusCode::BAD_REQUEST, "invalid_request").await;
    let versions = app.get("/v1/snapshots//versions").await;
    problem(versions, StatusCode::BAD_REQUEST, "invalid_request").await;
    let slash = app.get("/v1/snapshots/").await;
    problem(slash, StatusCode::NOT_FOUND, "not_found").await;
    app.stop().await;
}

#[tokio::test]
async fn a_prefix_sent_twice_is_refused() {
    let app = TestApp::spawn().await;
    for path in [
        "/v1/watch?prefix=a&prefix=b",
        "/v1/leases?prefix=a&prefix=b",
        "/v1/leases?prefix=a&prefix=a",
    ] {
        let body = problem(
            app.get(path).await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        assert!(
            body["detail"].as_str().unwrap().contains("prefix"),
            "{path}: {body}"
        );
    }
    // A key confined to a prefix cannot pass its check with one and be served the other.
    let reader = app
        .make_key("confined", snapfence::domain::Scope::Read, "a/")
        .await;
    for path in [
        "/v1/watch?prefix=a/&prefix=b",
        "/v1/watch?prefix=b&prefix=a/",
        "/v1/leases?prefix=a/&prefix=b",
    ] {
        let r = app
            .request(Method::GET, path)
            .header("Authorization", format!("Bearer {reader}"))
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}

#[tokio::test]
async fn a_query_value_that_is_not_well_encoded_utf8_is_400_everywhere() {
    let app = TestApp::spawn().await;
    for path in [
        "/v1/watch?prefix=%FF",
        "/v1/watch?prefix=%C0%AF",
        "/v1/watch?prefix=%ED%A0%80",
        "/v1/snapshots?prefix=%FF",
        "/v1/leases?prefix=%",
        "/v1/leases?prefix=%zz",
        "/v1/audit/rejections?key=a%2",
    ] {
        let r = app.get(path).await;
        let p = problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
        assert!(
            p["detail"].as_str().unwrap().contains("percent-encoded"),
            "{path}: {p}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn a_watch_sent_last_event_id_twice_is_400() {
    let app = TestApp::spawn().await;
    let r = app
        .request(reqwest::Method::GET, "/v1/watch")
        .header("Last-Event-ID", "0")
        .header("Last-Event-ID", "5")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.stop().await;
}
