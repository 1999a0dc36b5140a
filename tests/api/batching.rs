//! Group commit: the hot calls that arrive together on an instance go to the database as one
//! statement per kind, in one transaction, and each is still answered for itself.
//!
//! To make requests arrive together on purpose, a test holds the row locks of a few keys and
//! sends one request to each: those are the batches of a kind an instance has in flight at
//! once, and every request sent after them gathers in the next batch until the locks go.

use std::time::Duration;

use reqwest::{Method, Response, StatusCode};
use serde_json::Value;
use sqlx::{PgConnection, Postgres, Transaction};
use tokio::task::JoinHandle;

use crate::harness::{TestApp, problem, token};
use crate::metrics::{sample, scrape};

/// The batches of one kind an instance has in flight at once (`IN_FLIGHT` in
/// `src/store/engine/batch/`).
const IN_FLIGHT: usize = 4;

/// `PUT` sent in the background.
fn put_later(app: &TestApp, key: &str, token: i64, body: &str) -> JoinHandle<Response> {
    put_if_match_later(app, key, token, body, None)
}

/// `PUT` with an optional `If-Match`, sent in the background.
fn put_if_match_later(
    app: &TestApp,
    key: &str,
    token: i64,
    body: &str,
    if_match: Option<&str>,
) -> JoinHandle<Response> {
    let mut r = app
        .request(Method::PUT, &format!("/v1/snapshots/{key}"))
        .header("Fencing-Token", token.to_string())
        .body(body.to_owned());
    if let Some(tag) = if_match {
        r = r.header("If-Match", tag);
    }
    tokio::spawn(async move { r.send().await.expect("put") })
}

/// Waits until the instance has `n` requests waiting to be sent.
async fn until_waiting(app: &TestApp, n: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = sample(&scrape(app).await, "snapfence_db_pool_waiting");
        if waiting == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{waiting} requests wait to be sent, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Which of an instance's dispatchers a [`Blocked`] holds up.
#[derive(Clone, Copy)]
enum Kind {
    Writes,
    Acquires,
}

/// Every slot of one kind taken: a transaction holding the row locks of `IN_FLIGHT` leased keys, and a
/// request of that kind for each waiting on its lock (a write with the key's token, or another
/// owner's acquire). Rolling the transaction back lets them all go.
struct Blocked {
    locks: Transaction<'static, Postgres>,
    requests: Vec<JoinHandle<Response>>,
    kind: Kind,
}

impl Blocked {
    async fn take(app: &TestApp, kind: Kind) -> Self {
        let mut tokens = Vec::new();
        for n in 0..IN_FLIGHT {
            tokens.push(token(
                &app.acquire(&format!("blocker-{n}"), "b", 60000).await,
            ));
        }
        let mut locks = app.db().begin().await.unwrap();
        lock_blockers(&mut locks).await;
        // One at a time, each in a batch of its own.
        let mut requests = Vec::new();
        for (n, t) in tokens.iter().enumerate() {
            let key = format!("blocker-{n}");
            requests.push(match kind {
                Kind::Writes => put_later(app, &key, *t, "b"),
                Kind::Acquires => acquire_later(app, &key, "other"),
            });
            until_in_use(app, n + 1).await;
        }
        Self {
            locks,
            requests,
            kind,
        }
    }

    /// Lets the blocked requests go; each is answered as if alone.
    async fn release(self) {
        self.locks.rollback().await.unwrap();
        let expected = match self.kind {
            Kind::Writes => StatusCode::CREATED,
            Kind::Acquires => StatusCode::CONFLICT,
        };
        for r in self.requests {
            assert_eq!(r.await.unwrap().status(), expected);
        }
    }
}

/// An acquire of `key` for `owner`, sent in the background.
fn acquire_later(app: &TestApp, key: &str, owner: &str) -> JoinHandle<Response> {
    let r = app
        .request(Method::POST, &format!("/v1/leases/{key}"))
        .json(&serde_json::json!({"owner": owner, "ttl_ms": 60000}));
    tokio::spawn(async move { r.send().await.expect("acquire") })
}

async fn lock_blockers(c: &mut PgConnection) {
    sqlx::query("SELECT 1 FROM leases WHERE key LIKE 'blocker-%' FOR UPDATE")
        .execute(c)
        .await
        .unwrap();
}

/// Waits until `n` hot connections are in use.
async fn until_in_use(app: &TestApp, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let series = r#"snapfence_db_pool_connections{state="in_use"}"#;
    while sample(&scrape(app).await, series) != n as f64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the blockers never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How many transactions wrote the rows of `table` whose key starts with `prefix`.
async fn writing_transactions(app: &TestApp, table: &str, prefix: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT count(DISTINCT xmin::text) FROM {table} WHERE key LIKE $1 || '%'"
    ))
    .bind(prefix)
    .fetch_one(app.db())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_that_arrive_together_commit_in_one_transaction_each_with_its_own_outcome() {
    let app = TestApp::spawn().await;
    let mut fresh = Vec::new();
    for n in 0..12 {
        fresh.push(token(&app.acquire(&format!("g-ok-{n}"), "w", 60000).await));
    }
    let mut stale = Vec::new();
    for n in 0..4 {
        stale.push(token(
            &app.acquire(&format!("g-stale-{n}"), "old", 150).await,
        ));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    for n in 0..4 {
        app.acquire(&format!("g-stale-{n}"), "new", 60000).await;
    }
    let guarded = token(&app.acquire("g-guarded", "w", 60000).await);
    assert_eq!(
        app.put("g-guarded", guarded, "v1").await.status(),
        StatusCode::CREATED
    );

    let blocked = Blocked::take(&app, Kind::Writes).await;
    let ok: Vec<_> = (0..12)
        .map(|n| put_later(&app, &format!("g-ok-{n}"), fresh[n], "new"))
        .collect();
    let refused: Vec<_> = (0..4)
        .map(|n| put_later(&app, &format!("g-stale-{n}"), stale[n], "late"))
        .collect();
    let unknown = put_later(&app, "g-never-leased", 1, "who");
    let mismatched = put_if_match_later(&app, "g-guarded", guarded, "v2", Some("\"nope\""));
    until_waiting(&app, 18.0).await;
    blocked.release().await;

    for w in ok {
        assert_eq!(w.await.unwrap().status(), StatusCode::CREATED);
    }
    for w in refused {
        problem(w.await.unwrap(), StatusCode::CONFLICT, "stale_token").await;
    }
    problem(
        unknown.await.unwrap(),
        StatusCode::CONFLICT,
        "unknown_token",
    )
    .await;
    problem(
        mismatched.await.unwrap(),
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed",
    )
    .await;
    assert_eq!(
        writing_transactions(&app, "snapshot_versions", "g-ok-").await,
        1,
        "the twelve writes committed together"
    );
    let batch: (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM rejections WHERE key LIKE 'g-%'), \
                (SELECT count(*) FROM rejections r WHERE key LIKE 'g-%' AND r.xmin::text = \
                    (SELECT min(v.xmin::text) FROM snapshot_versions v WHERE v.key = 'g-ok-0'))",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(
        batch,
        (5, 5),
        "each refusal is audited, in the writes' transaction"
    );
    assert_eq!(
        app.get("/v1/snapshots/g-guarded")
            .await
            .text()
            .await
            .unwrap(),
        "v1"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_keys_writes_are_decided_in_their_order_of_arrival() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("ordered", "w", 60000).await);
    let blocked = Blocked::take(&app, Kind::Writes).await;
    let mut writes = Vec::new();
    for n in 1..=8 {
        writes.push(put_later(&app, "ordered", t, &n.to_string()));
        until_waiting(&app, n as f64).await;
    }
    blocked.release().await;
    for (n, w) in writes.into_iter().enumerate() {
        let r = w.await.unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        let written: Value = r.json().await.unwrap();
        assert_eq!(written["version"], n + 1, "the write sent {}th", n + 1);
    }
    assert_eq!(
        app.get("/v1/snapshots/ordered").await.text().await.unwrap(),
        "8"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grants_that_arrive_together_commit_in_one_transaction_each_with_its_own_token() {
    let app = TestApp::spawn().await;
    let held = token(&app.acquire("held-key", "first", 60000).await);
    for n in 0..8 {
        app.acquire(&format!("a-{n}"), "expired", 150).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let blocked = Blocked::take(&app, Kind::Acquires).await;
    // Eight keys whose leases expired, eight keys never acquired, and one held key.
    let grants: Vec<_> = (0..16)
        .map(|n| acquire_later(&app, &format!("a-{n}"), "new"))
        .collect();
    let refused = acquire_later(&app, "held-key", "second");
    until_waiting(&app, 17.0).await;
    blocked.release().await;

    let mut tokens = std::collections::HashSet::new();
    for g in grants {
        let r = g.await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let t = token(&r.json().await.unwrap());
        assert!(t > held && tokens.insert(t), "token {t} is new and unique");
    }
    problem(refused.await.unwrap(), StatusCode::CONFLICT, "lease_held").await;
    assert_eq!(
        writing_transactions(&app, "leases", "a-").await,
        1,
        "the sixteen grants committed together "
    );
    app.stop().await;
}

/// After a burst has opened several hot connections, one client's requests keep to the one used
/// last (the hot pool hands connections out LIFO), so they run on a backend whose caches are
/// warm; going round every connection made each statement ~1.5 x slower.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_client_after_a_burst_keeps_to_the_hot_connection_used_last() {
    let app = TestApp::spawn().await;
    app.acquire("lone", "a", 60000).await;
    // Every slot of a kind in flight at once: IN_FLIGHT hot connections open, then all idle.
    Blocked::take(&app, Kind::Writes).await.release().await;
    let since: String = sqlx::query_scalar("SELECT clock_timestamp()::text")
        .fetch_one(app.db())
        .await
        .unwrap();
    for _ in 0..IN_FLIGHT * 3 {
        assert_eq!(app.get("/v1/leases/lone").await.status(), StatusCode::OK);
    }
    // The status statement, by its opening (pg_stat_activity keeps the first 1 KiB of a query).
    let status = snapfence::store::hot_statements()
        .into_iter()
        .find(|(name, _)| *name == "status")
        .map(|(_, text)| text.chars().take(200).collect::<String>())
        .unwrap();
    let backends: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT pid) FROM pg_stat_activity
         WHERE datname = current_database() AND query_start > $1::timestamptz
             AND starts_with(query, $2)",
    )
    .bind(&since)
    .bind(&status)
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(
        backends, 1,
        "one client's reads went to {backends} backends"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_metrics_count_each_batch_and_the_requests_it_carried() {
    let app = TestApp::spawn().await;
    let mut tokens = Vec::new();
    for n in 0..10 {
        tokens.push(token(&app.acquire(&format!("m-{n}"), "w", 60000).await));
    }
    let count = |text: &str, family: &str| sample(text, &format!("{family}{{kind=\"put\"}}"));
    let before = scrape(&app).await;
    let blocked = Blocked::take(&app, Kind::Writes).await;
    let gathered: Vec<_> = (0..10)
        .map(|n| put_later(&app, &format!("m-{n}"), tokens[n], "v"))
        .collect();
    until_waiting(&app, 10.0).await;
    blocked.release().await;
    for w in gathered {
        assert_eq!(w.await.unwrap().status(), StatusCode::CREATED);
    }
    let after = scrape(&app).await;
    let requests = count(&after, "snapfence_batched_requests_total")
        - count(&before, "snapfence_batched_requests_total");
    let batches =
        count(&after, "snapfence_batches_total") - count(&before, "snapfence_batches_total");
    assert_eq!(requests, (IN_FLIGHT + 10) as f64, "every put in a batch");
    // The blocked ones went one to a batch, the ten gathered behind them together.
    assert!(
        batches > IN_FLIGHT as f64 && batches <= (IN_FLIGHT + 2) as f64,
        "{batches} batches"
    );
    app.stop().await;
}
