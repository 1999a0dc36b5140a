//! The client's watch and `snapfence watch` against the real server: changes in order, resumed
//! without a gap or a duplicate after the server ends a stream or the network cuts it, the
//! errors that end a watch, and the CLI's lines.

use std::time::Duration;

use serde_json::Value;
use snapfence::domain::Scope;
use snapfence_client::{
    ChangeEvent, ChangeId, ChangeKind, Client, Error, FencingToken, KeyPrefix, PutOptions,
    RetryPolicy, Watch, WatchOptions,
};
use tokio::time::Instant;

use crate::cli::error_golden;
use crate::harness::{TestApp, rules};
use crate::proxy::{Mode, Proxy};
use crate::support::{Normaliser, cli, client, golden, grant, key, normalise_text, upstream};

const TTL: Duration = Duration::from_secs(30);
/// A ceiling for what takes milliseconds, generous for a loaded machine.
const CEILING: Duration = Duration::from_secs(30);

/// A watch of the keys under `prefix` from the oldest retained change.
fn watch_all(c: &Client, prefix: &str) -> Watch {
    c.watch(
        &WatchOptions::new()
            .prefix(KeyPrefix::parse(prefix).unwrap())
            .since(ChangeId::ORIGIN),
    )
}

/// The next `n` changes of a watch, which must come within the ceiling.
async fn take(watch: &mut Watch, n: usize) -> Vec<ChangeEvent> {
    let mut changes = Vec::with_capacity(n);
    while changes.len() < n {
        let next = tokio::time::timeout(CEILING, watch.next())
            .await
            .unwrap_or_else(|_| panic!("no change after {changes:#?}"));
        changes.push(next.expect("a watch goes on").expect("a change"));
    }
    changes
}

/// The ids of the changes to keys under `prefix`, once the relay has numbered `n` of them: what
/// a watch must deliver, each once, in this order.
async fn numbered(app: &TestApp, prefix: &str, n: usize) -> Vec<i64> {
    let deadline = Instant::now() + CEILING;
    loop {
        let ids: Vec<i64> =
            sqlx::query_scalar("SELECT id FROM changes WHERE starts_with(key, $1) ORDER BY id")
                .bind(prefix)
                .fetch_all(app.db())
                .await
                .unwrap();
        if ids.len() >= n {
            return ids;
        }
        assert!(Instant::now() < deadline, "only {ids:?} were numbered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ids(changes: &[ChangeEvent]) -> Vec<i64> {
    changes.iter().map(|c| c.id.get()).collect()
}

/// A server whose history no longer starts at the first change: the relay pruned it (a
/// retention of 200 ms, which the relay then applies as often).
async fn compacted_app() -> TestApp {
    let mut short = rules();
    short.watch_retention = Duration::from_millis(200);
    let app = TestApp::spawn_with(short).await;
    // Two changes: once both are pruned, change 1 is older than the history (0 is not: it
    // means the oldest change kept).
    grant(&client(&app.instance.base), &key("old"), "w", TTL).await;
    grant(&client(&app.instance.base), &key("older"), "w", TTL).await;
    let deadline = Instant::now() + CEILING;
    loop {
        let horizon: i64 = sqlx::query_scalar("SELECT pruned_through FROM change_horizon")
            .fetch_one(app.db())
            .await
            .unwrap();
        if horizon >= 2 {
            return app;
        }
        assert!(Instant::now() < deadline, "the history was never pruned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The changes that the CLI tests print: a grant, a write, a refused write, a release.
async fn story(c: &Client) {
    let k = key("jobs/7");
    let token = grant(c, &k, "worker-7", TTL).await.lease.token;
    c.put_snapshot(&k, token, "state 1", &PutOptions::default())
        .await
        .unwrap();
    let stale = c
        .put_snapshot(
            &k,
            FencingToken::new(99).unwrap(),
            "x",
            &PutOptions::default(),
        )
        .await;
    assert!(
        matches!(stale, Err(Error::UnknownToken { .. })),
        "{stale:?}"
    );
    c.release(&k, token).await.unwrap();
}

#[tokio::test]
async fn a_watch_delivers_the_changes_of_its_prefix_in_order() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let mut watch = watch_all(&c, "jobs/");
    grant(&c, &key("other"), "w", TTL).await;
    let g = grant(&c, &key("jobs/1"), "w", TTL).await;
    c.put_snapshot(&key("jobs/1"), g.lease.token, "s", &PutOptions::default())
        .await
        .unwrap();
    c.release(&key("jobs/1"), g.lease.token).await.unwrap();
    let changes = take(&mut watch, 3).await;
    let kinds: Vec<ChangeKind> = changes.iter().map(|c| c.event).collect();
    assert_eq!(
        kinds,
        [
            ChangeKind::LeaseGranted,
            ChangeKind::SnapshotWritten,
            ChangeKind::LeaseReleased
        ]
    );
    assert!(changes.iter().all(|c| c.data.key == key("jobs/1")));
    assert!(changes.iter().all(|c| c.data.token == g.lease.token));
    assert_eq!(changes[1].data.version.map(|v| v.get()), Some(1));
    assert_eq!(ids(&changes), numbered(&app, "jobs/", 3).await);
    app.stop().await;
}

#[tokio::test]
async fn a_watch_resumes_after_the_server_ends_its_streams_without_a_gap_or_a_duplicate() {
    let mut short = rules();
    short.max_watch = Duration::from_millis(300);
    short.watch_heartbeat = Duration::from_millis(100);
    let max_watch = short.max_watch;
    let app = TestApp::spawn_with(short).await;
    let c = client(&app.instance.base);
    let mut watch = watch_all(&c, "jobs/");
    const CHANGES: usize = 12;
    let producer = tokio::spawn(async move {
        for i in 0..CHANGES {
            grant(&c, &key(&format!("jobs/{i}")), "w", TTL).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let started = Instant::now();
    let changes = take(&mut watch, CHANGES).await;
    // The streams are HTTP answers on one kept-alive connection, so their ends are counted by
    // the time the watch took: each stream lasts at most max_watch.
    assert!(
        started.elapsed() > 3 * max_watch,
        "the watch took {:?}, too short to have crossed ends of streams",
        started.elapsed()
    );
    producer.await.unwrap();
    assert_eq!(ids(&changes), numbered(&app, "jobs/", CHANGES).await);
    app.stop().await;
}

#[tokio::test]
async fn a_watch_resumes_after_its_connection_is_cut_without_a_gap_or_a_duplicate() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let c = client(&app.instance.base);
    let mut watch = watch_all(&client(&proxy.base()), "jobs/");
    for i in 0..3 {
        grant(&c, &key(&format!("jobs/{i}")), "w", TTL).await;
    }
    let mut changes = take(&mut watch, 2).await;
    proxy.cut();
    // Made while the watch has no connection; the third change may be in flight on the cut one.
    for i in 3..6 {
        grant(&c, &key(&format!("jobs/{i}")), "w", TTL).await;
    }
    changes.extend(take(&mut watch, 4).await);
    assert_eq!(ids(&changes), numbered(&app, "jobs/", 6).await);
    assert_eq!(proxy.connections(), 2, "one connection, cut, then one more");
    app.stop().await;
}

#[tokio::test]
async fn a_watch_from_now_cut_before_its_first_change_misses_nothing() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let c = client(&app.instance.base);
    let from_now = WatchOptions::new().prefix(KeyPrefix::parse("jobs/").unwrap());
    let mut watch = client(&proxy.base()).watch(&from_now);
    // Connected, with nothing to deliver yet.
    let nothing = tokio::time::timeout(Duration::from_millis(300), watch.next()).await;
    assert!(nothing.is_err(), "no change yet: {nothing:?}");
    assert_eq!(proxy.connections(), 1);
    // Cut off before any change, and kept off until a change is numbered.
    proxy.stall();
    proxy.cut();
    grant(&c, &key("jobs/meanwhile"), "w", TTL).await;
    let expected = numbered(&app, "jobs/", 1).await;
    proxy.resume();
    assert_eq!(ids(&take(&mut watch, 1).await), expected);
    app.stop().await;
}

#[tokio::test]
async fn a_watch_whose_connection_goes_silent_resumes_on_a_new_one() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let watcher = Client::builder(proxy.base())
        .watch_idle_timeout(Duration::from_millis(500))
        .retry(RetryPolicy {
            max_attempts: 20,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        })
        .build()
        .unwrap();
    let mut watch = watch_all(&watcher, "jobs/");
    let c = client(&app.instance.base);
    grant(&c, &key("jobs/1"), "w", TTL).await;
    let mut changes = take(&mut watch, 1).await;
    // A partition: the connection stays open and nothing comes, heartbeats included.
    proxy.stall();
    grant(&c, &key("jobs/2"), "w", TTL).await;
    let next = tokio::spawn(async move {
        let next = take(&mut watch, 1).await;
        (watch, next)
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.resume();
    let (mut watch, next) = next.await.unwrap();
    changes.extend(next);
    grant(&c, &key("jobs/3"), "w", TTL).await;
    changes.extend(take(&mut watch, 1).await);
    assert_eq!(ids(&changes), numbered(&app, "jobs/", 3).await);
    assert!(
        proxy.connections() >= 2,
        "the silent connection was never given up"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_watch_from_before_the_retained_history_ends_with_compacted() {
    let app = compacted_app().await;
    let mut watch =
        client(&app.instance.base).watch(&WatchOptions::new().since(ChangeId::parse("1").unwrap()));
    let ended = watch.next().await.expect("an error ends the watch");
    assert!(matches!(ended, Err(Error::Compacted { .. })), "{ended:?}");
    assert_eq!(
        ended.unwrap_err().code(),
        Some(snapfence_client::ErrorCode::Compacted)
    );
    assert!(watch.next().await.is_none());
    app.stop().await;
}

#[tokio::test]
async fn a_watch_outside_its_api_keys_prefix_ends_with_forbidden() {
    let app = TestApp::spawn().await;
    let token = app.make_key("jobs-reader", Scope::Read, "jobs/").await;
    let c = Client::builder(&app.instance.base)
        .api_key(token)
        .build()
        .unwrap();
    let mut watch = watch_all(&c, "reports/");
    let ended = watch.next().await.expect("an error ends the watch");
    assert!(matches!(ended, Err(Error::Forbidden { .. })), "{ended:?}");
    assert!(watch.next().await.is_none());
    app.stop().await;
}

#[tokio::test]
async fn a_watch_skips_a_kind_it_does_not_know_and_resumes_after_it() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    grant(&c, &key("jobs/1"), "w", TTL).await;
    grant(&c, &key("jobs/2"), "w", TTL).await;
    let first = numbered(&app, "jobs/", 2).await[0];
    // The first connection is answered as a newer server would: change `first` is of a kind
    // this client does not know. The watch must pass over it, and resume after it.
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let body = format!(
        ": a newer server\nid: {first}\nevent: lease.renewed\ndata: {{\"key\":\"jobs/1\",\"token\":1,\"at\":\"2026-12-04T18:00:00.000Z\"}}\n\n"
    );
    proxy.next_connections(vec![Mode::Answer {
        status: "200 OK",
        content_type: "text/event-stream",
        body,
    }]);
    let mut watch = watch_all(&client(&proxy.base()), "jobs/");
    let next = take(&mut watch, 1).await;
    assert_eq!(next[0].data.key, key("jobs/2"));
    assert_eq!(proxy.connections(), 2);
    app.stop().await;
}

#[tokio::test]
async fn watch_prints_a_line_per_change_and_exits_after_count() {
    let app = TestApp::spawn().await;
    story(&client(&app.instance.base)).await;
    let ran = cli(
        &app.instance.base,
        &["watch", "--since", "0", "--count", "4"],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    golden(
        "watch.txt",
        &normalise_text(&ran.stdout, &app.instance.base),
    );
    app.stop().await;
}

#[tokio::test]
async fn watch_with_output_json_prints_one_object_per_line() {
    let app = TestApp::spawn().await;
    story(&client(&app.instance.base)).await;
    let args = ["--output", "json", "watch", "--since", "0", "--count", "4"];
    let ran = cli(&app.instance.base, &args).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let mut normaliser = Normaliser::default();
    let lines: Vec<String> = ran
        .stdout
        .lines()
        .map(|line| {
            let change: Value = serde_json::from_str(line).expect("one JSON object a line");
            normaliser.json(change).to_string()
        })
        .collect();
    golden("watch.jsonl", &(lines.join("\n") + "\n"));
    app.stop().await;
}

#[tokio::test]
async fn watch_from_before_the_retained_history_exits_14_and_says_to_read_the_state_again() {
    let app = compacted_app().await;
    error_golden(
        &app.instance.base,
        &["watch", "--since", "1"],
        14,
        "compacted",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_watch_whose_api_key_is_revoked_ends_with_unauthorized_and_does_not_reconnect() {
    let app = TestApp::spawn().await;
    let token = app.make_key("reader", Scope::Read, "").await;
    let c = Client::builder(&app.instance.base)
        .api_key(token)
        .build()
        .unwrap();
    let admin = app.make_key("admin", Scope::Admin, "").await;
    let writer = Client::builder(&app.instance.base)
        .api_key(admin)
        .build()
        .unwrap();
    let mut watch = watch_all(&c, "");
    let k = key("revoked");
    grant(&writer, &k, "w", TTL).await;
    assert_eq!(take(&mut watch, 1).await[0].event, ChangeKind::LeaseGranted);
    app.revoke_key("reader").await;
    let revoked = Instant::now();
    let ended = tokio::time::timeout(CEILING, watch.next())
        .await
        .expect("the watch ends")
        .expect("an error ends the watch");
    match &ended {
        Err(Error::Unauthorized { detail, .. }) => assert!(detail.contains("revoked"), "{detail}"),
        other => panic!("not ended by the revocation: {other:?}"),
    }
    assert!(
        revoked.elapsed() < Duration::from_secs(1),
        "ended {:?} after the revocation was confirmed",
        revoked.elapsed()
    );
    assert!(watch.next().await.is_none());
    app.stop().await;
}
