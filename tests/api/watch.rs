//! Watch (`GET /v1/watch`): every change seen once and in order through another instance than
//! the writer's, resumption with `Last-Event-ID` after a cut with no gap and no duplicate,
//! prefixes and their scopes, `410 compacted`, heartbeats, expiries by the database clock, the
//! end of a stream after `--max-watch`, a relay that dies, and the idle cut of a stream whose
//! client stopped reading, which falls between two events.

use std::collections::BTreeSet;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use crate::harness::{self, Instance, TestApp, enc, problem, rules, token};
use crate::metrics::{sample, scrape};

/// How long a condition that must come about may take at most (a generous ceiling on a loaded
/// machine, never a speed expectation).
const CEILING: Duration = Duration::from_secs(30);

/// One server-sent event as it came over the wire.
#[derive(Debug, Clone)]
struct Sse {
    id: i64,
    event: String,
    data: Value,
}

/// A watch stream read event by event, as any SSE client reads it.
struct Stream {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: String,
    /// Comment lines seen so far (heartbeats).
    comments: usize,
    /// The change id the stream starts after (`Watch-After`).
    after: i64,
}

impl Stream {
    /// Opens `GET /v1/watch{query}` on `base`, with `Last-Event-ID` when given; the answer
    /// must be a stream.
    async fn open(http: &reqwest::Client, base: &str, query: &str, last: Option<i64>) -> Self {
        let mut req = http.get(format!("{base}/v1/watch{query}"));
        if let Some(last) = last {
            req = req.header("Last-Event-ID", last.to_string());
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "watch{query}");
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let after = r.headers()["watch-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        Self {
            body: r.bytes_stream().boxed(),
            buffer: String::new(),
            comments: 0,
            after,
        }
    }

    /// The next event; `None` when the stream ended or nothing came within `within`.
    async fn next_within(&mut self, within: Duration) -> Option<Sse> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (None, None, None);
                for line in block.lines().filter(|l| !l.is_empty()) {
                    match line.split_once(':') {
                        Some(("", _)) => self.comments += 1,
                        Some(("id", v)) => id = Some(v.trim().parse().unwrap()),
                        Some(("event", v)) => event = Some(v.trim().to_owned()),
                        Some(("data", v)) => data = Some(serde_json::from_str(v.trim()).unwrap()),
                        _ => panic!("an unexpected line in {block:?}"),
                    }
                }
                if let (Some(id), Some(event), Some(data)) = (id, event, data) {
                    return Some(Sse { id, event, data });
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next()).await;
            match chunk {
                Ok(Some(Ok(bytes))) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                Ok(Some(Err(e))) => panic!("the stream failed: {e}"),
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// The next event, which must come within the ceiling.
    async fn next(&mut self) -> Sse {
        self.next_within(CEILING)
            .await
            .expect("an event within the ceiling")
    }

    /// Asserts that no event comes within half a second: the history has nothing more.
    async fn nothing_more(&mut self) {
        let extra = self.next_within(Duration::from_millis(500)).await;
        assert!(extra.is_none(), "an event beyond the history: {extra:?}");
    }

    /// The next `n` events.
    async fn take(&mut self, n: usize) -> Vec<Sse> {
        let mut events = Vec::with_capacity(n);
        for _ in 0..n {
            events.push(self.next().await);
        }
        events
    }
}

/// (event, key, token) of an event: what the tests compare with the history they made.
fn what(e: &Sse) -> (String, String, i64) {
    (
        e.event.clone(),
        e.data["key"].as_str().unwrap().to_owned(),
        e.data["token"].as_i64().unwrap(),
    )
}

/// [`what`] of each event.
fn summary(events: &[Sse]) -> Vec<(String, String, i64)> {
    events.iter().map(what).collect()
}

fn change(event: &str, key: &str, token: i64) -> (String, String, i64) {
    (event.to_owned(), key.to_owned(), token)
}

/// A request to `path` on `instance`, with `token` as its Fencing-Token.
async fn fenced(app: &TestApp, method: Method, path: &str, token: i64) -> reqwest::Response {
    app.request(method, path)
        .header("Fencing-Token", token.to_string())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn every_kind_of_change_is_seen_once_in_order_through_another_instance() {
    let app = TestApp::spawn().await;
    let b = app.another_instance().await;
    let mut watch = Stream::open(&app.http, &b.base, "", None).await;

    // Long enough for the three calls below to come first on a loaded machine.
    let first = token(&app.acquire("jobs/a", "w1", 2000).await);
    assert_eq!(app.put("jobs/a", first, "one").await.status(), 201);
    let refused = app.put("jobs/a", first + 100, "stale").await;
    let audit_id = problem(refused, StatusCode::CONFLICT, "unknown_token").await["audit_id"]
        .as_i64()
        .unwrap();
    let snap = format!("/v1/snapshots/{}", enc("jobs/a"));
    assert_eq!(
        fenced(&app, Method::DELETE, &snap, first).await.status(),
        204
    );
    // The lease expires by the database clock; the next grant needs no reconciling.
    let mut events = watch.take(5).await;
    let second = token(
        &app.acquire_with("jobs/a", json!({"owner": "w2", "ttl_ms": 30000}))
            .await
            .json::<Value>()
            .await
            .unwrap(),
    );
    let lease = format!("/v1/leases/{}", enc("jobs/a"));
    let mark = format!("{lease}/require-recovery");
    assert_eq!(
        fenced(&app, Method::POST, &mark, second).await.status(),
        204
    );
    assert_eq!(
        fenced(&app, Method::DELETE, &lease, second).await.status(),
        204
    );
    let third = app
        .acquire_with(
            "jobs/a",
            json!({"owner": "w3", "ttl_ms": 30000, "reconciled": true}),
        )
        .await;
    assert_eq!(third.status(), 201);
    let third = token(&third.json().await.unwrap());
    let abandon = format!("{lease}/abandon");
    assert_eq!(
        fenced(&app, Method::POST, &abandon, third).await.status(),
        204
    );
    events.extend(watch.take(6).await);

    assert_eq!(
        summary(&events),
        vec![
            change("lease.granted", "jobs/a", first),
            change("snapshot.written", "jobs/a", first),
            change("write.refused", "jobs/a", first + 100),
            change("snapshot.deleted", "jobs/a", first),
            change("lease.expired", "jobs/a", first),
            change("lease.granted", "jobs/a", second),
            change("lease.recovery_required", "jobs/a", second),
            change("lease.released", "jobs/a", second),
            change("lease.reconciled", "jobs/a", third),
            change("lease.granted", "jobs/a", third),
            change("lease.abandoned", "jobs/a", third),
        ]
    );
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    // The members each kind carries, and no body.
    assert_eq!(events[1].data["version"], 1);
    assert!(events[1].data["etag"].as_str().unwrap().starts_with('"'));
    assert_eq!(events[2].data["reason"], "unknown_token");
    assert_eq!(events[2].data["audit_id"], audit_id);
    assert_eq!(events[2].data["operation"], "put");
    assert_eq!(events[3].data["version"], 1);
    assert_eq!(events[8].data["reason"], "recovery_required");
    assert_eq!(events[8].data["record_token"], second);
    for e in &events {
        assert!(
            e.data["at"].is_string() && e.data.get("body").is_none(),
            "{e:?}"
        );
    }
    // Nothing more: a renewal is not a change.
    let renew = app
        .request(Method::POST, &format!("/v1/leases/{}/renew", enc("jobs/b")))
        .json(&json!({"token": token(&app.acquire("jobs/b", "w", 30000).await)}))
        .send()
        .await
        .unwrap();
    assert_eq!(renew.status(), 200);
    assert_eq!(watch.next().await.event, "lease.granted");
    watch.nothing_more().await;
    b.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_watch_from_the_start_of_an_epoch_gets_all_of_it_after_one_resumed_inside_it() {
    let app = TestApp::spawn().await;
    let before: i64 = sqlx::query_scalar("SELECT max(last_id) FROM change_epochs")
        .fetch_one(app.db())
        .await
        .unwrap();
    // Ten changes of one transaction: one epoch, whatever the relay's pace.
    sqlx::query(
        "INSERT INTO change_log (kind, key, token, at, owner, expires_at) \
         SELECT 'lease.granted', 'epoch/' || n, n, now(), 'w', now() FROM generate_series(1, 10) n",
    )
    .execute(app.db())
    .await
    .unwrap();
    let deadline = Instant::now() + CEILING;
    let first = loop {
        let first: Option<i64> = sqlx::query_scalar(
            "SELECT first_id FROM change_epochs WHERE last_id > $1 ORDER BY last_id LIMIT 1",
        )
        .bind(before)
        .fetch_one(app.db())
        .await
        .unwrap_or(None);
        if let Some(first) = first {
            break first;
        }
        assert!(Instant::now() < deadline, "the changes were never numbered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Resumed after the epoch's fifth change: its last five (what an instance reads of an epoch
    // for such a watcher is not the whole epoch, and must not stand for it).
    let mut inside = Stream::open(
        &app.http,
        &app.instance.base,
        "?prefix=epoch/",
        Some(first + 4),
    )
    .await;
    let tail: Vec<i64> = inside.take(5).await.iter().map(|e| e.id).collect();
    assert_eq!(tail, (first + 5..first + 10).collect::<Vec<_>>());
    let mut whole = Stream::open(
        &app.http,
        &app.instance.base,
        "?prefix=epoch/",
        Some(first - 1),
    )
    .await;
    let all: Vec<i64> = whole.take(10).await.iter().map(|e| e.id).collect();
    assert_eq!(all, (first..first + 10).collect::<Vec<_>>());
    whole.nothing_more().await;
    app.stop().await;
}

#[tokio::test]
async fn a_watch_cut_mid_stream_and_resumed_with_last_event_id_misses_nothing_and_repeats_nothing()
{
    const WRITERS: usize = 8;
    const WRITES: usize = 1250; // each: 10,000 writes in all
    let app = TestApp::spawn().await;
    let b = app.another_instance().await;
    let start = Stream::open(&app.http, &b.base, "?prefix=cut/", None).await;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let key = format!("cut/{w}");
        let t = token(&app.acquire(&key, "writer", 600_000).await);
        let (http, base) = (app.http.clone(), app.instance.base.clone());
        writers.push(tokio::spawn(async move {
            for n in 0..WRITES {
                let r = http
                    .put(format!("{base}/v1/snapshots/{}", enc(&key)))
                    .header("Fencing-Token", t.to_string())
                    .body(format!("{n}"))
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "{}", r.status());
            }
        }));
    }
    // Read while they write, cutting the connection every 1,500 events and resuming from the
    // last id received.
    let mut seen: Vec<Sse> = Vec::new();
    let mut stream = start;
    let total = WRITERS * (WRITES + 1);
    while seen.len() < total {
        for _ in 0..1500 {
            if seen.len() == total {
                break;
            }
            seen.push(stream.next().await);
        }
        let last = seen.last().unwrap().id;
        stream = Stream::open(&app.http, &b.base, "?prefix=cut/", Some(last)).await;
    }
    for w in writers {
        w.await.unwrap();
    }
    stream.nothing_more().await;
    let ids: Vec<i64> = seen.iter().map(|e| e.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "in order, none twice");
    let writes: BTreeSet<(String, i64)> = seen
        .iter()
        .filter(|e| e.event == "snapshot.written")
        .map(|e| {
            (
                e.data["key"].as_str().unwrap().to_owned(),
                e.data["version"].as_i64().unwrap(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, i64)> = (0..WRITERS)
        .flat_map(|w| (1..=WRITES as i64).map(move |v| (format!("cut/{w}"), v)))
        .collect();
    assert_eq!(writes.len(), WRITERS * WRITES, "every write once");
    assert_eq!(writes, expected);
    b.stop().await;
    app.stop().await;
}

/// Ids come from epochs (snapshots) and, within one, from a number each change draws after its
/// row lock: batched statements through two instances that queue on the same few keys must
/// still show each key's leases one after another, and the ids must be dense.
#[tokio::test]
async fn each_keys_changes_come_in_commit_order_while_batches_through_two_instances_queue_on_it() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 20;
    const KEYS: usize = 3;
    let app = TestApp::spawn().await;
    let b = app.another_instance().await;
    let mut stream = Stream::open(&app.http, &b.base, "?prefix=order/", None).await;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let base = if t % 2 == 0 {
            &app.instance.base
        } else {
            &b.base
        }
        .clone();
        let http = app.http.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let key = enc(&format!("order/{}", (t + round) % KEYS));
                let grant = http
                    .post(format!("{base}/v1/leases/{key}"))
                    .json(&json!({"owner": format!("w{t}"), "ttl_ms": 60000, "wait_ms": 60000}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(grant.status(), StatusCode::CREATED);
                let lease = token(&grant.json().await.unwrap());
                for (method, path) in [
                    (Method::PUT, format!("/v1/snapshots/{key}")),
                    (Method::DELETE, format!("/v1/leases/{key}")),
                ] {
                    let r = http
                        .request(method, format!("{base}{path}"))
                        .header("Fencing-Token", lease.to_string())
                        .body(format!("{t}/{round}"))
                        .send()
                        .await
                        .unwrap();
                    assert!(r.status().is_success(), "{path}: {}", r.status());
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let events = stream.take(TASKS * ROUNDS * 3).await;
    stream.nothing_more().await;
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "dense and increasing: {ids:?}"
    );
    for k in 0..KEYS {
        let key = format!("order/{k}");
        let mine: Vec<(String, String, i64)> = summary(&events)
            .into_iter()
            .filter(|c| c.1 == key)
            .collect();
        assert_eq!(mine.len() % 3, 0, "{key}: {mine:?}");
        let mut last = 0;
        for lease in mine.chunks(3) {
            let t = lease[0].2;
            assert!(t > last, "{key}: token {t} after {last}");
            assert_eq!(
                lease,
                [
                    change("lease.granted", &key, t),
                    change("snapshot.written", &key, t),
                    change("lease.released", &key, t)
                ],
                "{key}: one lease after another"
            );
            last = t;
        }
    }
    b.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_watch_delivers_only_the_keys_under_its_prefix() {
    let app = TestApp::spawn().await;
    let mut watch = Stream::open(&app.http, &app.instance.base, "?prefix=team-a%2F", None).await;
    app.acquire("team-b/x", "w", 30000).await;
    let mine = token(&app.acquire("team-a/x", "w", 30000).await);
    app.acquire("team-ab", "w", 30000).await;
    let e = watch.next().await;
    assert_eq!(what(&e), change("lease.granted", "team-a/x", mine));
    watch.nothing_more().await;
    app.stop().await;
}

#[tokio::test]
async fn a_watch_without_since_starts_after_every_change_answered_before_it_opened() {
    let app = TestApp::spawn().await;
    // Opened right after each grant's answer, before the relay's next turn has given it an id.
    for n in 0..5 {
        let key = format!("opened-{n}");
        let t = token(&app.acquire(&key, "w", 30000).await);
        let mut watch = Stream::open(
            &app.http,
            &app.instance.base,
            &format!("?prefix={key}"),
            None,
        )
        .await;
        let r = fenced(&app, Method::PUT, &format!("/v1/snapshots/{key}"), t).await;
        assert_eq!(r.status(), 201);
        let e = watch.next().await;
        assert_eq!(
            what(&e),
            change("snapshot.written", &key, t),
            "grant {n} was delivered"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn a_prefix_scoped_key_cannot_watch_outside_its_prefix() {
    let app = TestApp::spawn().await;
    let scoped = app
        .make_key("team-a", snapfence::domain::Scope::Read, "team-a/")
        .await;
    let watch = |query: &'static str| {
        app.request(Method::GET, &format!("/v1/watch{query}"))
            .header("Authorization", format!("Bearer {scoped}"))
            .send()
    };
    for outside in ["", "?prefix=team-b%2F", "?prefix=team-", "?prefix=team-a"] {
        problem(
            watch(outside).await.unwrap(),
            StatusCode::FORBIDDEN,
            "forbidden",
        )
        .await;
    }
    let inside = watch("?prefix=team-a%2Fjobs").await.unwrap();
    assert_eq!(inside.status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn a_malformed_since_or_last_event_id_is_400() {
    let app = TestApp::spawn().await;
    for query in ["?since=-1", "?since=x", "?since=1.5", "?since=", "?after=1"] {
        problem(
            app.get(&format!("/v1/watch{query}")).await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
    }
    // A bad one of the two is refused even when the other is the one that counts.
    for (query, last) in [
        ("", "seven"),
        ("?since=x", "3"),
        ("?since=9223372036854775808", "0"),
    ] {
        let r = app
            .request(Method::GET, &format!("/v1/watch{query}"))
            .header("Last-Event-ID", last)
            .send()
            .await
            .unwrap();
        problem(r, StatusCode::BAD_REQUEST, "invalid_request").await;
    }
    app.stop().await;
}

#[tokio::test]
async fn a_watch_says_where_it_starts_so_that_a_resume_before_any_change_misses_none() {
    let app = TestApp::spawn().await;
    app.acquire("before", "w", 30000).await;
    // Once the relay has numbered it, a watch from now starts after it.
    let deadline = Instant::now() + CEILING;
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM changes")
        .fetch_one(app.db())
        .await
        .unwrap()
        == 0
    {
        assert!(Instant::now() < deadline, "the grant was never numbered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = app.get("/v1/watch").await;
    let after: i64 = r.headers()["watch-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // An event of the id alone opens the stream: an EventSource keeps it as its last id.
    let mut body = r.bytes_stream();
    let opening = body.next().await.unwrap().unwrap();
    assert_eq!(
        std::str::from_utf8(&opening).unwrap(),
        format!("id: {after}\n\n")
    );
    drop(body);
    // Cut off before any change: the change made meanwhile comes on the resumed stream.
    let meanwhile = token(&app.acquire("meanwhile", "w", 30000).await);
    let mut resumed = Stream::open(&app.http, &app.instance.base, "", Some(after)).await;
    assert_eq!(resumed.after, after);
    assert_eq!(
        what(&resumed.next().await),
        change("lease.granted", "meanwhile", meanwhile)
    );
    app.stop().await;
}

#[tokio::test]
async fn last_event_id_wins_over_since() {
    let app = TestApp::spawn().await;
    for key in ["k1", "k2", "k3"] {
        app.acquire(key, "w", 30000).await;
    }
    let mut all = Stream::open(&app.http, &app.instance.base, "?since=0", None).await;
    let events = all.take(3).await;
    let mut resumed = Stream::open(
        &app.http,
        &app.instance.base,
        "?since=0",
        Some(events[1].id),
    )
    .await;
    assert_eq!(resumed.next().await.id, events[2].id);
    app.stop().await;
}

#[tokio::test]
async fn resuming_from_before_the_retained_history_is_410_compacted() {
    let mut short = rules();
    short.watch_retention = Duration::from_millis(200);
    let app = TestApp::spawn_with(short).await;
    // Two changes, so that once both are pruned an id (1) is older than the history (0 is not:
    // it is "the oldest change kept").
    app.acquire("old", "w", 30000).await;
    app.acquire("older", "w", 30000).await;
    // The relay prunes what is older than the retention; the horizon moves past it.
    let deadline = Instant::now() + CEILING;
    loop {
        let r = app.get("/v1/watch?since=1").await;
        if r.status() == StatusCode::GONE {
            let body = problem(r, StatusCode::GONE, "compacted").await;
            assert!(body["detail"].as_str().unwrap().contains("watch again"));
            break;
        }
        assert!(Instant::now() < deadline, "the history was never pruned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // From the horizon on, a watch resumes.
    let horizon: i64 = sqlx::query_scalar("SELECT pruned_through FROM change_horizon")
        .fetch_one(app.db())
        .await
        .unwrap();
    let mut watch = Stream::open(
        &app.http,
        &app.instance.base,
        &format!("?since={horizon}"),
        None,
    )
    .await;
    let grant = token(&app.acquire("new", "w", 30000).await);
    assert_eq!(
        what(&watch.next().await),
        change("lease.granted", "new", grant)
    );
    app.stop().await;
}

#[tokio::test]
async fn since_zero_starts_from_the_oldest_change_kept_even_once_history_was_pruned() {
    let mut short = rules();
    short.watch_retention = Duration::from_millis(200);
    let app = TestApp::spawn_with(short).await;
    app.acquire("old", "w", 30000).await;
    let deadline = Instant::now() + CEILING;
    let horizon = loop {
        let horizon: i64 = sqlx::query_scalar("SELECT pruned_through FROM change_horizon")
            .fetch_one(app.db())
            .await
            .unwrap();
        if horizon > 0 {
            break horizon;
        }
        assert!(Instant::now() < deadline, "the history was never pruned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Not 410: `0` names no change, it says "whatever is kept".
    let mut watch = Stream::open(&app.http, &app.instance.base, "?since=0", None).await;
    assert!(watch.after >= horizon, "{} < {horizon}", watch.after);
    let mut resumed = Stream::open(&app.http, &app.instance.base, "", Some(0)).await;
    assert!(resumed.after >= horizon, "Last-Event-ID: 0 is the same");
    let grant = token(&app.acquire("new", "w", 30000).await);
    assert_eq!(
        what(&watch.next().await),
        change("lease.granted", "new", grant)
    );
    assert_eq!(
        what(&resumed.next().await),
        change("lease.granted", "new", grant)
    );
    app.stop().await;
}

#[tokio::test]
async fn a_since_or_last_event_id_above_the_newest_id_is_400_naming_the_newest() {
    let app = TestApp::spawn().await;
    app.acquire("k", "w", 30000).await;
    let deadline = Instant::now() + CEILING;
    let newest = loop {
        let newest: i64 = sqlx::query_scalar("SELECT count(*) FROM changes")
            .fetch_one(app.db())
            .await
            .unwrap();
        if newest > 0 {
            break sqlx::query_scalar::<_, i64>("SELECT max(last_id) FROM change_epochs")
                .fetch_one(app.db())
                .await
                .unwrap();
        }
        assert!(Instant::now() < deadline, "the grant was never numbered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    for (query, last) in [
        (format!("?since={}", newest + 1), None),
        (String::new(), Some(newest + 1)),
        (String::new(), Some(i64::MAX)),
        // The header wins, and it is the one in the future.
        ("?since=0".to_owned(), Some(i64::MAX)),
    ] {
        let mut req = app.request(Method::GET, &format!("/v1/watch{query}"));
        if let Some(last) = last {
            req = req.header("Last-Event-ID", last.to_string());
        }
        let body = problem(
            req.send().await.unwrap(),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        )
        .await;
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("newest change id is {newest}")),
            "{query} {last:?}: {detail}"
        );
    }
    // The newest id itself is a resume point: the next change follows.
    let mut watch = Stream::open(
        &app.http,
        &app.instance.base,
        &format!("?since={newest}"),
        None,
    )
    .await;
    let grant = token(&app.acquire("next", "w", 30000).await);
    assert_eq!(
        what(&watch.next().await),
        change("lease.granted", "next", grant)
    );
    app.stop().await;
}

#[tokio::test]
async fn an_idle_watch_is_sent_heartbeat_comments() {
    let mut quick = rules();
    quick.watch_heartbeat = Duration::from_millis(100);
    let app = TestApp::spawn_with(quick).await;
    let mut watch = Stream::open(&app.http, &app.instance.base, "", None).await;
    assert!(
        watch
            .next_within(Duration::from_millis(1000))
            .await
            .is_none()
    );
    assert!(
        watch.comments >= 3,
        "{} heartbeats in a second at one per 100 ms",
        watch.comments
    );
    app.stop().await;
}

#[tokio::test]
async fn lease_expired_is_sent_within_a_second_of_the_expiry_by_the_database_clock() {
    let app = TestApp::spawn().await;
    let mut watch = Stream::open(&app.http, &app.instance.base, "", None).await;
    let grant = app.acquire("short", "w", 200).await;
    assert_eq!(watch.next().await.event, "lease.granted");
    let expired = watch.next().await;
    let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(app.db())
        .await
        .unwrap();
    assert_eq!(
        what(&expired),
        change("lease.expired", "short", token(&grant))
    );
    assert_eq!(expired.data["at"], grant["expires_at"], "at is the expiry");
    let at: chrono::DateTime<chrono::Utc> = expired.data["at"].as_str().unwrap().parse().unwrap();
    let late = now - at;
    println!(
        "lease.expired received {} ms after the expiry",
        late.num_milliseconds()
    );
    assert!(
        late < chrono::TimeDelta::seconds(1),
        "received {late} after the expiry"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_renewal_that_reaches_a_lease_after_its_expiry_was_reported_is_lease_lost() {
    let app = TestApp::spawn().await;
    let mut watch = Stream::open(&app.http, &app.instance.base, "", None).await;
    let t = token(&app.acquire("late", "w", 200).await);
    assert_eq!(watch.next().await.event, "lease.granted");
    assert_eq!(watch.next().await.event, "lease.expired");
    let renew = app
        .request(Method::POST, "/v1/leases/late/renew")
        .json(&json!({"token": t, "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    problem(renew, StatusCode::CONFLICT, "lease_lost").await;
    let release = app.release("late", t).await;
    problem(release, StatusCode::CONFLICT, "lease_lost").await;
    watch.nothing_more().await;
    app.stop().await;
}

#[tokio::test]
async fn a_stream_ends_after_max_watch_and_resumes_where_it_ended() {
    let mut brief = rules();
    brief.max_watch = Duration::from_millis(300);
    let app = TestApp::spawn_with(brief).await;
    let mut watch = Stream::open(&app.http, &app.instance.base, "", None).await;
    let first = token(&app.acquire("k", "w", 30000).await);
    let got = watch.next().await;
    assert_eq!(what(&got), change("lease.granted", "k", first));
    let ended = Instant::now();
    assert!(
        watch.next_within(CEILING).await.is_none(),
        "the stream ends"
    );
    assert!(
        ended.elapsed() < CEILING,
        "by itself, not by the test's ceiling"
    );
    let second = token(&app.acquire("k2", "w", 30000).await);
    let mut resumed = Stream::open(&app.http, &app.instance.base, "", Some(got.id)).await;
    assert_eq!(
        what(&resumed.next().await),
        change("lease.granted", "k2", second)
    );
    app.stop().await;
}

#[tokio::test]
async fn when_the_relaying_instance_stops_another_takes_over() {
    let database = harness::migrated_database().await;
    let http = reqwest::Client::new();
    // The first instance takes the role; the second waits for it to lapse.
    let a = Instance::start(database.options().clone(), rules()).await;
    let b = Instance::start(database.options().clone(), rules()).await;
    let mut watch = Stream::open(&http, &b.base, "", None).await;
    let acquire = |base: String, key: &'static str| {
        let http = http.clone();
        async move {
            let r = http
                .post(format!("{base}/v1/leases/{key}"))
                .json(&json!({"owner": "w", "ttl_ms": 30000}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            token(&r.json().await.unwrap())
        }
    };
    let before = acquire(a.base.clone(), "r1").await;
    assert_eq!(
        what(&watch.next().await),
        change("lease.granted", "r1", before)
    );
    a.stop().await;
    let after = acquire(b.base.clone(), "r2").await;
    assert_eq!(
        what(&watch.next().await),
        change("lease.granted", "r2", after)
    );
    b.stop().await;
}

/// A relay that takes the role reads the live leases, and its epochs bring grants it has just
/// read: a lease it expects twice must still be reported once, and on time, while grants keep
/// coming through the takeover and after it.
#[tokio::test]
async fn every_expiry_is_reported_once_and_on_time_while_grants_keep_coming_through_a_relay_takeover()
 {
    const KEYS: usize = 160;
    const EVERY: Duration = Duration::from_millis(50);
    let database = harness::migrated_database().await;
    let http = reqwest::Client::new();
    let a = Instance::start(database.options().clone(), rules()).await;
    let b = Instance::start(database.options().clone(), rules()).await;
    let mut watch = Stream::open(&http, &b.base, "?prefix=churn/", None).await;
    let started = chrono::Utc::now();
    let granting = {
        let (http, base) = (http.clone(), b.base.clone());
        tokio::spawn(async move {
            let mut granted = Vec::new();
            for round in 0..KEYS {
                let r = http
                    .post(format!("{base}/v1/leases/churn%2F{round}"))
                    .json(&json!({"owner": "w", "ttl_ms": 300}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                granted.push(token(&r.json().await.unwrap()));
                tokio::time::sleep(EVERY).await;
            }
            granted
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The role lapses after 3 s and b takes it within a second more, grants still coming.
    a.stop().await;
    let mut expired = Vec::new();
    while expired.len() < KEYS {
        let e = watch.next().await;
        if e.event == "lease.expired" {
            let at: chrono::DateTime<chrono::Utc> = e.data["at"].as_str().unwrap().parse().unwrap();
            expired.push((e.data["token"].as_i64().unwrap(), at, chrono::Utc::now()));
        }
    }
    let granted = granting.await.unwrap();
    watch.nothing_more().await;
    let mut tokens: Vec<i64> = expired.iter().map(|e| e.0).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, granted, "each lease expired once");
    let settled = started + chrono::TimeDelta::milliseconds(5500);
    for (token, at, received) in expired.into_iter().filter(|e| e.1 > settled) {
        assert!(
            received - at < chrono::TimeDelta::seconds(1),
            "the expiry of {token} at {at} was received at {received}"
        );
    }
    b.stop().await;
}

#[tokio::test]
async fn open_watches_are_counted_in_the_metrics() {
    let app = TestApp::spawn().await;
    let streams = |text: String| sample(&text, "snapfence_watch_streams");
    assert_eq!(streams(scrape(&app).await), 0.0);
    let one = Stream::open(&app.http, &app.instance.base, "", None).await;
    let two = Stream::open(&app.http, &app.instance.base, "?prefix=a", None).await;
    assert_eq!(streams(scrape(&app).await), 2.0);
    drop((one, two));
    let deadline = Instant::now() + CEILING;
    while streams(scrape(&app).await) != 0.0 {
        assert!(
            Instant::now() < deadline,
            "closed watches are never uncounted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.stop().await;
}

#[tokio::test]
async fn revoking_a_key_ends_its_open_streams_on_every_instance_within_a_second_saying_why() {
    let app = TestApp::spawn().await;
    let other = app.another_instance().await;
    let reader = app
        .make_key("reader", snapfence::domain::Scope::Read, "")
        .await;
    let stays = app
        .make_key("stays", snapfence::domain::Scope::Read, "")
        .await;
    let open = |base: &str, token: &str| {
        app.http
            .get(format!("{base}/v1/watch"))
            .header("Authorization", format!("Bearer {token}"))
            .send()
    };
    let mut revoked = Vec::new();
    for base in [&app.instance.base, &other.base] {
        let r = open(base, &reader).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        revoked.push(r.bytes_stream().boxed());
    }
    let kept = open(&other.base, &stays).await.unwrap();
    let mut kept = Stream {
        body: kept.bytes_stream().boxed(),
        buffer: String::new(),
        comments: 0,
        after: 0,
    };
    app.revoke_key("reader").await;
    let confirmed = Instant::now();
    for mut body in revoked {
        let mut text = String::new();
        loop {
            match tokio::time::timeout(CEILING, body.next()).await {
                Ok(Some(Ok(bytes))) => text.push_str(std::str::from_utf8(&bytes).unwrap()),
                Ok(None) => break,
                Ok(Some(Err(e))) => panic!("the stream failed instead of ending: {e}"),
                Err(_) => panic!("the stream of a revoked key stayed open: {text:?}"),
            }
        }
        // The contract's second, with as much again for a loaded machine.
        assert!(
            confirmed.elapsed() < Duration::from_secs(2),
            "ended {:?} after the revocation was confirmed",
            confirmed.elapsed()
        );
        let last = text.trim_end().rsplit("\n\n").next().unwrap();
        assert!(last.starts_with("event: revoked\ndata: "), "{text:?}");
        let problem: Value = serde_json::from_str(&last["event: revoked\ndata: ".len()..]).unwrap();
        assert_eq!(problem["code"], "unauthorized");
        assert!(problem["detail"].as_str().unwrap().contains("revoked"));
    }
    // Another key's stream goes on.
    let writer = app
        .make_key("writer", snapfence::domain::Scope::Write, "")
        .await;
    let r = app
        .request(Method::POST, "/v1/leases/k")
        .header("Authorization", format!("Bearer {writer}"))
        .json(&json!({"owner": "w", "ttl_ms": 30000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let grant = token(&r.json().await.unwrap());
    assert_eq!(
        what(&kept.next().await),
        change("lease.granted", "k", grant)
    );
    // And the revoked key may not resume.
    let r = open(&other.base, &reader).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    other.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn open_streams_count_against_the_keys_in_flight_and_stream_limits_and_the_instances() {
    let mut limited = rules();
    limited.max_in_flight_per_key = 3;
    limited.max_watches_per_key = 2;
    limited.max_watches = 3;
    let app = TestApp::spawn_with(limited).await;
    let other = app.another_instance().await;
    let [a, b, c] = [
        app.make_key("a", snapfence::domain::Scope::Read, "").await,
        app.make_key("b", snapfence::domain::Scope::Read, "").await,
        app.make_key("c", snapfence::domain::Scope::Read, "").await,
    ];
    let request = |base: &str, path: &str, token: &str| {
        app.http
            .get(format!("{base}{path}"))
            .header("Authorization", format!("Bearer {token}"))
            .send()
    };
    let base = &app.instance.base;
    let mut a_streams = Vec::new();
    for _ in 0..2 {
        let r = request(base, "/v1/watch", &a).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        a_streams.push(r);
    }
    // The key's third stream: over its streams.
    let r = request(base, "/v1/watch", &a).await.unwrap();
    assert_eq!(r.headers()["retry-after"], "5");
    let body = problem(r, StatusCode::TOO_MANY_REQUESTS, "too_many_requests").await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("--max-watches-per-key")
    );
    // Two open streams and one request: the key's three in flight. Another request is one
    // too many while both streams are open: of 32 sent at once, the ones that overlap another
    // (with only one slot left, on a loaded machine too) are refused. (Four at once did not
    // always overlap on a clean clone's run.)
    let r = request(base, "/v1/leases", &a).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "the third in flight");
    let many =
        futures_util::future::join_all((0..32).map(|_| request(base, "/v1/leases", &a))).await;
    assert!(
        many.iter()
            .any(|r| r.as_ref().unwrap().status() == StatusCode::TOO_MANY_REQUESTS),
        "two streams and two requests at once are over 3 in flight"
    );
    // The instance's third stream, of another key; then it has its most.
    let b_stream = request(base, "/v1/watch", &b).await.unwrap();
    assert_eq!(b_stream.status(), StatusCode::OK);
    let r = request(base, "/v1/watch", &c).await.unwrap();
    let body = problem(r, StatusCode::TOO_MANY_REQUESTS, "too_many_requests").await;
    assert!(body["detail"].as_str().unwrap().contains("--max-watches"));
    // Counted per instance: the other one serves it.
    let r = request(&other.base, "/v1/watch", &c).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    drop(r);
    // A stream closed by its client is let go: the key may open another.
    drop(a_streams.pop());
    let deadline = Instant::now() + CEILING;
    loop {
        let r = request(base, "/v1/watch", &a).await.unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a closed stream was never let go"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(b_stream);
    other.stop().await;
    app.stop().await;
}

/// Fenced writes that `writers` tasks, each on a key of its own, get answered in `span`.
async fn writes_in(app: &TestApp, tokens: &[(String, i64)], span: Duration) -> usize {
    let until = Instant::now() + span;
    let tasks = tokens.iter().cloned().map(|(key, t)| {
        let (http, base) = (app.http.clone(), app.instance.base.clone());
        tokio::spawn(async move {
            let mut done = 0;
            while Instant::now() < until {
                let r = http
                    .put(format!("{base}/v1/snapshots/{}", enc(&key)))
                    .header("Fencing-Token", t.to_string())
                    .body("x")
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success(), "{}", r.status());
                done += 1;
            }
            done
        })
    });
    futures_util::future::join_all(tasks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_keep_most_of_their_rate_while_64_streams_catch_up() {
    let app = TestApp::spawn().await;
    // A backlog of 40,000 changes, written under the API (as the triggers write them) so that
    // it is cheap to make, then numbered by the relay.
    for _ in 0..40 {
        sqlx::query(
            "INSERT INTO change_log (kind, key, token, at, owner, expires_at) \
             SELECT 'lease.granted', 'backlog/' || n, n, now(), 'w', now() \
             FROM generate_series(1, 1000) n",
        )
        .execute(app.db())
        .await
        .unwrap();
    }
    let deadline = Instant::now() + CEILING;
    while sqlx::query_scalar::<_, i64>("SELECT max(last_id) FROM change_epochs")
        .fetch_one(app.db())
        .await
        .unwrap()
        < 40_000
    {
        assert!(Instant::now() < deadline, "the backlog was never numbered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut tokens = Vec::new();
    for i in 0..8 {
        let key = format!("hot/{i}");
        let t = token(&app.acquire(&key, "w", 600_000).await);
        tokens.push((key, t));
    }
    let span = Duration::from_secs(2);
    writes_in(&app, &tokens, Duration::from_millis(500)).await;
    let before = writes_in(&app, &tokens, span).await;
    // 64 streams from the oldest change, of a prefix none of the backlog is under: each reads
    // the whole history, delivering nothing, for as long as the writes are counted.
    let mut streams = Vec::new();
    for _ in 0..64 {
        let r = app.get("/v1/watch?since=0&prefix=nothing/").await;
        assert_eq!(r.status(), StatusCode::OK);
        streams.push(r.bytes_stream());
    }
    let catching_up = writes_in(&app, &tokens, span).await;
    drop(streams);
    let after = writes_in(&app, &tokens, span).await;
    // Alone: the mean of a span before and one after, so that a drift of the machine's load
    // over the test (other tests, other builds) falls on both sides.
    let alone = (before + after) as f64 / 2.0;
    let ratio = catching_up as f64 / alone;
    println!(
        "fenced writes in {span:?}: {before} before and {after} after alone, {catching_up} with 64 streams catching up ({ratio:.2} x)"
    );
    // The bar is 0.8 x, measured on a release build by `bench/compare.sh --catch-up`
    // (0.89 x). Here (debug build, 2 cores shared with the test and whatever else runs) the
    // streams sharing what they read gave 0.76 to 1.03 x alone, 0.69 x beside the whole suite;
    // unpaced reads, 0.48 to 0.54 x. So this guards the pacing (0.6 x), and the printed figures
    // say how close to 0.8 a run came.
    assert!(
        ratio >= 0.6,
        "{catching_up} writes with the streams catching up, {alone} without ({ratio:.2} x)"
    );
    app.stop().await;
}

/// The blocks of an HTTP/1.1 chunked body as far as it came: the data of each whole chunk, and
/// whatever followed the last whole one (empty when the body was cut between chunks).
fn dechunk(mut body: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut data = Vec::new();
    loop {
        let Some(line) = body.windows(2).position(|w| w == b"\r\n") else {
            return (data, body.to_vec());
        };
        let size = std::str::from_utf8(&body[..line]).unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        let whole = line + 2 + size + 2;
        if body.len() < whole {
            return (data, body.to_vec());
        }
        assert_eq!(&body[whole - 2..whole], b"\r\n", "a chunk ends with CRLF");
        data.extend_from_slice(&body[line + 2..line + 2 + size]);
        body = &body[whole..];
    }
}

#[tokio::test]
async fn a_stream_whose_client_stops_reading_is_cut_between_events() {
    let mut quick = rules();
    quick.idle_timeout = Duration::from_secs(2);
    let app = TestApp::spawn_with(quick).await;
    let addr = app
        .instance
        .base
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small receive window, so that the server's send buffer fills with fewer changes.
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    conn.write_all(b"GET /v1/watch HTTP/1.1\r\nHost: snapfence\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let head_end = loop {
        let mut buf = [0; 4096];
        let n = tokio::time::timeout(CEILING, conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the head came");
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    // Changes of a long key and owner (about 900 bytes an event), written under the API as the
    // triggers write them, many more than the socket buffers on both sides hold; the client
    // reads none of them until the server has had `--idle-timeout` with nothing it could send.
    let changes = 12_000;
    sqlx::query(
        "INSERT INTO change_log (kind, key, token, at, owner, expires_at) \
         SELECT 'lease.granted', repeat('k', 500) || n, n, now(), repeat('o', 256), now() \
         FROM generate_series(1, $1) n",
    )
    .bind(changes)
    .execute(app.db())
    .await
    .unwrap();
    tokio::time::sleep(app.rules.idle_timeout * 4).await;
    let read_all = async {
        let mut buf = vec![0; 1 << 16];
        loop {
            match conn.read(&mut buf).await.unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(CEILING, read_all)
        .await
        .expect("the server ended the stream its client stopped reading");
    let (data, torn) = dechunk(&got[head_end..]);
    assert!(
        torn.is_empty(),
        "the stream was cut inside a chunk: {:?}",
        String::from_utf8_lossy(&torn[..torn.len().min(120)])
    );
    let text = String::from_utf8(data).unwrap();
    assert!(text.ends_with("\n\n"), "the last event is whole");
    let events = text
        .trim_end_matches('\n')
        .split("\n\n")
        .collect::<Vec<_>>();
    for event in &events {
        for line in event.lines() {
            if let Some(json) = line.strip_prefix("data: ") {
                serde_json::from_str::<Value>(json).unwrap();
            }
        }
    }
    assert!(
        events.len() < changes as usize,
        "the stream was cut before the end of the changes, not ended by them"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_transactions_changes_share_its_id_and_size_and_name_their_fence() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    let mut watch = Stream::open(&app.http, &app.instance.base, "?prefix=th", None).await;
    let ops = json!({"ops": [
        {"op": "put", "key": "th/a", "body": "MQ=="},
        {"op": "put", "key": "th/b", "body": "Mg=="},
        {"op": "delete", "key": "th/none"},
    ]});
    let r = app
        .request(Method::POST, "/v1/txn")
        .header("Fencing-Key", "th")
        .header("Fencing-Token", t.to_string())
        .json(&ops)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(app.put("th", t, "single").await.status(), 201);
    let events = watch.take(3).await;
    assert_eq!(
        summary(&events),
        vec![
            change("snapshot.written", "th/a", t),
            change("snapshot.written", "th/b", t),
            change("snapshot.written", "th", t),
        ]
    );
    let (a, b, single) = (&events[0], &events[1], &events[2]);
    assert_eq!(
        a.data["txn"], a.id,
        "a transaction's id is its first change's"
    );
    assert_eq!(b.data["txn"], a.id);
    assert_eq!(a.data["txn_size"], 2);
    assert_eq!(b.data["txn_size"], 2);
    assert_eq!(a.data["fencing_key"], "th");
    assert!(single.data.get("txn").is_none(), "{:?}", single.data);
    assert!(single.data.get("txn_size").is_none(), "{:?}", single.data);
    app.stop().await;
}

/// Transactions that shared a batch commit in one PostgreSQL transaction; each still has its own
/// `txn`, its own first change's id, and its own size.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactions_committed_in_one_batch_keep_their_own_ids() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    let mut tokens = Vec::new();
    for n in 0..16 {
        tokens.push(token(&app.acquire(&format!("b/{n}"), "w", 30000).await));
    }
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(tokens.len()));
    let sends: Vec<_> = (0..16)
        .zip(tokens)
        .map(|(n, t)| {
            let (app, start) = (app.clone(), start.clone());
            tokio::spawn(async move {
                let ops = json!({"ops": [
                    {"op": "put", "key": format!("b/{n}/x"), "body": "MQ=="},
                    {"op": "put", "key": format!("b/{n}/y"), "body": "Mg=="},
                ]});
                start.wait().await;
                let r = app
                    .request(Method::POST, "/v1/txn")
                    .header("Fencing-Key", enc(&format!("b/{n}")))
                    .header("Fencing-Token", t.to_string())
                    .json(&ops)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::OK);
            })
        })
        .collect();
    for send in sends {
        send.await.unwrap();
    }
    let shared: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT xid FROM change_log GROUP BY xid \
         HAVING count(DISTINCT fencing_key) > 1) s",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert!(shared > 0, "no two transactions shared a batch");
    let mut watch = Stream::open(&app.http, &app.instance.base, "?prefix=b/&since=0", None).await;
    let events = watch.take(16 + 32).await;
    let mut firsts = std::collections::BTreeMap::new();
    for e in events.iter().filter(|e| e.event == "snapshot.written") {
        let fence = e.data["fencing_key"].as_str().unwrap().to_owned();
        let first = *firsts.entry(fence.clone()).or_insert(e.id);
        assert_eq!(e.data["txn"], first, "{fence}: its own first change's id");
        assert_eq!(e.data["txn_size"], 2, "{fence}");
    }
    assert_eq!(firsts.len(), 16, "each transaction has its own id");
    std::sync::Arc::try_unwrap(app).ok().unwrap().stop().await;
}

#[tokio::test]
async fn a_watch_resumed_inside_a_transaction_still_names_its_first_change() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("th", "w", 30000).await);
    let ops = json!({"ops": [
        {"op": "put", "key": "th/a", "body": "MQ=="},
        {"op": "put", "key": "th/b", "body": "Mg=="},
    ]});
    let r = app
        .request(Method::POST, "/v1/txn")
        .header("Fencing-Key", "th")
        .header("Fencing-Token", t.to_string())
        .json(&ops)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut whole = Stream::open(&app.http, &app.instance.base, "?prefix=th/&since=0", None).await;
    let first = whole.next().await;
    let mut resumed =
        Stream::open(&app.http, &app.instance.base, "?prefix=th/", Some(first.id)).await;
    let second = resumed.next().await;
    assert_eq!(second.data["key"], "th/b");
    assert_eq!(
        second.data["txn"], first.id,
        "the first change's id, though it was not resent"
    );
    assert_eq!(second.data["txn_size"], 2);
    app.stop().await;
}
