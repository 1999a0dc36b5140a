//! `snapfence serve` behind a transaction-mode pooler (a real PgBouncer): the pooled URL carries
//! the hot statements, the direct URL the sessions (LISTEN, migrations, locks). The API tests'
//! core runs through the same PgBouncer with `SNAPFENCE_TEST_POOLER=pgbouncer` (scripts/test).

use std::ffi::OsStr;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use snapfence_testkit::pgbouncer::PgBouncer;

use crate::harness::{TestDatabase, migrated_database, token, url_of};
use crate::serve::{Served, serve_with, short_tempdir};

/// A migrated database, a PgBouncer in front of it, and its pooled and direct URLs.
async fn behind_pgbouncer() -> (TestDatabase, PgBouncer, String, String) {
    let db = migrated_database().await;
    let options = db.options().clone();
    let bouncer = tokio::task::spawn_blocking(move || PgBouncer::start(&options))
        .await
        .unwrap()
        .expect("starting PgBouncer");
    let pooled = bouncer.url(db.options().get_database().unwrap());
    let direct = url_of(db.options());
    (db, bouncer, pooled, direct)
}

async fn serve_pooled(pooled: &str, direct: &str, log: &std::path::Path) -> Served {
    let args = [
        OsStr::new("--database-url"),
        OsStr::new(pooled),
        OsStr::new("--database-direct-url"),
        OsStr::new(direct),
        OsStr::new("--db-timeout"),
        OsStr::new("2s"),
    ];
    serve_with(&args, log).await
}

async fn acquire(http: &Client, base: &str, key: &str, body: Value) -> (StatusCode, Value) {
    let r = http
        .post(format!("{base}/v1/leases/{key}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

async fn put(http: &Client, base: &str, key: &str, t: i64, body: &str) -> StatusCode {
    http.put(format!("{base}/v1/snapshots/{key}"))
        .header("Fencing-Token", t.to_string())
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_through_pgbouncer_fences_writes_and_wakes_waiters_over_the_direct_url() {
    let (_db, _bouncer, pooled, direct) = behind_pgbouncer().await;
    let dir = short_tempdir();
    let served = serve_pooled(&pooled, &direct, &dir.path().join("serve.log")).await;
    let (http, base) = (Client::new(), served.base.clone());
    let (status, first) =
        acquire(&http, &base, "job", json!({"owner": "a", "ttl_ms": 60000})).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let t1 = token(&first);
    assert_eq!(
        put(&http, &base, "job", t1, "one").await,
        StatusCode::CREATED
    );
    // A waiter is woken by the release's notification, which only the direct URL can hear.
    let waiter = {
        let (http, base) = (http.clone(), base.clone());
        tokio::spawn(async move {
            let body = json!({"owner": "b", "ttl_ms": 60000, "wait_ms": 10000});
            acquire(&http, &base, "job", body).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = http
        .delete(format!("{base}/v1/leases/job"))
        .header("Fencing-Token", t1.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(released.status(), StatusCode::NO_CONTENT);
    let (status, second) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken by the release")
        .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{second}");
    let t2 = token(&second);
    assert!(t2 > t1);
    assert_eq!(
        put(&http, &base, "job", t1, "stale").await,
        StatusCode::CONFLICT
    );
    assert_eq!(put(&http, &base, "job", t2, "two").await, StatusCode::OK);
    let got = http
        .get(format!("{base}/v1/snapshots/job"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.text().await.unwrap(), "two");
    served.terminate();
    assert!(served.wait().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_go_through_the_pooler_and_resume_with_it() {
    let (_db, bouncer, pooled, direct) = behind_pgbouncer().await;
    let dir = short_tempdir();
    let served = serve_pooled(&pooled, &direct, &dir.path().join("serve.log")).await;
    let (http, base) = (Client::new(), served.base.clone());
    let (_, grant) = acquire(&http, &base, "k", json!({"owner": "a", "ttl_ms": 60000})).await;
    let t = token(&grant);
    assert_eq!(
        put(&http, &base, "k", t, "before").await,
        StatusCode::CREATED
    );
    // PgBouncer frozen, the direct URL still answers, yet no fenced write can be made.
    let pid = Pid::from_raw(bouncer.pid().expect("PgBouncer runs") as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let frozen = put(&http, &base, "k", t, "during").await;
    kill(pid, Signal::SIGCONT).unwrap();
    assert_eq!(frozen, StatusCode::SERVICE_UNAVAILABLE);
    let ready = http.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    assert_eq!(put(&http, &base, "k", t, "after").await, StatusCode::OK);
    let got = http
        .get(format!("{base}/v1/snapshots/k"))
        .send()
        .await
        .unwrap();
    assert_eq!(got.text().await.unwrap(), "after");
    served.terminate();
    assert!(served.wait().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_given_only_a_pooler_exits_at_once_naming_the_direct_url_flag() {
    let (_db, _bouncer, pooled, _) = behind_pgbouncer().await;
    let stderr = crate::serve::serve_fails(&["--database-url", &pooled]).await;
    assert!(stderr.contains("connection pooler"), "{stderr}");
    assert!(stderr.contains("--database-direct-url"), "{stderr}");
}
