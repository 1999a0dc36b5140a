//! The timeline guard of the token sequence, without a real failover (the fault scenarios in
//! `tests/faults` do one): the guard row is set to another timeline, as a promoted standby
//! would find it, and the next grants must come after a safety jump.

use std::collections::HashSet;

use serde_json::json;

use crate::harness::{TestApp, token};

/// The gap `token_timeline_gap()` moves the sequence by.
const GAP: i64 = 1_000_000_000;

async fn pretend_the_timeline_changed(app: &TestApp) {
    sqlx::query("UPDATE token_timeline SET timeline = 0")
        .execute(app.db())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_changed_timeline_moves_the_sequence_past_every_token_before_the_next_grant() {
    let app = TestApp::spawn().await;
    let before = token(&app.acquire("k", "a", 30000).await);
    pretend_the_timeline_changed(&app).await;
    let after = token(&app.acquire("other", "b", 30000).await);
    assert!(after > before + GAP, "{after} > {before} + {GAP}");
    let (timeline, position): (i64, Option<i64>) =
        sqlx::query_as("SELECT timeline, position FROM token_timeline")
            .fetch_one(app.db())
            .await
            .unwrap();
    assert_eq!(timeline, 1, "secured on the server's own timeline");
    assert_eq!(position, Some(after - 1), "the jump is on record");
    app.stop().await;
}

#[tokio::test]
async fn a_changed_timeline_moves_the_sequence_before_a_grant_over_an_existing_lease() {
    let app = TestApp::spawn().await;
    let before = token(&app.acquire("k", "a", 100).await);
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    pretend_the_timeline_changed(&app).await;
    let after = token(&app.acquire("k", "b", 30000).await);
    assert!(after > before + GAP, "{after} > {before} + {GAP}");
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_grants_after_a_timeline_change_jump_once_and_share_no_token() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let before = token(&app.acquire("k", "a", 30000).await);
    pretend_the_timeline_changed(&app).await;
    let bases = [app.instance.base.clone(), second.base.clone()];
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let http = app.http.clone();
            let url = format!("{}/v1/leases/race-{i}", bases[i % 2]);
            tokio::spawn(async move {
                let r = http
                    .post(url)
                    .json(&json!({"owner": "w", "ttl_ms": 30000}))
                    .send()
                    .await
                    .unwrap();
                token(&r.json().await.unwrap())
            })
        })
        .collect();
    let mut tokens = HashSet::new();
    for t in tasks {
        assert!(tokens.insert(t.await.unwrap()), "a token was issued twice");
    }
    let lowest = *tokens.iter().min().unwrap();
    let highest = *tokens.iter().max().unwrap();
    assert!(lowest > before + GAP, "every grant came after the jump");
    assert!(
        highest < before + 2 * GAP,
        "one jump, not one per racing grant: {highest}"
    );
    second.stop().await;
    app.stop().await;
}
