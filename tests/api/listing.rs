//! Snapshot metadata and the ordered listing of snapshot keys (contract v1.3).

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, problem, token};

/// Writes `key` fenced by its own new lease, with `Snapshot-Metadata` when given.
async fn write(app: &TestApp, key: &str, metadata: Option<&str>) -> reqwest::Response {
    let t = token(&app.acquire(key, "w", 30000).await);
    let mut req = app
        .request(
            Method::PUT,
            &format!("/v1/snapshots/{}", crate::harness::enc(key)),
        )
        .header("Fencing-Token", t.to_string())
        .body(format!("body of {key}"));
    if let Some(m) = metadata {
        req = req.header("Snapshot-Metadata", m);
    }
    req.send().await.unwrap()
}

fn keys(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn snapshot_metadata_comes_back_on_get_in_versions_and_in_listings() {
    let app = TestApp::spawn().await;
    let w = write(&app, "m", Some(r#"{"step": 7, "source": "loop"}"#)).await;
    assert_eq!(w.status(), StatusCode::CREATED);
    let written: Value = w.json().await.unwrap();
    assert_eq!(written["metadata"], json!({"step": 7, "source": "loop"}));
    let got = app.get("/v1/snapshots/m").await;
    let header: Value =
        serde_json::from_str(got.headers()["snapshot-metadata"].to_str().unwrap()).unwrap();
    assert_eq!(header, json!({"step": 7, "source": "loop"}));
    let versions: Value = app
        .get("/v1/snapshots/m/versions")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(versions["items"][0]["metadata"]["step"], 7);
    let listed: Value = app
        .get("/v1/snapshots?include=metadata")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["items"][0]["metadata"]["source"], "loop");
    let bare: Value = app.get("/v1/snapshots").await.json().await.unwrap();
    assert!(bare["items"][0].get("metadata").is_none(), "{bare}");
    app.stop().await;
}

#[tokio::test]
async fn a_version_without_metadata_says_null_and_sends_no_header() {
    let app = TestApp::spawn().await;
    write(&app, "m", None).await;
    let got = app.get("/v1/snapshots/m").await;
    assert!(got.headers().get("snapshot-metadata").is_none());
    let versions: Value = app
        .get("/v1/snapshots/m/versions")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(versions["items"][0]["metadata"], Value::Null);
    app.stop().await;
}

#[tokio::test]
async fn metadata_that_is_not_a_small_json_object_is_400_and_nothing_is_written() {
    let app = TestApp::spawn().await;
    let big = format!(r#"{{"pad": "{}"}}"#, "x".repeat(4100));
    for (n, bad) in ["[1, 2]", "not json", "7", big.as_str()]
        .into_iter()
        .enumerate()
    {
        let r = write(&app, &format!("m{n}"), Some(bad)).await;
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    assert_eq!(
        app.get("/v1/snapshots/m0").await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        app.get("/v1/snapshots/m").await.status(),
        StatusCode::NOT_FOUND
    );
    app.stop().await;
}

#[tokio::test]
async fn keys_are_listed_in_byte_order_and_reversed_with_order_desc() {
    let app = TestApp::spawn().await;
    for key in ["t/b", "t/a", "t/é", "t/Z", "t/c"] {
        write(&app, key, None).await;
    }
    let asc: Value = app
        .get("/v1/snapshots?prefix=t/")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys(&asc), ["t/Z", "t/a", "t/b", "t/c", "t/é"]);
    let desc: Value = app
        .get("/v1/snapshots?prefix=t/&order=desc")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys(&desc), ["t/é", "t/c", "t/b", "t/a", "t/Z"]);
    app.stop().await;
}

#[tokio::test]
async fn start_after_is_exclusive_in_the_order_asked_for() {
    let app = TestApp::spawn().await;
    for key in ["c/1", "c/2", "c/3", "c/4"] {
        write(&app, key, None).await;
    }
    let asc: Value = app
        .get("/v1/snapshots?prefix=c/&start_after=c/2")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys(&asc), ["c/3", "c/4"]);
    let desc: Value = app
        .get("/v1/snapshots?prefix=c/&order=desc&start_after=c/3")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys(&desc), ["c/2", "c/1"]);
    app.stop().await;
}

#[tokio::test]
async fn a_descending_listing_pages_through_next_cursor_without_gap_or_repeat() {
    let app = TestApp::spawn().await;
    for n in 0..7 {
        write(&app, &format!("p/{n}"), None).await;
    }
    let mut seen = Vec::new();
    let mut path = "/v1/snapshots?prefix=p/&order=desc&limit=3".to_owned();
    loop {
        let page: Value = app.get(&path).await.json().await.unwrap();
        seen.extend(keys(&page).into_iter().map(str::to_owned));
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/snapshots?prefix=p/&order=desc&limit=3&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, ["p/6", "p/5", "p/4", "p/3", "p/2", "p/1", "p/0"]);
    app.stop().await;
}

#[tokio::test]
async fn a_deleted_snapshot_is_not_listed() {
    let app = TestApp::spawn().await;
    write(&app, "d/1", None).await;
    let t = token(&app.acquire("d/2", "w", 30000).await);
    app.put("d/2", t, "x").await;
    let r = app
        .request(Method::DELETE, "/v1/snapshots/d%2F2")
        .header("Fencing-Token", t.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let page: Value = app
        .get("/v1/snapshots?prefix=d/")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(keys(&page), ["d/1"]);
    app.stop().await;
}

#[tokio::test]
async fn a_bad_order_or_include_is_400() {
    let app = TestApp::spawn().await;
    for q in ["order=up", "include=bodies", "start_after=%01"] {
        let r = app.get(&format!("/v1/snapshots?{q}")).await;
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}
