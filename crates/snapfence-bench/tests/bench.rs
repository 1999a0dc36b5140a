//! `snapfence-bench` against a real server: what it counts as accepted is what the database
//! holds, and a refused write is counted by its code, never as a success.

use serde_json::Value;

use snapfence_testkit::harness::TestApp;

/// What a run of the binary left: its exit code and output.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `snapfence-bench` against `base` to its end.
async fn cli(base: &str, args: &[&str]) -> Ran {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence-bench"))
        .args(args)
        .env("SNAPFENCE_URL", base)
        .env_remove("SNAPFENCE_API_KEY")
        .env_remove("SNAPFENCE_CA_CERT")
        .kill_on_drop(true)
        .output()
        .await
        .expect("the snapfence-bench binary");
    Ran {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// The `put` run's arguments: four workers, two keys each, for `seconds`.
fn put_run<'a>(prefix: &'a str, seconds: &'a str) -> Vec<&'a str> {
    vec![
        "--output",
        "json",
        "--op",
        "put",
        "--concurrency",
        "4",
        "--keys",
        "8",
        "--body-bytes",
        "64",
        "--duration",
        seconds,
        "--prefix",
        prefix,
    ]
}

#[tokio::test]
async fn bench_counts_as_accepted_exactly_the_writes_the_database_holds() {
    let app = TestApp::spawn().await;
    let ran = cli(&app.instance.base, &put_run("b/", "1s")).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let report: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(report["errors"], serde_json::json!({}));
    assert!(report["verified"]["ok"].is_string(), "{report}");
    let ok = report["ok"].as_i64().unwrap();
    assert!(ok > 0, "{report}");
    let held: (i64, i64) = sqlx::query_as(
        "SELECT count(*), sum(version)::bigint FROM snapshot_heads WHERE key LIKE 'b/%'",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(
        held,
        (8, ok),
        "8 keys, and as many versions as accepted writes"
    );
    app.stop().await;
}

#[tokio::test]
async fn bench_counts_refused_writes_by_their_code_and_fails_its_check() {
    let app = TestApp::spawn().await;
    let run = tokio::spawn({
        let base = app.instance.base.clone();
        async move { cli(&base, &put_run("r/", "3s")).await }
    });
    // Once the run has written to a key, release its lease behind its back: every later write
    // to that key is a stale one.
    let token = loop {
        let token: Option<i64> = sqlx::query_scalar(
            "SELECT l.token FROM leases l JOIN snapshot_heads h ON h.key = l.key WHERE l.key = 'r/0'",
        )
        .fetch_optional(app.db())
        .await
        .unwrap();
        if let Some(token) = token {
            break token;
        }
        assert!(!run.is_finished(), "the run ended without writing to r/0");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(app.release("r/0", token).await.status(), 204);
    let ran = run.await.unwrap();
    assert_eq!(ran.code, 1, "the check after the run fails: {}", ran.stderr);
    let report: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert!(
        report["errors"]["stale_token"].as_u64().unwrap() > 0,
        "{report}"
    );
    let failed = report["verified"]["failed"].as_str().unwrap();
    assert!(
        failed.contains("r/0") && failed.contains("not held"),
        "{failed}"
    );
    app.stop().await;
}

/// The JSON report of a timing run (`handoff`, `expiry`, `watch`) on keys under `prefix`,
/// which must have exited 0 with no error and its check passed.
async fn timing_run(base: &str, op: &str, prefix: &str, more: &[&str]) -> Value {
    let mut args = vec!["--output", "json", "--op", op, "--prefix", prefix];
    args.extend_from_slice(more);
    let ran = cli(base, &args).await;
    assert_eq!(ran.code, 0, "{op}: {}", ran.stderr);
    let report: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    assert!(report["verified"]["ok"].is_string(), "{report}");
    assert!(report["timing"]["from_to"].is_string(), "{report}");
    report
}

#[tokio::test]
async fn bench_times_hand_offs_each_to_its_waiter() {
    let app = TestApp::spawn().await;
    let released = timing_run(&app.instance.base, "handoff", "h/", &["--rounds", "3"]).await;
    assert_eq!(released["ok"], 3, "{released}");
    let expired = timing_run(&app.instance.base, "expiry", "e/", &["--rounds", "2"]).await;
    assert_eq!(expired["ok"], 2, "{expired}");
    assert!(
        expired["timing"]["clock_offset_error_ms"].as_f64().unwrap() < 1000.0,
        "{expired}"
    );
    // Each round's key went from its holder to its waiter, who released it at the end.
    let keys: (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE owner = 'bench-waiter' AND end_reason = 'released'), \
         count(*) FROM leases WHERE key LIKE 'h/%' OR key LIKE 'e/%'",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(
        keys,
        (5, 5),
        "every key's last lease is its waiter's, released"
    );
    app.stop().await;
}

#[tokio::test]
async fn bench_sees_every_watched_write_once_in_order() {
    let app = TestApp::spawn().await;
    let more = ["--concurrency", "2", "--rate", "40", "--duration", "1s"];
    let report = timing_run(&app.instance.base, "watch", "w/", &more).await;
    let versions: i64 =
        sqlx::query_scalar("SELECT sum(version)::bigint FROM snapshot_heads WHERE key LIKE 'w/%'")
            .fetch_one(app.db())
            .await
            .unwrap();
    assert!(versions > 0);
    assert_eq!(
        report["ok"], versions,
        "one event per accepted write: {report}"
    );
    app.stop().await;
}

#[tokio::test]
async fn bench_counts_as_lock_cycles_exactly_the_grants_and_releases_the_database_recorded() {
    let app = TestApp::spawn().await;
    let ran = cli(
        &app.instance.base,
        &[
            "--output",
            "json",
            "--op",
            "lock",
            "--concurrency",
            "2",
            "--keys",
            "4",
            "--duration",
            "1s",
            "--prefix",
            "l/",
        ],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let report: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(report["errors"], serde_json::json!({}), "{report}");
    let ok = report["ok"].as_i64().unwrap();
    assert!(ok > 0, "{report}");
    let recorded: (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE kind = 'lease.granted'), \
         count(*) FILTER (WHERE kind = 'lease.released'), \
         (SELECT count(*) FROM leases WHERE key LIKE 'l/%' AND end_reason = 'released') \
         FROM change_log WHERE key LIKE 'l/%'",
    )
    .fetch_one(app.db())
    .await
    .unwrap();
    assert_eq!(
        recorded,
        (ok, ok, 4),
        "one grant and one release per counted cycle, and every key left released"
    );
    app.stop().await;
}

#[tokio::test]
async fn bench_floods_with_waiters_that_all_queue_while_another_client_is_served() {
    let app = TestApp::spawn().await;
    let more = ["--flood", "300", "--duration", "2s"];
    let report = timing_run(&app.instance.base, "flood", "f/", &more).await;
    assert_eq!(
        report["timing"]["flood"],
        serde_json::json!({"waiting": 300}),
        "every flooding acquire queued (the default bounds hold 300): {report}"
    );
    assert!(report["ok"].as_u64().unwrap() > 0, "{report}");
    assert!(
        report["timing"]["acquire_ms"]["max"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    app.stop().await;
}
