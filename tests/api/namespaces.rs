//! A lease fences its namespace (contract v1.3): one test per rule of "A lease fences its
//! namespace", then the rules under racing writers on two instances.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::harness::{TestApp, enc, problem, token};

/// `PUT /v1/snapshots/{key}` fenced by the lease on `fence`.
async fn put_under(app: &TestApp, fence: &str, key: &str, t: i64, body: &str) -> reqwest::Response {
    app.request(Method::PUT, &format!("/v1/snapshots/{}", enc(key)))
        .header("Fencing-Key", enc(fence))
        .header("Fencing-Token", t.to_string())
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

async fn rejections(app: &TestApp) -> Vec<(String, String, Option<String>, i64)> {
    sqlx::query_as("SELECT key, reason, fencing_key, presented_token FROM rejections ORDER BY id")
        .fetch_all(app.db())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_lease_fences_writes_to_keys_under_it_and_says_so_in_the_answer_and_the_read() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("threads/42", "w", 30000).await);
    let r = put_under(&app, "threads/42", "threads/42/c/0001", t, "one").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let w: Value = r.json().await.unwrap();
    assert_eq!(w["fencing_key"], "threads/42");
    assert_eq!(w["token"], t);
    let got = app.get("/v1/snapshots/threads%2F42%2Fc%2F0001").await;
    assert_eq!(got.headers()["fencing-key"], "threads%2F42");
    assert_eq!(got.headers()["fencing-token"], t.to_string().as_str());
    assert_eq!(got.text().await.unwrap(), "one");
    let versions: Value = app
        .get("/v1/snapshots/threads%2F42%2Fc%2F0001/versions")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(versions["items"][0]["fencing_key"], "threads/42");
    app.stop().await;
}

#[tokio::test]
async fn the_fence_key_itself_is_in_its_namespace() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("jobs/7", "w", 30000).await);
    let r = put_under(&app, "jobs/7", "jobs/7", t, "x").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test]
async fn a_key_outside_the_fences_namespace_is_400_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("jobs/7", "w", 30000).await);
    for outside in ["jobs/70", "jobs", "other/jobs/7/x"] {
        let r = put_under(&app, "jobs/7", outside, t, "x").await;
        let p = problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
        assert!(p["detail"].as_str().unwrap().contains("namespace"), "{p}");
    }
    let heads: i64 = sqlx::query_scalar("SELECT count(*) FROM snapshot_heads")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(heads, 0);
    assert!(rejections(&app).await.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn a_malformed_fencing_key_is_400() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("jobs/7", "w", 30000).await);
    for bad in ["jobs%2", "%FF", ""] {
        let r = app
            .request(Method::PUT, "/v1/snapshots/jobs%2F7%2Fa")
            .header("Fencing-Key", bad)
            .header("Fencing-Token", t.to_string())
            .body("x")
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}

#[tokio::test]
async fn a_superseded_namespace_token_is_stale_and_audited_with_its_fencing_key() {
    let app = TestApp::spawn().await;
    let old = token(&app.acquire("run", "a", 30000).await);
    app.release("run", old).await;
    let new = token(&app.acquire("run", "b", 30000).await);
    let r = put_under(&app, "run", "run/state", old, "late").await;
    let p = problem(r, StatusCode::CONFLICT, "stale_token").await;
    assert_eq!(p["fencing_key"], "run");
    assert_eq!(p["presented_token"], old);
    assert_eq!(p["highest_token"], new);
    assert_eq!(
        rejections(&app).await,
        vec![(
            "run/state".into(),
            "stale_token".into(),
            Some("run".into()),
            old
        )]
    );
    let audit: Value = app.get("/v1/audit/rejections").await.json().await.unwrap();
    assert_eq!(audit["items"][0]["fencing_key"], "run");
    assert_eq!(audit["items"][0]["key"], "run/state");
    app.stop().await;
}

#[tokio::test]
async fn a_fence_that_never_had_a_lease_refuses_every_token_as_unknown() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("elsewhere", "a", 30000).await);
    let r = put_under(&app, "never", "never/x", t, "x").await;
    let p = problem(r, StatusCode::CONFLICT, "unknown_token").await;
    assert_eq!(p["fencing_key"], "never");
    app.stop().await;
}

#[tokio::test]
async fn a_released_fence_refuses_its_own_token() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("run", "a", 30000).await);
    assert_eq!(put_under(&app, "run", "run/a", t, "1").await.status(), 201);
    app.release("run", t).await;
    let r = put_under(&app, "run", "run/a", t, "2").await;
    problem(r, StatusCode::CONFLICT, "stale_token").await;
    app.stop().await;
}

#[tokio::test]
async fn a_keys_writes_only_go_forward_whichever_lease_fences_them() {
    let app = TestApp::spawn().await;
    let outer = token(&app.acquire("proj", "outer", 30000).await);
    assert_eq!(
        put_under(&app, "proj", "proj/f", outer, "1").await.status(),
        201
    );
    // The key's own lease, granted later, has a newer token and writes the key.
    let inner = token(&app.acquire("proj/f", "inner", 30000).await);
    assert!(inner > outer);
    assert_eq!(app.put("proj/f", inner, "2").await.status(), 200);
    // The namespace's lease is still its fence's newest, but the key has gone forward.
    let r = put_under(&app, "proj", "proj/f", outer, "3").await;
    let p = problem(r, StatusCode::CONFLICT, "stale_token").await;
    assert_eq!(p["highest_token"], inner, "the key's highest written token");
    assert_eq!(p["fencing_key"], "proj");
    assert_eq!(
        app.get("/v1/snapshots/proj%2Ff")
            .await
            .text()
            .await
            .unwrap(),
        "2"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_keys_own_older_lease_cannot_write_over_a_newer_namespace_write() {
    let app = TestApp::spawn().await;
    let inner = token(&app.acquire("proj/f", "inner", 30000).await);
    let outer = token(&app.acquire("proj", "outer", 30000).await);
    assert_eq!(
        put_under(&app, "proj", "proj/f", outer, "outer")
            .await
            .status(),
        201
    );
    let r = app.put("proj/f", inner, "inner").await;
    let p = problem(r, StatusCode::CONFLICT, "stale_token").await;
    assert_eq!(p["highest_token"], outer);
    assert_eq!(p["fencing_key"], "proj/f");
    app.stop().await;
}

#[tokio::test]
async fn a_delete_under_a_namespace_fence_removes_the_snapshot() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("run", "a", 30000).await);
    assert_eq!(put_under(&app, "run", "run/a", t, "1").await.status(), 201);
    let r = app
        .request(Method::DELETE, "/v1/snapshots/run%2Fa")
        .header("Fencing-Key", "run")
        .header("Fencing-Token", t.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.get("/v1/snapshots/run%2Fa").await.status(), 404);
    // A version number is never reused: the next write is version 2.
    let again: Value = put_under(&app, "run", "run/a", t, "2")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["version"], 2);
    app.stop().await;
}

#[tokio::test]
async fn a_stale_namespace_delete_is_refused_and_audited() {
    let app = TestApp::spawn().await;
    let old = token(&app.acquire("run", "a", 30000).await);
    assert_eq!(
        put_under(&app, "run", "run/a", old, "1").await.status(),
        201
    );
    app.release("run", old).await;
    app.acquire("run", "b", 30000).await;
    let r = app
        .request(Method::DELETE, "/v1/snapshots/run%2Fa")
        .header("Fencing-Key", "run")
        .header("Fencing-Token", old.to_string())
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::CONFLICT, "stale_token").await;
    assert_eq!(
        app.get("/v1/snapshots/run%2Fa").await.text().await.unwrap(),
        "1"
    );
    assert_eq!(rejections(&app).await.len(), 1);
    app.stop().await;
}

/// The versions of `key`, oldest first, as (version, token).
async fn versions_of(app: &TestApp, key: &str) -> Vec<(i64, i64)> {
    sqlx::query_as("SELECT version, token FROM snapshot_versions WHERE key = $1 ORDER BY version")
        .bind(key)
        .fetch_all(app.db())
        .await
        .unwrap()
}

/// Writers on two instances, each taking the namespace's lease in turn and writing keys under
/// it, with stale writers from earlier grants still writing: a key's accepted tokens never go
/// back, every refusal is audited once, and versions have no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_racing_on_one_namespace_from_two_instances_only_go_forward() {
    let app = Arc::new(
        TestApp::spawn_with(snapfence::Rules {
            keep_versions: 100_000,
            ..crate::harness::rules()
        })
        .await,
    );
    let second = Arc::new(app.another_instance().await);
    let refused = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for w in 0..8 {
        let (app, second, refused) = (app.clone(), second.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            let via = |m: Method, p: &str| {
                if w % 2 == 0 {
                    app.request(m, p)
                } else {
                    app.request_to(&second, m, p)
                }
            };
            for round in 0..6 {
                let grant = via(Method::POST, "/v1/leases/ns")
                    .json(&json!({"owner": format!("w{w}"), "ttl_ms": 200, "wait_ms": 5000}))
                    .send()
                    .await
                    .unwrap();
                if grant.status() != StatusCode::CREATED {
                    continue;
                }
                let t = token(&grant.json().await.unwrap());
                // Some holders stall past their TTL, as a paused worker would, then write on.
                if (w + round) % 3 == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
                for k in 0..3 {
                    let r = via(Method::PUT, &format!("/v1/snapshots/ns%2Fk{k}"))
                        .header("Fencing-Key", "ns")
                        .header("Fencing-Token", t.to_string())
                        .body(format!("{w}:{round}"))
                        .send()
                        .await
                        .unwrap();
                    match r.status() {
                        StatusCode::OK | StatusCode::CREATED => {}
                        StatusCode::CONFLICT => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("unexpected {other}"),
                    }
                }
                via(Method::DELETE, "/v1/leases/ns")
                    .header("Fencing-Token", t.to_string())
                    .send()
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for k in 0..3 {
        let versions = versions_of(&app, &format!("ns/k{k}")).await;
        assert!(!versions.is_empty());
        for (n, pair) in versions.windows(2).enumerate() {
            assert_eq!(
                pair[1].0,
                pair[0].0 + 1,
                "gapless versions at {n}: {versions:?}"
            );
            assert!(
                pair[1].1 >= pair[0].1,
                "tokens only go forward: {versions:?}"
            );
        }
    }
    let audited = rejections(&app).await.len();
    assert_eq!(
        audited,
        refused.load(Ordering::SeqCst),
        "each refusal audited once"
    );
    assert!(audited > 0, "the stalled holders were refused");
    Arc::try_unwrap(second).ok().unwrap().stop().await;
    Arc::try_unwrap(app).ok().unwrap().stop().await;
}

/// A namespace's holders and a key's own holders, on two instances, write the same key at once:
/// whichever lease fences a write, the key's accepted tokens never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_namespace_holder_racing_a_keys_own_holder_never_takes_the_key_back() {
    let app = Arc::new(
        TestApp::spawn_with(snapfence::Rules {
            keep_versions: 100_000,
            ..crate::harness::rules()
        })
        .await,
    );
    let second = Arc::new(app.another_instance().await);
    let outcomes = Arc::new(std::sync::Mutex::new(BTreeMap::<u16, usize>::new()));
    let mut tasks = Vec::new();
    for (w, fence) in ["ns", "ns/f", "ns", "ns/f"].into_iter().enumerate() {
        let (app, second, outcomes) = (app.clone(), second.clone(), outcomes.clone());
        tasks.push(tokio::spawn(async move {
            let via = |m: Method, p: &str| {
                if w % 2 == 0 {
                    app.request(m, p)
                } else {
                    app.request_to(&second, m, p)
                }
            };
            for _ in 0..8 {
                let grant = via(Method::POST, &format!("/v1/leases/{}", enc(fence)))
                    .json(&json!({"owner": format!("w{w}"), "ttl_ms": 300, "wait_ms": 5000}))
                    .send()
                    .await
                    .unwrap();
                if grant.status() != StatusCode::CREATED {
                    continue;
                }
                let t = token(&grant.json().await.unwrap());
                for _ in 0..3 {
                    let r = via(Method::PUT, "/v1/snapshots/ns%2Ff")
                        .header("Fencing-Key", enc(fence))
                        .header("Fencing-Token", t.to_string())
                        .body(format!("{fence}:{t}"))
                        .send()
                        .await
                        .unwrap();
                    *outcomes
                        .lock()
                        .unwrap()
                        .entry(r.status().as_u16())
                        .or_default() += 1;
                }
                via(Method::DELETE, &format!("/v1/leases/{}", enc(fence)))
                    .header("Fencing-Token", t.to_string())
                    .send()
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let versions = versions_of(&app, "ns/f").await;
    for pair in versions.windows(2) {
        assert_eq!(pair[1].0, pair[0].0 + 1, "gapless: {versions:?}");
        assert!(
            pair[1].1 >= pair[0].1,
            "tokens only go forward: {versions:?}"
        );
    }
    let outcomes = outcomes.lock().unwrap().clone();
    let refused = outcomes.get(&409).copied().unwrap_or(0);
    assert_eq!(rejections(&app).await.len(), refused, "{outcomes:?}");
    assert!(
        refused > 0 && versions.len() > 1,
        "both outcomes: {outcomes:?}"
    );
    assert_eq!(
        outcomes
            .keys()
            .copied()
            .filter(|s| ![200, 201, 409].contains(s))
            .count(),
        0,
        "{outcomes:?}"
    );
    Arc::try_unwrap(second).ok().unwrap().stop().await;
    Arc::try_unwrap(app).ok().unwrap().stop().await;
}
