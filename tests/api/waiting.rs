//! Waiting acquires (`wait_ms`): the queue's order across instances, wake-ups on release and
//! at expiry, the wait running out, refusals that do not wait, waiters that go away (their
//! client, or their instance), and what idle waiters cost the database.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::time::Instant;

use crate::connections::raise_file_limit;
use crate::harness::{Instance, TestApp, enc, problem, token};
use crate::metrics::{sample, scrape};

/// How long a condition that must come about may take at most (a generous ceiling on a loaded
/// machine, never a speed expectation).
const CEILING: Duration = Duration::from_secs(20);

/// Rows in `key`'s queue.
async fn queued(db: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM lease_waiters WHERE key = $1")
        .bind(key)
        .fetch_one(db)
        .await
        .unwrap()
}

/// Waits until `key`'s queue holds `n` rows; fails past the ceiling.
async fn until_queued(db: &PgPool, key: &str, n: i64) {
    let deadline = Instant::now() + CEILING;
    while queued(db, key).await != n {
        assert!(Instant::now() < deadline, "{key}'s queue never held {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A waiting acquire of `key` through `base`, answered with its status and body.
async fn acquire_waiting(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    owner: &str,
    wait_ms: i64,
) -> (StatusCode, Value) {
    let r = http
        .post(format!("{base}/v1/leases/{}", enc(key)))
        .json(&json!({"owner": owner, "ttl_ms": 30000, "wait_ms": wait_ms}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

/// A waiting acquire of `key` through `app`'s instance, in a task of its own.
fn spawn_waiter(
    app: &TestApp,
    key: &'static str,
    owner: &'static str,
    wait_ms: i64,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let (http, base) = (app.http.clone(), app.instance.base.clone());
    tokio::spawn(async move { acquire_waiting(&http, &base, key, owner, wait_ms).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_waiters_through_two_instances_get_the_lease_in_arrival_order_once_each() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let bases = [app.instance.base.clone(), second.base.clone()];
    let holder = app.acquire("queue", "holder", 30000).await;
    let (granted, mut grants) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..20 {
        let http = app.http.clone();
        let base = bases[i % 2].clone();
        let granted = granted.clone();
        tokio::spawn(async move {
            let (status, grant) =
                acquire_waiting(&http, &base, "queue", &format!("waiter-{i}"), 120_000).await;
            assert_eq!(status, StatusCode::CREATED, "waiter {i}: {grant}");
            granted.send((i, token(&grant))).unwrap();
            let released = http
                .delete(format!("{base}/v1/leases/queue"))
                .header("Fencing-Token", token(&grant).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(released.status(), StatusCode::NO_CONTENT);
        });
        // Each waiter is in the queue before the next one starts, 10 ms later.
        until_queued(app.db(), "queue", i as i64 + 1).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(granted);
    assert_eq!(app.release("queue", token(&holder)).await.status(), 204);
    let mut order = Vec::new();
    while let Some(grant) = tokio::time::timeout(CEILING, grants.recv()).await.unwrap() {
        order.push(grant);
    }
    let waiters: Vec<usize> = order.iter().map(|&(i, _)| i).collect();
    assert_eq!(waiters, (0..20).collect::<Vec<_>>(), "grant order");
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens strictly increase: {order:?}"
    );
    assert!(order[0].1 > token(&holder));
    assert_eq!(queued(app.db(), "queue").await, 0);
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_waiter_is_granted_when_the_holder_releases() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    let waiter = spawn_waiter(&app, "k", "w", 60_000);
    until_queued(app.db(), "k", 1).await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let (status, grant) = tokio::time::timeout(CEILING, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{grant}");
    assert_eq!(grant["owner"], "w");
    assert!(token(&grant) > token(&holder));
    app.stop().await;
}

#[tokio::test]
async fn a_waiter_is_granted_once_the_holders_lease_expires_by_the_database_clock() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 500).await;
    let (status, grant) = acquire_waiting(&app.http, &app.instance.base, "k", "w", 60_000).await;
    assert_eq!(status, StatusCode::CREATED, "{grant}");
    let at = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap()).unwrap()
    };
    assert!(
        at(&grant, "acquired_at") >= at(&holder, "expires_at"),
        "granted at {} before the holder's expiry {}",
        grant["acquired_at"],
        holder["expires_at"]
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_behind_another_instances_waiter_is_granted_once_that_waiters_lease_expires() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let holder = app.acquire("k", "holder", 30000).await;
    // The first waiter, on this instance, takes a short lease and never releases it.
    let http = app.http.clone();
    let url = format!("{}/v1/leases/k", app.instance.base);
    let first = tokio::spawn(async move {
        let r = http
            .post(url)
            .json(&json!({"owner": "first", "ttl_ms": 500, "wait_ms": 60_000}))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    });
    until_queued(app.db(), "k", 1).await;
    let http = app.http.clone();
    let base = second.base.clone();
    let behind =
        tokio::spawn(async move { acquire_waiting(&http, &base, "k", "behind", 60_000).await });
    until_queued(app.db(), "k", 2).await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let (status, first) = tokio::time::timeout(CEILING, first).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, behind) = tokio::time::timeout(CEILING, behind)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{behind}");
    let at = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap()).unwrap()
    };
    assert!(at(&behind, "acquired_at") >= at(&first, "expires_at"));
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_wait_that_runs_out_answers_lease_held_and_leaves_the_queue() {
    let app = TestApp::spawn().await;
    app.acquire("k", "holder", 30000).await;
    let started = Instant::now();
    let r = app
        .acquire_with("k", json!({"owner": "w", "ttl_ms": 30000, "wait_ms": 300}))
        .await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    let body = problem(r, StatusCode::CONFLICT, "lease_held").await;
    assert_eq!(body["holder"]["owner"], "holder");
    assert_eq!(queued(app.db(), "k").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_retained_recovery_record_is_answered_at_once_whatever_the_wait() {
    let app = TestApp::spawn().await;
    let g = app.acquire("k", "holder", 30000).await;
    let abandoned = app
        .request(Method::POST, "/v1/leases/k/abandon")
        .header("Fencing-Token", token(&g).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(abandoned.status(), 204);
    let started = Instant::now();
    let r = app
        .acquire_with(
            "k",
            json!({"owner": "w", "ttl_ms": 30000, "wait_ms": 300000}),
        )
        .await;
    let body = problem(r, StatusCode::CONFLICT, "recovery_required").await;
    assert_eq!(body["recovery"]["reason"], "abandoned");
    assert!(started.elapsed() < CEILING);
    assert_eq!(queued(app.db(), "k").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_waiter_behind_a_lease_that_leaves_a_recovery_record_is_answered_when_it_ends() {
    let app = TestApp::spawn().await;
    let g = app.acquire("k", "holder", 30000).await;
    let waiter = spawn_waiter(&app, "k", "w", 60_000);
    until_queued(app.db(), "k", 1).await;
    let abandoned = app
        .request(Method::POST, "/v1/leases/k/abandon")
        .header("Fencing-Token", token(&g).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(abandoned.status(), 204);
    let (status, body) = tokio::time::timeout(CEILING, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], "recovery_required");
    app.stop().await;
}

#[tokio::test]
async fn an_acquire_that_does_not_wait_cannot_pass_the_queue() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    // A waiter of an instance that stays alive (this test's connection holds its liveness
    // lock), queued and not yet woken: the key it waits for is free, and reserved for it.
    let mut instance = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(waiter_lock_class(), 2000000000)")
        .execute(&mut instance)
        .await
        .unwrap();
    sqlx::query("INSERT INTO lease_waiters (key, instance) VALUES ('k', 2000000000)")
        .execute(app.db())
        .await
        .unwrap();
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let r = app
        .acquire_with("k", json!({"owner": "barger", "ttl_ms": 30000}))
        .await;
    problem(r, StatusCode::CONFLICT, "lease_held").await;
    instance.close().await.unwrap();
    app.stop().await;
}

/// Another instance as the queues see it, alive while the returned connection holds its
/// liveness lock. `silent_for`: how long ago it last said it was alive (its stall bound is a
/// second), or never, when it is judged by its lock alone.
async fn other_instance(app: &TestApp, id: i32, silent_for: Option<Duration>) -> PgConnection {
    let mut lock = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(waiter_lock_class(), $1)")
        .bind(id)
        .execute(&mut lock)
        .await
        .unwrap();
    if let Some(silent) = silent_for {
        sqlx::query(
            "INSERT INTO waiter_instances (instance, seen_at, stale_after) \
             VALUES ($1, clock_timestamp() - $2 * interval '1 millisecond', interval '1 second')",
        )
        .bind(id)
        .bind(i64::try_from(silent.as_millis()).unwrap())
        .execute(app.db())
        .await
        .unwrap();
    }
    lock
}

/// A waiter of instance `id` in `key`'s queue, as that instance would have queued it.
async fn queue_on(app: &TestApp, key: &str, id: i32) {
    sqlx::query("INSERT INTO lease_waiters (key, instance) VALUES ($1, $2)")
        .bind(key)
        .bind(id)
        .execute(app.db())
        .await
        .unwrap();
}

/// A key's state and waiters as `GET /v1/leases/{key}` shows them.
async fn state_and_waiters(app: &TestApp, key: &str) -> (String, i64) {
    let status = read(app, &format!("/v1/leases/{}", enc(key))).await;
    (
        status["state"].as_str().unwrap().to_owned(),
        status["waiters"].as_i64().unwrap(),
    )
}

#[tokio::test]
async fn a_released_key_that_goes_to_a_live_waiter_shows_it_and_a_plain_acquire_is_told_so() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    let instance = other_instance(&app, 2_000_000_010, None).await;
    queue_on(&app, "k", 2_000_000_010).await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    assert_eq!(state_and_waiters(&app, "k").await, ("released".into(), 1));
    let r = app
        .acquire_with("k", json!({"owner": "plain", "ttl_ms": 30000}))
        .await;
    let body = problem(r, StatusCode::CONFLICT, "lease_held").await;
    assert_eq!(body["state"], "released");
    assert_eq!(body["waiters"], 1);
    // `holder` names the last holder, as it always has on a key reserved for a waiter.
    assert_eq!(body["holder"]["owner"], "holder");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("was released") && detail.contains("wait_ms"),
        "{detail}"
    );
    instance.close().await.unwrap();
    app.stop().await;
}

#[tokio::test]
async fn waiters_of_instances_gone_or_no_longer_answering_are_not_counted_and_do_not_hold_the_key()
{
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    // One instance died (its lock is free); another holds its lock but has said nothing for
    // twice its stall bound (frozen).
    queue_on(&app, "k", 2_000_000_011).await;
    let frozen = other_instance(&app, 2_000_000_012, Some(Duration::from_secs(2))).await;
    queue_on(&app, "k", 2_000_000_012).await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    assert_eq!(state_and_waiters(&app, "k").await, ("released".into(), 0));
    let list = read(&app, "/v1/leases").await;
    assert_eq!(list["items"][0]["waiters"], 0);
    let r = app
        .acquire_with("k", json!({"owner": "plain", "ttl_ms": 30000}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    frozen.close().await.unwrap();
    app.stop().await;
}

#[tokio::test]
async fn a_wait_that_runs_out_behind_a_live_waiter_of_a_free_key_is_told_how_many_are_ahead() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    let instance = other_instance(&app, 2_000_000_013, None).await;
    queue_on(&app, "k", 2_000_000_013).await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let (status, body) = tokio::time::timeout(CEILING, spawn_waiter(&app, "k", "late", 300))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "lease_held");
    assert_eq!(body["state"], "released");
    assert_eq!(body["waiters"], 1);
    instance.close().await.unwrap();
    app.stop().await;
}

#[tokio::test]
async fn the_waiters_of_a_dead_instance_are_skipped_and_dropped_within_a_second() {
    let app = TestApp::spawn().await;
    // Another instance, alive while this test's connection holds its liveness lock, queues a
    // waiter of "k"; then one of this instance queues behind it.
    let holder = app.acquire("k", "holder", 30000).await;
    let mut instance = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(waiter_lock_class(), 2000000000)")
        .execute(&mut instance)
        .await
        .unwrap();
    sqlx::query("INSERT INTO lease_waiters (key, instance) VALUES ('k', 2000000000)")
        .execute(app.db())
        .await
        .unwrap();
    let waiter = spawn_waiter(&app, "k", "w", 60_000);
    until_queued(app.db(), "k", 2).await;
    // The other instance dies: its connection, and with it its liveness lock, goes.
    instance.close().await.unwrap();
    let died = Instant::now();
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let (status, grant) = tokio::time::timeout(CEILING, waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{grant}");
    assert_eq!(grant["owner"], "w");
    until_queued(app.db(), "k", 0).await;
    // The contract's second, with as much again for a loaded machine.
    assert!(
        died.elapsed() < Duration::from_secs(2),
        "dropped {:?} after the instance died",
        died.elapsed()
    );
    app.stop().await;
}

#[tokio::test]
async fn a_waiter_whose_client_goes_away_leaves_the_queue() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    let gone = spawn_waiter(&app, "k", "gone", 60_000);
    until_queued(app.db(), "k", 1).await;
    gone.abort();
    until_queued(app.db(), "k", 0).await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    app.acquire("k", "next", 30000).await;
    app.stop().await;
}

/// 200 waiting acquires through two instances, each client hanging up 0–30 ms after sending
/// (before, while or after its place is taken): no place is left in any queue, and once the
/// holder releases, a plain acquire is granted within the stall bound plus one sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_whose_clients_hang_up_at_once_leave_no_place_that_keeps_the_key() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let holder = app.acquire("k", "holder", 60_000).await;
    let cut: Vec<_> = (0..200_u64)
        .map(|n| {
            let base = if n % 2 == 0 {
                app.instance.base.clone()
            } else {
                second.base.clone()
            };
            let http = app.http.clone();
            tokio::spawn(async move {
                http.post(format!("{base}/v1/leases/k"))
                    .json(&json!({"owner": format!("w{n}"), "ttl_ms": 30000, "wait_ms": 60000}))
                    .timeout(Duration::from_millis(n % 31))
                    .send()
                    .await
            })
        })
        .collect();
    for c in cut {
        assert!(
            c.await.unwrap().is_err(),
            "a waiter was answered before its client hung up"
        );
    }
    // The instances may still be reading requests already cut (on a loaded machine): wait until
    // the queue has stayed empty for a stall bound, or fail after the ceiling.
    let deadline = Instant::now() + CEILING;
    let mut empty_since = None;
    loop {
        match (queued(app.db(), "k").await, empty_since) {
            (0, Some(at)) if Instant::now() - at > Duration::from_secs(1) => break,
            (0, None) => empty_since = Some(Instant::now()),
            (0, Some(_)) => {}
            (left, _) => {
                assert!(
                    Instant::now() < deadline,
                    "{left} places stay with no client behind them"
                );
                empty_since = None;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let released = Instant::now();
    let bound = snapfence::Rules::default().waiter_stall_bound + Duration::from_millis(500);
    for n in 0.. {
        let via = if n % 2 == 0 { &second } else { &app.instance };
        let r = app
            .request_to(via, Method::POST, "/v1/leases/k")
            .json(&json!({"owner": "plain", "ttl_ms": 30000}))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::CREATED {
            break;
        }
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert!(
            released.elapsed() < bound,
            "a plain acquire still refused {:?} after the release: {}",
            released.elapsed(),
            r.text().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        released.elapsed() < bound,
        "granted {:?} after the release",
        released.elapsed()
    );
    assert_eq!(queued(app.db(), "k").await, 0);
    second.stop().await;
    app.stop().await;
}

/// A key's waiters and an instance's are bounded: one more is `429 too_many_requests` with
/// `Retry-After`, takes no place, and (past the instance's) has its connection closed; a place
/// that ends admits the next.
#[tokio::test]
async fn waiters_past_their_keys_or_their_instances_most_are_429_and_take_no_place() {
    let app = TestApp::spawn_with(snapfence::Rules {
        max_waiters_per_key: 2,
        max_waiters: 3,
        ..crate::harness::rules()
    })
    .await;
    app.acquire("a", "holder", 60_000).await;
    app.acquire("b", "holder", 60_000).await;
    let a1 = spawn_waiter(&app, "a", "a1", 60_000);
    let _a2 = spawn_waiter(&app, "a", "a2", 60_000);
    until_queued(app.db(), "a", 2).await;
    let (status, body) = acquire_waiting(&app.http, &app.instance.base, "a", "a3", 60_000).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["code"], "too_many_requests");
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("--max-waiters-per-key")
    );
    let _b1 = spawn_waiter(&app, "b", "b1", 60_000);
    until_queued(app.db(), "b", 1).await;
    let r = app
        .acquire_with(
            "c",
            json!({"owner": "c1", "ttl_ms": 30000, "wait_ms": 60_000}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["connection"], "close");
    assert!(r.text().await.unwrap().contains("--max-waiters"));
    assert_eq!(queued(app.db(), "a").await, 2, "the refused took no place");
    assert_eq!(queued(app.db(), "c").await, 0);
    let r = app
        .acquire_with("c", json!({"owner": "plain", "ttl_ms": 30000}))
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "an acquire that does not wait is not bounded"
    );
    a1.abort();
    until_queued(app.db(), "a", 1).await;
    let again = spawn_waiter(&app, "a", "a4", 60_000);
    until_queued(app.db(), "a", 2).await;
    again.abort();
    app.stop().await;
}

/// A hundred waiters whose clients hang up together leave the queue as a few statements, not one
/// each, so a flood that hangs up does not take its instance's connections from everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_that_hang_up_together_leave_the_queue_in_a_few_statements() {
    const WAITERS: usize = 100;
    let app = TestApp::spawn().await;
    app.acquire("k", "holder", 60_000).await;
    let waiting: Vec<_> = (0..WAITERS)
        .map(|n| {
            let (http, base) = (app.http.clone(), app.instance.base.clone());
            tokio::spawn(async move {
                http.post(format!("{base}/v1/leases/k"))
                    .json(&json!({"owner": format!("w{n}"), "ttl_ms": 30000, "wait_ms": 60000}))
                    .send()
                    .await
            })
        })
        .collect();
    until_queued(app.db(), "k", WAITERS as i64).await;
    let leaves =
        |text: &str, family: &str| sample(text, &format!("{family}{{kind=\"wait_leave\"}}"));
    let before = scrape(&app).await;
    for w in &waiting {
        w.abort();
    }
    until_queued(app.db(), "k", 0).await;
    let after = scrape(&app).await;
    let left = leaves(&after, "snapfence_batched_requests_total")
        - leaves(&before, "snapfence_batched_requests_total");
    let statements =
        leaves(&after, "snapfence_batches_total") - leaves(&before, "snapfence_batches_total");
    assert_eq!(left, WAITERS as f64, "each waiter left through the batch");
    assert!(
        statements <= (WAITERS / 10) as f64,
        "{WAITERS} waiters left in {statements} statements"
    );
    app.stop().await;
}

/// 5,000 waiting acquires sent at once to one instance at its default limits: as many wait as it
/// holds and the rest are refused at once, and all the while another client's reads and acquires
/// of other keys are answered, never shed. Prints the slowest of them (a figure, not a bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_waiters_never_keeps_another_clients_requests_from_being_answered() {
    const FLOOD: usize = 5000;
    assert!(raise_file_limit() > 2 * FLOOD as u64 + 1000);
    let app = TestApp::spawn().await;
    let rules = snapfence::Rules::default();
    for n in 0..20 {
        app.acquire(&format!("busy/{n}"), "holder", 300_000).await;
    }
    let probe = reqwest::Client::new();
    let base = app.instance.base.clone();
    let answered = |r: reqwest::Response, want: StatusCode| {
        assert_eq!(r.status(), want, "another client's request was not served");
    };
    answered(
        probe
            .get(format!("{base}/v1/leases/busy%2F0"))
            .send()
            .await
            .unwrap(),
        StatusCode::OK,
    );
    let flooding = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let flood: Vec<_> = (0..FLOOD)
        .map(|n| {
            let (http, base) = (flooding.clone(), base.clone());
            tokio::spawn(async move {
                let r = http
                    .post(format!("{base}/v1/leases/busy%2F{}", n % 20))
                    .json(&json!({"owner": format!("w{n}"), "ttl_ms": 30000, "wait_ms": 300_000}))
                    .send()
                    .await;
                r.map(|r| r.status())
            })
        })
        .collect();
    let waiting = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM lease_waiters")
            .fetch_one(app.db())
            .await
            .unwrap()
    };
    let (mut worst, mut probes) = (Duration::ZERO, 0);
    let deadline = Instant::now() + 3 * CEILING;
    loop {
        let refused = flood.iter().filter(|f| f.is_finished()).count();
        if refused + rules.max_waiters >= FLOOD && waiting().await == rules.max_waiters as i64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the flood never settled ({refused} answered)"
        );
        let at = Instant::now();
        answered(
            probe
                .get(format!("{base}/v1/leases/busy%2F1"))
                .send()
                .await
                .unwrap(),
            StatusCode::OK,
        );
        let key = format!("other%2F{probes}");
        let grant = probe
            .post(format!("{base}/v1/leases/{key}"))
            .json(&json!({"owner": "probe", "ttl_ms": 30000}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            grant.status(),
            StatusCode::CREATED,
            "another client's acquire was not served"
        );
        worst = worst.max(at.elapsed());
        probes += 1;
    }
    assert!(probes > 0);
    let mut statuses = std::collections::BTreeMap::new();
    for f in flood {
        if f.is_finished() {
            let status = f.await.unwrap().map(|s| s.as_u16()).unwrap_or(0);
            *statuses.entry(status).or_insert(0) += 1;
        } else {
            f.abort();
        }
    }
    assert_eq!(
        statuses.get(&429).copied().unwrap_or(0),
        FLOOD - rules.max_waiters,
        "{statuses:?}"
    );
    println!(
        "{FLOOD} waiting acquires: {} wait, {statuses:?} answered; another client's read and acquire \
         answered {probes} times meanwhile, the slowest pair in {worst:?}",
        rules.max_waiters
    );
    app.stop().await;
}

/// An instance whose database pool is taken for longer than its stall bound is busy, not frozen:
/// it still says it is alive, so its waiter keeps its turn ahead of another instance's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_instance_is_not_taken_for_frozen_and_its_waiter_keeps_its_turn() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let holder = app.acquire("k", "holder", 60_000).await;
    let first = spawn_waiter(&app, "k", "first", 60_000);
    until_queued(app.db(), "k", 1).await;
    let behind = {
        let (http, base) = (app.http.clone(), second.base.clone());
        tokio::spawn(async move { acquire_waiting(&http, &base, "k", "behind", 60_000).await })
    };
    until_queued(app.db(), "k", 2).await;
    // Every connection of the first instance's pool waits on a lock the test holds, for longer
    // than the stall bound (the reads give up at the statement timeout, about 4 s).
    let mut lock = app.db().begin().await.unwrap();
    sqlx::query("LOCK TABLE rejections IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let reads: Vec<_> = (0..24)
        .map(|_| {
            let (http, base) = (app.http.clone(), app.instance.base.clone());
            tokio::spawn(
                async move { http.get(format!("{base}/v1/audit/rejections")).send().await },
            )
        })
        .collect();
    tokio::time::sleep(snapfence::Rules::default().waiter_stall_bound * 2).await;
    let r = app
        .request_to(&second, Method::DELETE, "/v1/leases/k")
        .header("Fencing-Token", token(&holder).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let (status, grant) = tokio::time::timeout(CEILING, first).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::CREATED, "{grant}");
    assert_eq!(grant["owner"], "first");
    lock.rollback().await.unwrap();
    for r in reads {
        let _ = r.await;
    }
    behind.abort();
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_wait_out_of_bounds_is_invalid() {
    let app = TestApp::spawn().await;
    for wait_ms in [json!(-1), json!(300_001), json!("1s"), json!(1.5)] {
        let r = app
            .acquire_with(
                "k",
                json!({"owner": "w", "ttl_ms": 30000, "wait_ms": wait_ms}),
            )
            .await;
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}

#[tokio::test]
async fn a_wait_on_a_free_key_is_granted_at_once_and_leaves_no_place() {
    let app = TestApp::spawn().await;
    let (status, grant) = acquire_waiting(&app.http, &app.instance.base, "k", "w", 60_000).await;
    assert_eq!(status, StatusCode::CREATED, "{grant}");
    assert_eq!(queued(app.db(), "k").await, 0);
    app.stop().await;
}

/// Connections to the test's database now, every instance's and this test's.
async fn connections(db: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        .fetch_one(db)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_waiters_on_one_instance_hold_no_database_connections() {
    const WAITERS: usize = 1000;
    assert!(raise_file_limit() > 2 * WAITERS as u64 + 600);
    let app = TestApp::spawn().await;
    let rules = snapfence::Rules {
        max_waiters_per_key: WAITERS,
        max_waiters: WAITERS,
        ..app.rules.clone()
    };
    let instance = Instance::start(app.options.clone(), rules).await;
    app.acquire("k", "holder", 300_000).await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let http = http.clone();
        let base = instance.base.clone();
        waiters.push(tokio::spawn(async move {
            acquire_waiting(&http, &base, "k", &format!("w{i}"), 300_000).await
        }));
    }
    let deadline = Instant::now() + 3 * CEILING;
    while queued(app.db(), "k").await != WAITERS as i64 {
        if let Some(done) = waiters.iter_mut().find(|w| w.is_finished()) {
            panic!("a waiter was answered: {:?}", done.await.unwrap());
        }
        assert!(Instant::now() < deadline, "the queue never held {WAITERS}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // However many wait, the instances hold their pools' connections at most (8 each, hot and
    // other, and the listening one), and this test one.
    let bound = 2 * (2 * 8 + 1) + 1;
    let open = connections(app.db()).await;
    assert!(
        open <= bound,
        "{open} connections with {WAITERS} waiters (at most {bound})"
    );
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "every waiter still waits"
    );
    for w in &waiters {
        w.abort();
    }
    until_queued(app.db(), "k", 0).await;
    instance.stop().await;
    app.stop().await;
}

/// The `q` quantile of `samples` (sorted here).
fn quantile(samples: &mut [Duration], q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() - 1) as f64 * q).round() as usize]
}

/// One hand-off of `key` from a holder with `ttl_ms` to a waiter: by the holder's release (from
/// its `204` to the waiter's `201`, on this machine's clock) or by its expiry (from its
/// `expires_at` to the waiter's `acquired_at`, by the database clock).
async fn hand_off(app: &TestApp, key: &str, ttl_ms: i64, release: bool) -> Duration {
    let holder = app.acquire(key, "holder", ttl_ms).await;
    let http = app.http.clone();
    let base = app.instance.base.clone();
    let owned = key.to_owned();
    let waiter = tokio::spawn(async move {
        let answer = acquire_waiting(&http, &base, &owned, "waiter", 60_000).await;
        (answer, Instant::now())
    });
    until_queued(app.db(), key, 1).await;
    let at = |v: &Value, field: &str| {
        chrono::DateTime::parse_from_rfc3339(v[field].as_str().unwrap()).unwrap()
    };
    if release {
        assert_eq!(app.release(key, token(&holder)).await.status(), 204);
        let released = Instant::now();
        let ((status, grant), granted) = waiter.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{grant}");
        assert_eq!(app.release(key, token(&grant)).await.status(), 204);
        granted - released
    } else {
        let ((status, grant), _) = waiter.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{grant}");
        assert_eq!(app.release(key, token(&grant)).await.status(), 204);
        (at(&grant, "acquired_at") - at(&holder, "expires_at"))
            .to_std()
            .expect("granted after the expiry")
    }
}

/// Not a timed assertion: the figures of the hand-off from a release (its `204` to the first
/// waiter's `201`, on this machine's clock) and from an expiry (the holder's `expires_at` to the
/// waiter's grant, both by the database clock), printed for bench/README.md. Run alone for
/// figures that mean something: `cargo test --release --test api hand_off -- --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_off_latency_from_a_release_and_from_an_expiry_is_measured() {
    let app = TestApp::spawn().await;
    let mut released = Vec::new();
    for i in 0..100 {
        released.push(hand_off(&app, &format!("release-{i}"), 30_000, true).await);
    }
    let mut expired = Vec::new();
    for i in 0..30 {
        expired.push(hand_off(&app, &format!("expiry-{i}"), 200, false).await);
    }
    for (what, samples) in [("a release", &mut released), ("an expiry", &mut expired)] {
        let p50 = quantile(samples, 0.5);
        let p99 = quantile(samples, 0.99);
        let max = quantile(samples, 1.0);
        eprintln!(
            "hand-off from {what}: {} samples, p50 {p50:?}, p99 {p99:?}, max {max:?}",
            samples.len()
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn a_waiting_acquire_sent_again_with_its_idempotency_key_is_answered_its_grant() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    let send = || {
        app.request(Method::POST, "/v1/leases/k")
            .header("Idempotency-Key", "wait-once")
            .json(&json!({"owner": "w", "ttl_ms": 30000, "wait_ms": 60_000}))
            .send()
    };
    let first = send();
    let released = async {
        until_queued(app.db(), "k", 1).await;
        assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    };
    let (first, ()) = tokio::join!(first, released);
    let first = first.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let grant: Value = first.json().await.unwrap();
    let again = send().await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    let replayed: Value = again.json().await.unwrap();
    assert_eq!(replayed, grant, "the same grant, not a new one");
    assert_eq!(queued(app.db(), "k").await, 0);
    app.stop().await;
}

#[tokio::test]
async fn a_request_with_the_idempotency_key_of_a_queued_waiter_is_409_request_in_progress_at_once_on_any_instance()
 {
    let app = TestApp::spawn().await;
    let other = app.another_instance().await;
    let holder = app.acquire("k", "holder", 30000).await;
    let send = |base: &str| {
        app.http
            .post(format!("{base}/v1/leases/k"))
            .header("Idempotency-Key", "wait-once")
            .json(&json!({"owner": "w", "ttl_ms": 30000, "wait_ms": 60_000}))
            .send()
    };
    let first = tokio::spawn(send(&app.instance.base));
    until_queued(app.db(), "k", 1).await;
    // The same request again, here and through the other instance: still running, so answered
    // at once, and the queue keeps one place.
    for base in [&app.instance.base, &other.base] {
        let started = Instant::now();
        let r = send(base).await.unwrap();
        assert_eq!(r.headers()["retry-after"], "1");
        problem(r, StatusCode::CONFLICT, "request_in_progress").await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "answered at once, not after a wait: {:?}",
            started.elapsed()
        );
        assert_eq!(queued(app.db(), "k").await, 1, "no second place");
    }
    // One that does not wait, through the waiter's instance, likewise (nothing is stored under
    // the key, which the waiter's answer will be).
    let plain = app
        .http
        .post(format!("{}/v1/leases/k", app.instance.base))
        .header("Idempotency-Key", "wait-once")
        .json(&json!({"owner": "w", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    problem(plain, StatusCode::CONFLICT, "request_in_progress").await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let grant: Value = first.json().await.unwrap();
    // Once answered, the key replays its answer, wherever it is sent.
    let again = send(&other.base).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.json::<Value>().await.unwrap(), grant);
    other.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn the_idempotency_key_of_a_dead_instances_waiter_is_free_at_once() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    // Another instance, alive while this connection holds its liveness lock, queued a waiter
    // sent with the key "retried"; then it dies (SIGKILL: its connection goes, and the lock).
    let mut instance = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(waiter_lock_class(), 2000000001)")
        .execute(&mut instance)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO lease_waiters (key, instance, principal, idem) VALUES ('k', 2000000001, '', 'retried')",
    )
    .execute(app.db())
    .await
    .unwrap();
    instance.close().await.unwrap();
    // Its client retries through this instance at once, before any sweep: it takes the place.
    let retry = tokio::spawn(
        app.request(Method::POST, "/v1/leases/k")
            .header("Idempotency-Key", "retried")
            .json(&json!({"owner": "w", "ttl_ms": 30000, "wait_ms": 60_000}))
            .send(),
    );
    let deadline = Instant::now() + CEILING;
    while sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM lease_waiters WHERE idem = 'retried' AND instance <> 2000000001",
    )
    .fetch_one(app.db())
    .await
    .unwrap()
        == 0
    {
        assert!(
            !retry.is_finished(),
            "the retry was answered while the key was held"
        );
        assert!(Instant::now() < deadline, "the retry never took a place");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let retry = retry.await.unwrap().unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    app.stop().await;
}

#[tokio::test]
async fn a_key_released_while_its_first_waiters_instance_is_frozen_goes_to_the_next_waiter_within_the_bound()
 {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    // A frozen instance (SIGSTOP): its connection, and its liveness lock, stay; it said it was
    // alive once and then nothing more. Its waiter is first in the queue.
    let mut frozen = PgConnection::connect_with(&app.options).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(waiter_lock_class(), 2000000002)")
        .execute(&mut frozen)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO waiter_instances (instance, seen_at, stale_after) \
         VALUES (2000000002, clock_timestamp(), interval '1 second')",
    )
    .execute(app.db())
    .await
    .unwrap();
    sqlx::query("INSERT INTO lease_waiters (key, instance) VALUES ('k', 2000000002)")
        .execute(app.db())
        .await
        .unwrap();
    let waiter = spawn_waiter(&app, "k", "live", 60_000);
    until_queued(app.db(), "k", 2).await;
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let released = Instant::now();
    let (status, grant) = tokio::time::timeout(CEILING, waiter)
        .await
        .expect("the live waiter is served")
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{grant}");
    assert_eq!(grant["owner"], "live");
    // The bound (1 s) and the sweep's half second, with as much again for a loaded machine.
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "granted {:?} after the release",
        released.elapsed()
    );
    // The frozen instance's place was taken out; its lock is still held all the while.
    until_queued(app.db(), "k", 0).await;
    let alive: bool = sqlx::query_scalar(
        "SELECT NOT pg_try_advisory_lock_shared(waiter_lock_class(), 2000000002)",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert!(
        alive,
        "the frozen instance's connection still holds its lock"
    );
    frozen.close().await.unwrap();
    app.stop().await;
}

/// `GET path` through `app`'s instance, answered 200 with its body.
async fn read(app: &TestApp, path: &str) -> Value {
    let r = app.get(path).await;
    assert_eq!(r.status(), StatusCode::OK, "{path}");
    r.json().await.unwrap()
}

/// The owners of a page of a key's queue, with their positions.
fn queue(page: &Value) -> Vec<(i64, &str)> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["position"].as_i64().unwrap(),
                w["owner"].as_str().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_keys_queue_lists_its_waiters_owners_in_grant_order() {
    let app = TestApp::spawn().await;
    let holder = app.acquire("k", "holder", 30000).await;
    let first = spawn_waiter(&app, "k", "first", 60_000);
    until_queued(app.db(), "k", 1).await;
    let second = spawn_waiter(&app, "k", "second", 60_000);
    until_queued(app.db(), "k", 2).await;
    let page = read(&app, "/v1/leases/k/waiters").await;
    assert_eq!(queue(&page), [(1, "first"), (2, "second")]);
    assert!(page["items"][0]["since"].as_str().unwrap().ends_with('Z'));
    assert_eq!(page["next_cursor"], Value::Null);
    assert_eq!(app.release("k", token(&holder)).await.status(), 204);
    let (status, _) = tokio::time::timeout(CEILING, first).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::CREATED);
    let page = read(&app, "/v1/leases/k/waiters").await;
    assert_eq!(queue(&page), [(1, "second")]);
    second.abort();
    app.stop().await;
}

#[tokio::test]
async fn a_keys_status_and_the_list_count_its_waiters() {
    let app = TestApp::spawn().await;
    app.acquire("k", "holder", 30000).await;
    app.acquire("free", "other", 30000).await;
    let waiters: Vec<_> = (0..3)
        .map(|_| spawn_waiter(&app, "k", "w", 60_000))
        .collect();
    until_queued(app.db(), "k", 3).await;
    assert_eq!(read(&app, "/v1/leases/k").await["waiters"], 3);
    let list = read(&app, "/v1/leases").await;
    let counts: Vec<(&str, i64)> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["key"].as_str().unwrap(), s["waiters"].as_i64().unwrap()))
        .collect();
    assert_eq!(counts, [("free", 0), ("k", 3)]);
    waiters.iter().for_each(tokio::task::JoinHandle::abort);
    app.stop().await;
}

#[tokio::test]
async fn a_keys_queue_pages_through_next_cursor_keeping_each_waiters_position() {
    let app = TestApp::spawn().await;
    app.acquire("k", "holder", 30000).await;
    let owners = ["w1", "w2", "w3"];
    let mut waiters = Vec::new();
    for (i, owner) in owners.into_iter().enumerate() {
        waiters.push(spawn_waiter(&app, "k", owner, 60_000));
        until_queued(app.db(), "k", i as i64 + 1).await;
    }
    let page = read(&app, "/v1/leases/k/waiters?limit=2").await;
    assert_eq!(queue(&page), [(1, "w1"), (2, "w2")]);
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = read(
        &app,
        &format!("/v1/leases/k/waiters?limit=2&cursor={cursor}"),
    )
    .await;
    assert_eq!(queue(&rest), [(3, "w3")]);
    assert_eq!(rest["next_cursor"], Value::Null);
    waiters.iter().for_each(tokio::task::JoinHandle::abort);
    app.stop().await;
}

#[tokio::test]
async fn a_key_no_one_waits_for_has_an_empty_queue_leased_or_not() {
    let app = TestApp::spawn().await;
    app.acquire("held", "holder", 30000).await;
    for key in ["held", "never-leased"] {
        let page = read(&app, &format!("/v1/leases/{key}/waiters")).await;
        assert_eq!(page, json!({"items": [], "next_cursor": null}));
    }
    app.stop().await;
}

#[tokio::test]
async fn reading_a_queue_with_a_bad_limit_or_cursor_is_invalid_request() {
    let app = TestApp::spawn().await;
    for query in ["limit=0", "limit=1001", "cursor=x", "prefix=k"] {
        let r = app.get(&format!("/v1/leases/k/waiters?{query}")).await;
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}
