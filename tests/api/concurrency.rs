//! Races and restarts: many tasks, several instances on one database.

use std::collections::HashSet;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{Instance, TestApp, token};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_racers_through_two_instances_get_exactly_one_grant_twenty_times() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let bases = [app.instance.base.clone(), second.base.clone()];
    for round in 0..20 {
        let key = format!("race-{round}");
        let mut tasks = Vec::new();
        for i in 0..32 {
            let http = app.http.clone();
            let url = format!("{}/v1/leases/{key}", bases[i % 2]);
            tasks.push(tokio::spawn(async move {
                let r = http
                    .post(url)
                    .json(&json!({"owner": format!("racer-{i}"), "ttl_ms": 30000}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status();
                let body: Value = r.json().await.unwrap();
                (status, body)
            }));
        }
        let mut grants = Vec::new();
        for t in tasks {
            let (status, body) = t.await.unwrap();
            match status {
                StatusCode::CREATED => grants.push(body),
                StatusCode::CONFLICT => assert_eq!(body["code"], "lease_held", "{body}"),
                other => panic!("unexpected {other}: {body}"),
            }
        }
        assert_eq!(grants.len(), 1, "round {round}: exactly one grant");
        let status: Value = app
            .get(&format!("/v1/leases/{key}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(status["lease"], grants[0], "the grant is the stored lease");
    }
    second.stop().await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_grants_on_many_keys_never_share_a_token() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let bases = [app.instance.base.clone(), second.base.clone()];
    let mut tasks = Vec::new();
    for i in 0..64 {
        let http = app.http.clone();
        let url = format!("{}/v1/leases/many-{i}", bases[i % 2]);
        tasks.push(tokio::spawn(async move {
            let r = http
                .post(url)
                .json(&json!({"owner": "w", "ttl_ms": 30000}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
            token(&r.json().await.unwrap())
        }));
    }
    let mut tokens = HashSet::new();
    for t in tasks {
        assert!(tokens.insert(t.await.unwrap()), "a token was issued twice");
    }
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn tokens_keep_increasing_across_a_restart() {
    let app = TestApp::spawn().await;
    let before = token(&app.acquire("k", "a", 30000).await);
    // The database stays in `app` (dropped at the end) while its instance is replaced.
    let TestApp {
        instance,
        options,
        rules,
        http,
        ..
    } = app;
    instance.stop().await;
    let restarted = Instance::start(options, rules).await;
    let r = http
        .post(format!("{}/v1/leases/other", restarted.base))
        .json(&json!({"owner": "b", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let after = token(&r.json().await.unwrap());
    assert!(after > before, "{after} > {before}");
    let held = http
        .get(format!("{}/v1/leases/k", restarted.base))
        .send()
        .await
        .unwrap();
    assert_eq!(held.json::<Value>().await.unwrap()["state"], "held");
    restarted.stop().await;
}

#[tokio::test]
async fn a_sequence_reset_by_hand_is_moved_past_stored_tokens_at_start() {
    let app = TestApp::spawn().await;
    let mut newest = 0;
    for i in 0..5 {
        newest = token(&app.acquire(&format!("k{i}"), "a", 30000).await);
    }
    sqlx::query("SELECT setval('fencing_token_seq', 1)")
        .execute(app.db())
        .await
        .unwrap();
    let restarted = app.another_instance().await;
    let r = app
        .request_to(&restarted, Method::POST, "/v1/leases/fresh")
        .json(&json!({"owner": "b", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    let fresh = token(&r.json().await.unwrap());
    assert!(
        fresh > newest,
        "{fresh} > {newest}: no token handed out twice"
    );
    restarted.stop().await;
    app.stop().await;
}
