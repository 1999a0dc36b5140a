//! The audit log of refused writes: paging, filters, row contents and retention.

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use snapfence::store::audit::{self, Log};

use crate::harness::{TestApp, problem, token};

/// Makes `n` refused writes on `key` (stale: the key was taken over) and returns their audit ids.
async fn refusals(app: &TestApp, key: &str, n: usize) -> Vec<i64> {
    let stale = token(&app.acquire(key, "old", 100).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.acquire(key, "new", 30000).await;
    let mut ids = Vec::new();
    for _ in 0..n {
        let body: Value = app.put(key, stale, "late").await.json().await.unwrap();
        ids.push(body["audit_id"].as_i64().unwrap());
    }
    ids
}

async fn page_all(app: &TestApp, query: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut path = format!("/v1/audit/rejections?{query}");
    loop {
        let r = app.get(&path).await;
        assert_eq!(r.status(), StatusCode::OK);
        let page: Value = r.json().await.unwrap();
        items.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/audit/rejections?{query}&cursor={c}"),
            None => return items,
        }
    }
}

#[tokio::test]
async fn paging_with_a_small_limit_gives_every_refusal_once_newest_first() {
    let app = TestApp::spawn().await;
    let mut ids = refusals(&app, "k", 27).await;
    let items = page_all(&app, "limit=4").await;
    let seen: Vec<i64> = items.iter().map(|i| i["id"].as_i64().unwrap()).collect();
    ids.reverse();
    assert_eq!(seen, ids);
    app.stop().await;
}

#[tokio::test]
async fn a_refusal_row_says_who_what_and_from_where() {
    let app = TestApp::spawn().await;
    let stale = token(&app.acquire("k", "old", 100).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let newest = token(&app.acquire("k", "successor", 30000).await);
    let r = app
        .request(Method::PUT, "/v1/snapshots/k")
        .header("Fencing-Token", stale.to_string())
        .header("x-request-id", "req-42")
        .body("late")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::CONFLICT, "stale_token").await;
    let page: Value = app.get("/v1/audit/rejections").await.json().await.unwrap();
    let row = &page["items"][0];
    assert_eq!(row["key"], "k");
    assert_eq!(row["reason"], "stale_token");
    assert_eq!(row["presented_token"], stale);
    assert_eq!(row["highest_token"], newest);
    assert_eq!(row["holder"], "successor");
    assert_eq!(row["operation"], "put");
    assert_eq!(row["request_id"], "req-42");
    assert!(
        row["remote_addr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert_eq!(row["principal"], Value::Null);
    assert!(row["at"].as_str().unwrap().ends_with('Z'));
    app.stop().await;
}

#[tokio::test]
async fn the_key_filter_narrows_to_one_key() {
    let app = TestApp::spawn().await;
    refusals(&app, "a", 3).await;
    let b = refusals(&app, "jobs/b", 2).await;
    let items = page_all(&app, "key=jobs%2Fb&limit=1").await;
    let seen: Vec<i64> = items.iter().map(|i| i["id"].as_i64().unwrap()).collect();
    assert_eq!(seen, b.iter().rev().copied().collect::<Vec<_>>());
    assert!(items.iter().all(|i| i["key"] == "jobs/b"));
    app.stop().await;
}

#[tokio::test]
async fn the_reason_filter_narrows_to_one_reason() {
    let app = TestApp::spawn().await;
    refusals(&app, "k", 2).await;
    app.put("never-leased", 99, "x").await;
    let unknown = page_all(&app, "reason=unknown_token").await;
    assert_eq!(unknown.len(), 1);
    assert_eq!(unknown[0]["key"], "never-leased");
    let stale = page_all(&app, "reason=stale_token").await;
    assert_eq!(stale.len(), 2);
    app.stop().await;
}

#[tokio::test]
async fn since_is_inclusive_and_until_exclusive() {
    let app = TestApp::spawn().await;
    let ids = refusals(&app, "k", 3).await;
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT at FROM rejections WHERE id = $1")
        .bind(ids[1])
        .fetch_one(app.db())
        .await
        .unwrap();
    let middle = at.to_rfc3339_opts(SecondsFormat::Micros, true);
    let since: Vec<i64> = page_all(&app, &format!("since={middle}"))
        .await
        .iter()
        .map(|i| i["id"].as_i64().unwrap())
        .collect();
    assert_eq!(since, [ids[2], ids[1]]);
    let until: Vec<i64> = page_all(&app, &format!("until={middle}"))
        .await
        .iter()
        .map(|i| i["id"].as_i64().unwrap())
        .collect();
    assert_eq!(until, [ids[0]]);
    app.stop().await;
}

#[tokio::test]
async fn bad_audit_filters_are_refused() {
    let app = TestApp::spawn().await;
    for query in [
        "reason=bogus",
        "since=yesterday",
        "until=2026-13-01T00:00:00Z",
        "limit=0",
        "limit=1001",
        "cursor=nope",
        "key=",
        "unknown=1",
    ] {
        let r = app.get(&format!("/v1/audit/rejections?{query}")).await;
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    let r = app.get("/v1/audit/recoveries?reason=stale_token").await;
    problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    app.stop().await;
}

#[tokio::test]
async fn rows_past_their_retention_are_pruned_in_batches_and_newer_ones_kept() {
    let app = TestApp::spawn().await;
    let ids = refusals(&app, "k", 5).await;
    sqlx::query("UPDATE rejections SET at = now() - interval '31 days' WHERE id <= $1")
        .bind(ids[2])
        .execute(app.db())
        .await
        .unwrap();
    let retention = Duration::from_secs(30 * 86_400);
    assert_eq!(
        audit::prune(app.db(), Log::Rejections, retention, 2)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        audit::prune(app.db(), Log::Rejections, retention, 2)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        audit::prune(app.db(), Log::Rejections, retention, 2)
            .await
            .unwrap(),
        0
    );
    let left: Vec<i64> = page_all(&app, "")
        .await
        .iter()
        .map(|i| i["id"].as_i64().unwrap())
        .collect();
    assert_eq!(left, [ids[4], ids[3]]);
    app.stop().await;
}

#[tokio::test]
async fn a_starting_instance_prunes_expired_rows_in_the_background() {
    let app = TestApp::spawn().await;
    let ids = refusals(&app, "k", 2).await;
    sqlx::query("UPDATE rejections SET at = now() - interval '40 days' WHERE id = $1")
        .bind(ids[0])
        .execute(app.db())
        .await
        .unwrap();
    let pruner = app.another_instance().await;
    let mut left = 2;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        left = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM rejections")
            .fetch_one(app.db())
            .await
            .unwrap();
        if left == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, 1, "the expired row is gone, the fresh one kept");
    pruner.stop().await;
    app.stop().await;
}
