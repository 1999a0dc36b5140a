//! The `snapfence serve` binary as a user runs it: embedded PostgreSQL in a data directory kept
//! across restarts, graceful shutdown, and a database that goes away and comes back.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, stream};
use reqwest::{Body, StatusCode};
use serde_json::{Value, json};
use snapfence::embedded::{EmbeddedPostgres, Settings};
use sqlx::Connection;

use snapfence_testkit::proxy::{Mode, Proxy};
pub(crate) use snapfence_testkit::serve::Served;

use crate::harness::{Instance, free_port, problem, rules, token};

pub(crate) fn short_tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sf-serve-")
        .tempdir_in("/tmp")
        .unwrap()
}

/// Starts the binary on a data directory and waits until `/readyz` says it is ready.
async fn serve(data_dir: &Path, stderr: &Path) -> Served {
    let args = [
        OsStr::new("--data-dir"),
        data_dir.as_os_str(),
        // One request at a time, so that a test can tell when its request is being served.
        OsStr::new("--max-concurrent-requests"),
        OsStr::new("1"),
    ];
    serve_with(&args, stderr).await
}

/// Starts `snapfence serve --listen 127.0.0.1:PORT` with `args` (and without `DATABASE_URL`
/// from the environment), its log in `stderr`, and waits until `/readyz` says it is ready.
pub(crate) async fn serve_with(args: &[&OsStr], stderr: &Path) -> Served {
    serve_with_env(args, &[], stderr).await
}

/// [`serve_with`] with `env` set (and no `OTEL_*` variable of the test's own environment).
pub(crate) async fn serve_with_env(args: &[&OsStr], env: &[(&str, &str)], stderr: &Path) -> Served {
    // First, so that `env` may set another filter.
    let env = [&[("RUST_LOG", "info")], env].concat();
    Served::start(env!("CARGO_BIN_EXE_snapfence"), args, &env, stderr).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_keeps_its_embedded_data_across_restarts_and_shuts_down_gracefully() {
    let dir = short_tempdir();
    let data = dir.path().join("data");
    let log = dir.path().join("serve.log");
    let http = reqwest::Client::new();

    let first = serve(&data, &log).await;
    let grant: Value = http
        .post(format!("{}/v1/leases/jobs%2F1", first.base))
        .json(&json!({"owner": "w", "ttl_ms": 60000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let t = token(&grant);

    // A slow upload is in flight when SIGTERM arrives; it still completes. Its first part is
    // sent at once, the rest (slowly) only after SIGTERM.
    let (terminated, sigterm) = tokio::sync::watch::channel(false);
    let upload = || {
        let sigterm = sigterm.clone();
        let chunks = stream::iter(0..5).then(move |i| {
            let mut sigterm = sigterm.clone();
            async move {
                if i > 0 {
                    let _ = sigterm.wait_for(|sent| *sent).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok::<_, std::io::Error>(format!("part{i};"))
            }
        });
        let put = http
            .put(format!("{}/v1/snapshots/jobs%2F1", first.base))
            .header("Fencing-Token", t.to_string())
            .body(Body::wrap_stream(chunks))
            .send();
        tokio::spawn(put)
    };
    let mut upload_task = upload();
    // The instance serves one request at a time: once a probe is shed, the upload is in flight.
    // A probe served meanwhile held the slot for a moment: an upload it pushed out (the only
    // way one answers before SIGTERM) is sent again.
    let deadline = Instant::now() + Duration::from_secs(30);
    while http
        .get(format!("{}/v1/leases/probe", first.base))
        .send()
        .await
        .unwrap()
        .status()
        != StatusCode::SERVICE_UNAVAILABLE
    {
        assert!(Instant::now() < deadline, "the upload never reached serve");
        if upload_task.is_finished() {
            upload_task = upload();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_base = first.base.clone();
    first.terminate();
    let _ = terminated.send(true);
    let r = upload_task.await.unwrap().unwrap();
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "the in-flight request finished"
    );
    assert!(first.wait().await.success());
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains(data.to_str().unwrap()),
        "the log says where the data lives"
    );
    assert!(
        logged.contains(&format!(
            "the operator page (leases, refused writes, recovery records, snapshots) is at {first_base}/ui"
        )),
        "the log says where the operator page is: {logged}"
    );
    let pid_file = data.join("pg").join("postmaster.pid");
    assert!(!pid_file.exists(), "the embedded PostgreSQL was stopped");

    let second = serve(&data, &log).await;
    let snap = http
        .get(format!("{}/v1/snapshots/jobs%2F1", second.base))
        .send()
        .await
        .unwrap();
    assert_eq!(snap.status(), StatusCode::OK);
    assert_eq!(snap.text().await.unwrap(), "part0;part1;part2;part3;part4;");
    let later: Value = http
        .post(format!("{}/v1/leases/other", second.base))
        .json(&json!({"owner": "w", "ttl_ms": 60000}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(token(&later) > t, "tokens keep increasing across restarts");
    second.terminate();
    assert!(second.wait().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_database_answers_503_quickly_and_the_service_recovers_by_itself() {
    // Kept past a failing test: the watchdog removes it with the cluster once the test process
    // has exited.
    let dir = short_tempdir().keep();
    let start = {
        let dir = dir.clone();
        move || EmbeddedPostgres::start(&dir, &Settings::default()).unwrap()
    };
    let pg = tokio::task::spawn_blocking(start.clone()).await.unwrap();
    pg.remove_when_process_exits(std::process::id()).unwrap();
    pg.ensure_database("outage").await.unwrap();
    let options = pg.connect_options("outage");
    let instance = Instance::start(options, rules()).await;
    let http = reqwest::Client::new();
    let acquire = |key: &'static str| {
        http.post(format!("{}/v1/leases/{key}", instance.base))
            .json(&json!({"owner": "w", "ttl_ms": 60000}))
            .send()
    };
    assert_eq!(
        acquire("before").await.unwrap().status(),
        StatusCode::CREATED
    );

    let pg = tokio::task::spawn_blocking(move || {
        pg.stop().unwrap();
        pg
    })
    .await
    .unwrap();
    let asked = Instant::now();
    let r = acquire("during").await.unwrap();
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "answered, not hung"
    );
    assert_eq!(r.headers()["retry-after"], "1");
    problem(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    let ready = http
        .get(format!("{}/readyz", instance.base))
        .send()
        .await
        .unwrap();
    problem(ready, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;

    let pg2 = tokio::task::spawn_blocking(start).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = http
            .get(format!("{}/readyz", instance.base))
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "the service did not recover");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = acquire("after").await.unwrap();
    let status = after.status();
    assert_eq!(
        status,
        StatusCode::CREATED,
        "{}",
        after.text().await.unwrap()
    );
    let r = acquire("during").await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "the refused acquire changed nothing"
    );
    instance.stop().await;
    tokio::task::spawn_blocking(move || pg2.stop().unwrap())
        .await
        .unwrap();
    drop(pg);
    std::fs::remove_dir_all(&dir).ok();
}

/// `serve` opens `--db-pool-warm` hot connections as it starts, with every hot statement planned.
#[tokio::test]
async fn serve_opens_its_warm_hot_connections_with_their_plans_as_it_starts() {
    let database = crate::harness::fresh_database().await;
    let url = crate::harness::url_of(database.options());
    let dir = short_tempdir();
    let log = dir.path().join("serve.log");
    let args = [
        OsStr::new("--database-url"),
        OsStr::new(&url),
        OsStr::new("--db-pool-warm"),
        OsStr::new("2"),
    ];
    let served = serve_with(&args, &log).await;
    // Both forms of the large bodies' put are left out (plans.rs says why).
    let planned = snapfence::store::hot_statements().len() - 2;
    let expected = format!(
        "hot connections opened and planned connections=2 plans={}",
        2 * planned
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut text = String::new();
    while !text.contains(&expected) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        text = std::fs::read_to_string(&log).unwrap_or_default();
    }
    served.terminate();
    served.wait().await;
    assert!(text.contains(&expected), "{text}");
}

#[tokio::test]
async fn serve_refuses_a_public_address_while_no_api_key_exists() {
    let database = crate::harness::fresh_database().await;
    let url = crate::harness::url_of(database.options());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_snapfence"))
            .args(["serve", "--listen", "0.0.0.0:0", "--database-url"])
            .arg(url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to listen on 0.0.0.0:0 without authentication"),
        "{stderr}"
    );
    assert!(stderr.contains("--insecure-no-auth"), "{stderr}");
}

/// As root, PostgreSQL runs as `postgres`, which must be able to enter every directory above
/// the data directory: when it cannot, `serve` says which directory and the `chmod` that
/// fixes it, once, before creating anything. (Only root runs PostgreSQL as another user: as
/// anyone else there is nothing to check.)
#[test]
fn serve_as_root_names_the_directory_postgres_cannot_enter_and_the_fix_once() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("not root: serve runs PostgreSQL as this user, and no directory is out of reach");
        return;
    }
    let dir = short_tempdir();
    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = closed.join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let fix = format!("`chmod o+x {}`", closed.display());
    assert_eq!(stderr.matches(&fix).count(), 1, "the fix, once: {stderr}");
    assert!(
        stderr.contains(&format!("cannot enter {} (mode 700", closed.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("Permission denied"), "{stderr}");
    assert!(!data.exists(), "nothing was created");
}

/// A database reached through a proxy on a loopback port that drops the first `dropped`
/// connections as soon as they send their first bytes, as a balancer does while its leader
/// settles; with the cluster (removed with its directory) and the URL to give `serve`.
async fn flaky_database(dropped: usize) -> (EmbeddedPostgres, Proxy, String) {
    // Kept past a failing test: the watchdog removes it with the cluster once the test process
    // has exited.
    let dir = short_tempdir().keep();
    let settings = Settings {
        tcp_port: Some(free_port()),
        ..Settings::default()
    };
    let pg = tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&dir, &settings))
        .await
        .unwrap()
        .unwrap();
    pg.remove_when_process_exits(std::process::id()).unwrap();
    pg.ensure_database("blip").await.unwrap();
    let user = pg.connect_options("blip").get_username().to_owned();
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], pg.port()));
    let proxy = Proxy::start(target).await;
    proxy.next_connections(vec![Mode::Reset; dropped]);
    let url = format!("postgres://{user}@{}/blip", proxy.addr());
    (pg, proxy, url)
}

/// Runs `snapfence serve` with `args`, which must make it exit non-zero within 20 s; its stderr.
pub(crate) async fn serve_fails(args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_snapfence"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("DATABASE_URL")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "not given up: {stderr}"
    );
    stderr
}

async fn stop(pg: EmbeddedPostgres) {
    tokio::task::spawn_blocking(move || pg.stop())
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_waits_out_dropped_connections_and_serves_once_they_heal() {
    let (pg, proxy, url) = flaky_database(6).await;
    let dir = short_tempdir();
    let log = dir.path().join("serve.log");
    let served = serve_with(&[OsStr::new("--database-url"), OsStr::new(&url)], &log).await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("waiting for the database"), "{logged}");
    assert!(
        proxy.connections() > 6,
        "it connected again after the drops"
    );
    let r = reqwest::Client::new()
        .post(format!("{}/v1/leases/after-the-blip", served.base))
        .json(&json!({"owner": "w", "ttl_ms": 60000}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    served.terminate();
    assert!(served.wait().await.success());
    stop(pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_gives_up_at_its_bound_and_names_the_lost_connection_not_rights() {
    let (pg, _proxy, url) = flaky_database(100_000).await;
    let stderr = serve_fails(&["--startup-timeout", "2s", "--database-url", &url]).await;
    assert!(
        stderr.contains("the database stayed unavailable for 2s"),
        "{stderr}"
    );
    assert!(stderr.contains("--startup-timeout"), "{stderr}");
    assert!(!stderr.contains("create tables"), "{stderr}");
    stop(pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_names_a_missing_right_to_create_tables_and_exits_at_once() {
    let (pg, _proxy, _) = flaky_database(0).await;
    let mut admin = sqlx::PgConnection::connect_with(&pg.connect_options("blip"))
        .await
        .unwrap();
    for sql in [
        "CREATE ROLE visitor LOGIN",
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",
    ] {
        sqlx::query(sql).execute(&mut admin).await.unwrap();
    }
    let url = pg
        .url("blip")
        .replacen("postgres://postgres@", "postgres://visitor@", 1);
    let stderr = serve_fails(&["--database-url", &url]).await;
    assert!(stderr.contains("may not create tables"), "{stderr}");
    stop(pg).await;
}
