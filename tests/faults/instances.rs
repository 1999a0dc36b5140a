//! Instances that freeze (SIGSTOP) or die (SIGKILL) under the waiting queue and the watch's relay
//! (issue 34): a key released while its first waiter's instance is frozen goes to the next
//! waiter within the stall bound, and the thawed instance answers its passed-over waiter; while
//! it waits for the frozen waiter, a key's status and a plain acquire agree; the relay's instance
//! killed under more than a thousand changes a second, the changes flow again within a bound, and
//! killed five times under short leases, every expiry is still reported within a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::cluster::{Cluster, ClusterSpec, Service, scratch};

fn unix_only() -> ClusterSpec {
    ClusterSpec {
        tcp: false,
        extra: vec![],
    }
}

/// A waiting acquire of `key` through `base`, answered with its status and body.
async fn acquire(base: String, key: &str, owner: &str, wait_ms: i64) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/leases/{key}"))
        .json(&json!({"owner": owner, "ttl_ms": 60000, "wait_ms": wait_ms}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap())
}

/// Releases `key`'s lease `token` through `base`, which must answer 204.
async fn release(base: String, key: &str, token: i64) {
    let r = reqwest::Client::new()
        .delete(format!("{base}/v1/leases/{key}"))
        .header("Fencing-Token", token.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
}

async fn until_queued(db: &Cluster, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.scalar("SELECT count(*) FROM lease_waiters").await != n {
        assert!(Instant::now() < deadline, "the queue never held {n}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until no statement runs on the database but the test's own, twice in a row: an
/// instance frozen since has then had done whatever it sent before (a waiter's try sent just
/// before the freeze and run after the release would be granted the key, rightly: the instance
/// was answering when it sent it), and sends nothing more.
async fn until_nothing_runs(db: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut idle = 0;
    while idle < 2 {
        assert!(
            Instant::now() < deadline,
            "statements never stopped running"
        );
        let running = db
            .scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' \
                 AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            )
            .await;
        idle = if running == 0 { idle + 1 } else { 0 };
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_released_while_its_first_waiters_instance_is_sigstopped_goes_to_the_next_waiter() {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let a = Service::start(&db.url(), dir.path(), false).await;
    let b = Service::start(&db.url(), dir.path(), false).await;
    let (holder, _) = acquire(a.base(), "k", "holder", 0).await;
    assert_eq!(holder, StatusCode::CREATED);
    let holder: i64 = db.scalar("SELECT token FROM leases WHERE key = 'k'").await;
    let first = tokio::spawn(acquire(b.base(), "k", "frozen", 120_000));
    until_queued(&db, 1).await;
    let second = tokio::spawn(acquire(a.base(), "k", "live", 120_000));
    until_queued(&db, 2).await;
    b.pause();
    until_nothing_runs(&db).await;
    release(a.base(), "k", holder).await;
    let released = Instant::now();
    let (status, grant) = tokio::time::timeout(Duration::from_secs(30), second)
        .await
        .expect("the live waiter is served while the first waiter's instance is frozen")
        .unwrap();
    let waited = released.elapsed();
    println!("the next waiter was granted {waited:?} after the release (stall bound 1 s)");
    assert_eq!(status, StatusCode::CREATED, "{grant}");
    assert_eq!(grant["owner"], "live");
    // The bound (1 s) and the sweep's half second, with as much again for a loaded machine.
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    // Thawed, the passed-over waiter is answered: the key is held by the one served meanwhile.
    b.resume();
    let (status, refused) = tokio::time::timeout(Duration::from_secs(30), first)
        .await
        .expect("the thawed instance answers its waiter")
        .unwrap();
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["code"], "lease_held");
    assert_eq!(refused["holder"]["owner"], "live");
    until_queued(&db, 0).await;
}

/// The state and the count of waiters that `GET /v1/leases/k` through `base` shows.
async fn state_and_waiters(base: &str) -> (String, i64) {
    let status: Value = reqwest::get(format!("{base}/v1/leases/k"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        status["state"].as_str().unwrap().to_owned(),
        status["waiters"].as_i64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn while_a_released_key_waits_for_a_sigstopped_instances_waiter_get_and_a_plain_acquire_agree()
 {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let a = Service::start(&db.url(), dir.path(), false).await;
    // A stall bound long enough that the live instance is surely asked several times within it,
    // however loaded the machine.
    let b = Service::start_with(
        &db.url(),
        dir.path(),
        false,
        &["--waiter-stall-bound", "5s"],
    )
    .await;
    let (holder, _) = acquire(a.base(), "k", "holder", 0).await;
    assert_eq!(holder, StatusCode::CREATED);
    let holder: i64 = db.scalar("SELECT token FROM leases WHERE key = 'k'").await;
    let _frozen = tokio::spawn(acquire(b.base(), "k", "frozen", 120_000));
    until_queued(&db, 1).await;
    b.pause();
    until_nothing_runs(&db).await;
    release(a.base(), "k", holder).await;
    // The frozen instance's waiter counts until its bound passes, and from then on no more
    // while it stays frozen: so each refusal of a plain acquire follows a GET that showed the
    // waiter, and the first GET that shows none is followed by a grant.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut refusals = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the frozen instance's waiter was never passed over"
        );
        let (state, waiters) = state_and_waiters(&a.base()).await;
        assert_eq!(state, "released");
        let (status, body) = acquire(a.base(), "k", "plain", 0).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["code"], "lease_held");
        assert_eq!(body["state"], "released", "{body}");
        assert_eq!(body["waiters"], 1, "{body}");
        assert_eq!(
            waiters, 1,
            "GET showed {waiters} waiters just before {body}"
        );
        refusals += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("{refusals} plain acquires were refused before the frozen waiter was passed over");
    assert!(refusals > 0, "the key was granted before the bound passed");
    // The frozen waiter's row is still queued (no instance with waiters swept it), uncounted.
    assert_eq!(state_and_waiters(&a.base()).await, ("held".to_owned(), 0));
    b.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relays_instance_sigkilled_under_a_thousand_changes_a_second_numbering_resumes_within_a_bound()
 {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    // The first instance takes the relay role; the second waits for it to lapse.
    let mut relay = Service::start(&db.url(), dir.path(), false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _other = Service::start(&db.url(), dir.path(), false).await;
    // 1,500 changes a second, as the triggers write them, for the whole test.
    let pool = sqlx::PgPool::connect(&db.url()).await.unwrap();
    let written = Arc::new(AtomicI64::new(0));
    let load = {
        let (pool, written) = (pool.clone(), written.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            loop {
                tick.tick().await;
                sqlx::query(
                    "INSERT INTO change_log (kind, key, token, at, owner, expires_at) \
                     SELECT 'lease.granted', 'load/' || n, n, now(), 'w', now() \
                     FROM generate_series(1, 15) n",
                )
                .execute(&pool)
                .await
                .unwrap();
                written.fetch_add(15, Ordering::AcqRel);
            }
        })
    };
    let numbered = || async {
        sqlx::query_scalar::<_, i64>("SELECT max(last_id) FROM change_epochs")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    // Steady: the relay keeps up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = written.load(Ordering::Acquire);
    let deadline = Instant::now() + Duration::from_secs(10);
    while numbered().await < before {
        assert!(
            Instant::now() < deadline,
            "the relay does not keep up with the load"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.kill();
    let killed = Instant::now();
    let at_kill = written.load(Ordering::Acquire);
    // Changes flow again: everything written before the kill is numbered, by the other instance.
    let deadline = Instant::now() + Duration::from_secs(60);
    while numbered().await < at_kill {
        assert!(Instant::now() < deadline, "numbering never resumed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resumed = killed.elapsed();
    // And it catches up with the load written meanwhile.
    let caught_up_to = written.load(Ordering::Acquire);
    while numbered().await < caught_up_to {
        assert!(Instant::now() < deadline, "numbering never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let caught_up = killed.elapsed();
    load.abort();
    println!(
        "relay SIGKILLed under 1,500 changes/s: numbering resumed after {resumed:?}, caught up ({} changes written meanwhile) after {caught_up:?}",
        caught_up_to - at_kill
    );
    // The dead relay's role is free as its connection closes, and the other instance claims it
    // within a quarter of a second; the backlog is then numbered. 10 s allows for a loaded machine.
    assert!(resumed < Duration::from_secs(10), "{resumed:?}");
    assert!(caught_up < Duration::from_secs(15), "{caught_up:?}");
}

/// The relay's instance SIGKILLed five times while leases of 500 ms are granted through the
/// other: every expiry is reported within the contract's second by the database clock, as the
/// dead relay's role is free the moment its connection closes (no wait for its term to run out).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_expired_comes_within_a_second_through_five_sigkills_of_the_relay() {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    // The older of two instances relays: it took the role first, and each kill leaves the newer.
    let mut older = Service::start(&db.url(), dir.path(), false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut newer = Service::start(&db.url(), dir.path(), false).await;
    let via = Arc::new(std::sync::Mutex::new(newer.base()));
    let granted = Arc::new(AtomicI64::new(0));
    let grants = {
        let (via, granted) = (via.clone(), granted.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut tick = tokio::time::interval(Duration::from_millis(25));
            for n in 0.. {
                tick.tick().await;
                let base = via.lock().unwrap().clone();
                let r = http
                    .post(format!("{base}/v1/leases/e%2F{n}"))
                    .json(&json!({"owner": "w", "ttl_ms": 500}))
                    .send()
                    .await;
                if r.is_ok_and(|r| r.status() == StatusCode::CREATED) {
                    granted.fetch_add(1, Ordering::AcqRel);
                }
            }
        })
    };
    let pool = sqlx::PgPool::connect(&db.url()).await.unwrap();
    let mut late = std::collections::HashMap::new();
    expiries_seen(&pool, &mut late, Duration::from_secs(2)).await;
    for _ in 0..5 {
        older.kill();
        older = newer;
        newer = Service::start(&db.url(), dir.path(), false).await;
        *via.lock().unwrap() = older.base();
        expiries_seen(&pool, &mut late, Duration::from_secs(2)).await;
    }
    grants.abort();
    expiries_seen(&pool, &mut late, Duration::from_secs(2)).await;
    let expired: i64 = db
        .scalar("SELECT count(*) FROM leases WHERE key LIKE 'e/%' AND expires_at < now() - interval '1 second'")
        .await;
    let worst = late.values().copied().fold(0.0, f64::max);
    println!(
        "{} leases of 500 ms granted through 5 SIGKILLs of the relay, {expired} expired: the latest lease.expired came {worst:.3} s after its expiry",
        granted.load(Ordering::Acquire)
    );
    assert!(
        expired > 100,
        "too few leases expired to say anything: {expired}"
    );
    assert!(
        late.len() as i64 >= expired,
        "{} of {expired} expiries reported",
        late.len()
    );
    assert!(
        worst < 1.0,
        "a lease.expired came {worst:.3} s after its expiry"
    );
    drop(older);
    drop(newer);
}

/// For `seen`, each `lease.expired` of an `e/` key with how late it was reported (seconds after
/// its expiry, by the database clock, give or take the 20 ms between looks).
async fn expiries_seen(
    pool: &sqlx::PgPool,
    seen: &mut std::collections::HashMap<String, f64>,
    for_: Duration,
) {
    let until = Instant::now() + for_;
    while Instant::now() < until {
        let rows: Vec<(String, f64)> = sqlx::query_as(
            "SELECT key, extract(epoch FROM clock_timestamp() - at)::float8 \
             FROM change_log WHERE kind = 'lease.expired' AND key LIKE 'e/%'",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        for (key, lateness) in rows {
            seen.entry(key).or_insert(lateness);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
