//! `snapfence run` as a user runs it: real child processes under a real lease, a loopback
//! proxy to cut the lease's renewals off, and the server asked directly whether the lease was
//! still live when the last process of the command died.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use snapfence::domain::{LeaseState, RecoveryReason, Scope};
use snapfence_client::{Client, Error};
use tokio::process::Child;
use tokio::time::{Instant, sleep};

use crate::harness::TestApp;
use crate::proxy::Proxy;
use crate::support::{Ran, client, grant, key, snapfence, upstream};

/// A directory for the files a command leaves for the test to read.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sf-run-")
        .tempdir()
        .unwrap()
}

/// `snapfence run ARGS…` with `DIR` (the scratch directory) and `SF_BIN` in its
/// environment, its output captured.
fn start(base: &str, dir: &Path, args: &[&str]) -> Child {
    snapfence(base)
        .arg("run")
        .args(args)
        .env("DIR", dir)
        .env("SF_BIN", env!("CARGO_BIN_EXE_snapfence"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("snapfence run")
}

async fn finish(child: Child) -> Ran {
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("run exits")
        .unwrap();
    Ran {
        code: out.status.code().expect("run exited, was not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Runs to the end.
async fn run(base: &str, dir: &Path, args: &[&str]) -> Ran {
    finish(start(base, dir, args)).await
}

/// The process id a command wrote to `DIR/name`, once it has.
async fn pid_in(dir: &Path, name: &str) -> i32 {
    let path: PathBuf = dir.join(name);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(&path) {
            if let Ok(pid) = text.trim().parse() {
                return pid;
            }
        }
        assert!(
            Instant::now() < until,
            "{} was never written",
            path.display()
        );
        sleep(Duration::from_millis(10)).await;
    }
}

/// Whether a process is gone: no longer there, or a zombie that does nothing.
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat[stat.rfind(')').unwrap() + 1..]
            .trim_start()
            .starts_with('Z'),
    }
}

/// Waits until every one of `pids` is gone; returns when.
async fn all_gone(pids: &[i32]) -> Instant {
    let until = Instant::now() + Duration::from_secs(15);
    while !pids.iter().all(|&p| gone(p)) {
        assert!(Instant::now() < until, "processes {pids:?} are still alive");
        sleep(Duration::from_millis(5)).await;
    }
    Instant::now()
}

/// The state of key `k`, as the server at `base` tells it.
async fn state_of(base: &str, k: &str) -> LeaseState {
    client(base).lease_status(&key(k)).await.unwrap().state
}

/// Asserts that the server still held the lease of `key` when this was called: nobody else
/// can have started. The time is taken before asking, on this machine's clock (the server's
/// too), so that an answer slowed down by a loaded machine is not taken for a lapsed lease.
async fn still_held(direct: &Client, k: &str) {
    let asked = chrono::Utc::now();
    let status = direct.lease_status(&key(k)).await.unwrap();
    assert!(
        status.state == LeaseState::Held
            || (status.state == LeaseState::Expired && asked < status.lease.expires_at),
        "the command must be gone while the server still holds the lease (asked at {asked}, \
         {:?}, expires {})",
        status.state,
        status.lease.expires_at
    );
}

/// `run` through a proxy, so that the test can cut its renewals off. Renewals get 3 s before
/// the lease is declared lost (TTL less grace less run's own 1 s), and the grace is 2 s: both
/// generous for a loaded machine.
const CUT_OFF: [&str; 6] = ["--ttl", "6s", "--grace", "2s", "--timeout", "1s"];

#[tokio::test]
async fn a_command_gets_its_lease_in_the_environment_and_writes_with_its_token() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    // curl where the machine has it, as a user's script would; the CLI otherwise.
    let script = r#"
        env | grep '^SNAPFENCE_' | sort > "$DIR/env"
        if command -v curl >/dev/null; then
            curl -sf -X PUT -H "Fencing-Token: $SNAPFENCE_TOKEN" --data-binary "by $SNAPFENCE_OWNER" \
                "$SNAPFENCE_URL/v1/snapshots/$SNAPFENCE_KEY" >/dev/null
        else
            printf 'by %s' "$SNAPFENCE_OWNER" | "$SF_BIN" snapshot put "$SNAPFENCE_KEY" >/dev/null
        fi"#;
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["jobs-1", "--owner", "runner", "--", "sh", "-c", script],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let c = client(&app.instance.base);
    let snapshot = c.get_snapshot(&key("jobs-1")).await.unwrap();
    assert_eq!(snapshot.body, "by runner");
    let status = c.lease_status(&key("jobs-1")).await.unwrap();
    assert_eq!(snapshot.head.token, status.lease.token);
    assert_eq!(
        status.state,
        LeaseState::Released,
        "released after the command"
    );
    let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
    let expected = format!(
        "SNAPFENCE_KEY=jobs-1\nSNAPFENCE_OWNER=runner\nSNAPFENCE_TOKEN={}\nSNAPFENCE_URL={}\n",
        status.lease.token, app.instance.base
    );
    assert_eq!(env, expected);
    app.stop().await;
}

#[tokio::test]
async fn the_commands_own_snapfence_calls_take_the_lease_from_the_environment() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let script =
        r#"printf 'step 1' | "$SF_BIN" snapshot put "$SNAPFENCE_KEY" --content-type text/plain"#;
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["jobs/2", "--", "sh", "-c", script],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(ran.stdout.contains("created"), "{}", ran.stdout);
    let snapshot = client(&app.instance.base)
        .get_snapshot(&key("jobs/2"))
        .await
        .unwrap();
    assert_eq!(snapshot.body, "step 1");
    assert_eq!(snapshot.head.content_type, "text/plain");
    app.stop().await;
}

#[tokio::test]
async fn the_commands_exit_status_passes_through_and_the_lease_is_released() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--", "sh", "-c", "exit 7"],
    )
    .await;
    assert_eq!(ran.code, 7, "{}", ran.stderr);
    assert_eq!(
        state_of(&app.instance.base, "k").await,
        LeaseState::Released
    );
    app.stop().await;
}

#[tokio::test]
async fn a_command_killed_by_a_signal_exits_with_128_plus_the_signal() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--", "sh", "-c", "kill -KILL $$"],
    )
    .await;
    assert_eq!(ran.code, 128 + 9, "{}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn a_command_that_does_not_exist_exits_127_and_releases_the_lease() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--", "/nonexistent/command"],
    )
    .await;
    assert_eq!(ran.code, 127, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("cannot start /nonexistent/command"),
        "{}",
        ran.stderr
    );
    assert_eq!(
        state_of(&app.instance.base, "k").await,
        LeaseState::Released
    );
    app.stop().await;
}

#[tokio::test]
async fn a_file_the_kernel_cannot_execute_exits_126_and_releases_the_lease() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    // Executable, but no program: no ELF header and no #! line, so exec fails with ENOEXEC.
    let script = dir.path().join("no-shebang");
    std::fs::write(&script, "echo never\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--", script.to_str().unwrap()],
    )
    .await;
    assert_eq!(ran.code, 126, "{}", ran.stderr);
    assert!(ran.stderr.contains("#! line"), "{}", ran.stderr);
    assert_eq!(
        state_of(&app.instance.base, "k").await,
        LeaseState::Released
    );
    app.stop().await;
}

#[tokio::test]
async fn a_ttl_below_the_old_fixed_grace_works_without_naming_a_grace() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--ttl", "1s", "--", "sh", "-c", "sleep 1.5"],
    )
    .await;
    assert_eq!(ran.code, 0, "renewed past its TTL: {}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn a_lost_lease_stops_a_plain_command_before_the_lease_expires_on_the_server() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let dir = scratch();
    let mut args = vec!["k"];
    args.extend(CUT_OFF);
    args.extend(["--", "sh", "-c", r#"echo $$ > "$DIR/pid"; exec sleep 60"#]);
    let running = start(&proxy.base(), dir.path(), &args);
    let pid = pid_in(dir.path(), "pid").await;
    sleep(Duration::from_millis(1500)).await;
    assert!(!gone(pid), "the lease is renewed while the network works");
    proxy.stall();

    all_gone(&[pid]).await;
    still_held(&client(&app.instance.base), "k").await;
    let ran = finish(running).await;
    assert_eq!(ran.code, 11, "the lost code: {}", ran.stderr);
    assert!(ran.stderr.contains("about to lapse"), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("stopping the command"),
        "{}",
        ran.stderr
    );
    app.stop().await;
}

#[tokio::test]
async fn a_command_that_ignores_sigterm_is_killed_once_the_grace_has_passed() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let dir = scratch();
    let script =
        r#"trap 'echo term >> "$DIR/log"' TERM; echo $$ > "$DIR/pid"; while :; do sleep 0.1; done"#;
    let mut args = vec!["k"];
    args.extend(CUT_OFF);
    args.extend(["--", "sh", "-c", script]);
    let running = start(&proxy.base(), dir.path(), &args);
    let pid = pid_in(dir.path(), "pid").await;
    proxy.stall();

    let log = dir.path().join("log");
    let until = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("term")) {
        assert!(Instant::now() < until, "SIGTERM never arrived");
        sleep(Duration::from_millis(5)).await;
    }
    let termed = Instant::now();
    assert!(!gone(pid), "it survives SIGTERM");
    let dead = all_gone(&[pid]).await;
    still_held(&client(&app.instance.base), "k").await;
    assert!(
        dead - termed >= Duration::from_millis(800),
        "SIGKILL came after the 2s grace, not {:?} after SIGTERM",
        dead - termed
    );
    assert_eq!(finish(running).await.code, 11);
    app.stop().await;
}

#[tokio::test]
async fn the_commands_own_children_are_stopped_too_even_if_they_ignore_sigterm() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let dir = scratch();
    let script = r#"(trap '' TERM; exec sleep 60) & echo $! > "$DIR/grandchild"; echo $$ > "$DIR/pid"; wait"#;
    let mut args = vec!["k"];
    args.extend(CUT_OFF);
    args.extend(["--", "sh", "-c", script]);
    let running = start(&proxy.base(), dir.path(), &args);
    let pid = pid_in(dir.path(), "pid").await;
    let grandchild = pid_in(dir.path(), "grandchild").await;
    proxy.stall();

    all_gone(&[pid, grandchild]).await;
    still_held(&client(&app.instance.base), "k").await;
    assert_eq!(finish(running).await.code, 11);
    app.stop().await;
}

#[tokio::test]
async fn what_a_finished_command_left_running_is_stopped_before_the_release() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let script = r#"sleep 60 & echo $! > "$DIR/leftover"; exit 0"#;
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--grace", "1s", "--", "sh", "-c", script],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let leftover = pid_in(dir.path(), "leftover").await;
    assert!(gone(leftover), "the leftover was stopped");
    assert!(
        ran.stderr.contains("left processes in its group"),
        "{}",
        ran.stderr
    );
    app.stop().await;
}

#[tokio::test]
async fn wait_queues_on_the_server_and_gets_the_lease_once_the_previous_holder_releases() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let held = grant(&c, &key("k"), "other", Duration::from_secs(30)).await;
    let dir = scratch();
    let running = start(
        &app.instance.base,
        dir.path(),
        &["k", "--wait", "20s", "--", "true"],
    );
    // Released once run waits in the key's queue on the server (however slowly it started).
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_waiters WHERE key = 'k'")
            .fetch_one(app.db())
            .await
            .unwrap();
        if queued == 1 {
            break;
        }
        assert!(Instant::now() < until, "run never waited in the queue");
        sleep(Duration::from_millis(20)).await;
    }
    c.release(&key("k"), held.lease.token).await.unwrap();
    let ran = finish(running).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stderr.contains(r#"is held by "other""#),
        "{}",
        ran.stderr
    );
    assert!(ran.stderr.contains("waiting up to"), "{}", ran.stderr);
    let status = c.lease_status(&key("k")).await.unwrap();
    assert!(
        status.newest_token > held.lease.token,
        "run got a lease of its own"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_grant_after_a_long_wait_runs_the_command_to_its_end() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let held = grant(&c, &key("k"), "other", Duration::from_secs(30)).await;
    let held_since = Instant::now();
    let dir = scratch();
    let running = start(
        &app.instance.base,
        dir.path(),
        &[
            "k",
            "--ttl",
            "2s",
            "--wait",
            "20s",
            "--",
            "sh",
            "-c",
            "sleep 3; echo finished",
        ],
    );
    let until = Instant::now() + Duration::from_secs(30);
    while c.lease_status(&key("k")).await.unwrap().waiters < 1 {
        assert!(Instant::now() < until, "run never waited in the queue");
        sleep(Duration::from_millis(20)).await;
    }
    // Queued twice the TTL behind the holder.
    tokio::time::sleep_until(held_since + Duration::from_secs(4)).await;
    c.release(&key("k"), held.lease.token).await.unwrap();
    let ran = finish(running).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(ran.stdout, "finished\n", "{}", ran.stderr);
    assert!(
        !ran.stderr.contains("lapse") && !ran.stderr.contains("lost"),
        "{}",
        ran.stderr
    );
    app.stop().await;
}

#[tokio::test]
async fn without_wait_a_held_key_fails_at_once_with_the_held_code() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    grant(&c, &key("k"), "other", Duration::from_secs(30)).await;
    let dir = scratch();
    let ran = run(&app.instance.base, dir.path(), &["k", "--", "true"]).await;
    assert_eq!(ran.code, 10, "{}", ran.stderr);
    assert!(ran.stderr.contains("lease_held"), "{}", ran.stderr);
    assert!(ran.stderr.contains("--wait DURATION"), "{}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn a_wait_that_runs_out_says_it_waited_and_fails_with_the_held_code() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    grant(&c, &key("k"), "other", Duration::from_secs(30)).await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--wait", "500ms", "--", "true"],
    )
    .await;
    assert_eq!(ran.code, 10, "{}", ran.stderr);
    assert!(ran.stderr.contains("waited 500ms for k"), "{}", ran.stderr);
    app.stop().await;
}

/// `run k` of a shell loop that first sets `trap`; returns once the loop runs, with `run`'s pid.
async fn run_a_loop(app: &TestApp, dir: &Path, trap: &str) -> (Child, Pid) {
    let script = format!(r#"{trap}; echo $$ > "$DIR/pid"; while :; do sleep 0.1; done"#);
    let running = start(&app.instance.base, dir, &["k", "--", "sh", "-c", &script]);
    pid_in(dir, "pid").await;
    let run_pid = Pid::from_raw(running.id().unwrap() as i32);
    (running, run_pid)
}

#[tokio::test]
async fn an_interrupt_of_run_is_passed_on_to_the_command() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let (running, run_pid) = run_a_loop(&app, dir.path(), "trap 'exit 42' INT").await;
    kill(run_pid, Signal::SIGINT).unwrap();
    let ran = finish(running).await;
    assert_eq!(ran.code, 42, "{}", ran.stderr);
    assert!(ran.stderr.contains("passing SIGINT on"), "{}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn a_second_signal_kills_a_command_that_ignores_the_first() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let (running, run_pid) = run_a_loop(&app, dir.path(), "trap '' INT TERM").await;
    kill(run_pid, Signal::SIGTERM).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    kill(run_pid, Signal::SIGINT).unwrap();
    let ran = finish(running).await;
    assert_eq!(ran.code, 128 + 9, "killed by SIGKILL: {}", ran.stderr);
    assert!(ran.stderr.contains("killing the command"), "{}", ran.stderr);
    let status = client(&app.instance.base)
        .lease_status(&key("k"))
        .await
        .unwrap();
    assert_eq!(status.state, LeaseState::Released, "the lease was released");
    app.stop().await;
}

#[tokio::test]
async fn with_crash_recovery_a_command_that_cannot_start_leaves_no_recovery_record() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &[
            "k",
            "--crash-recovery",
            "--",
            "/nonexistent/snapfence-test-cmd",
        ],
    )
    .await;
    assert_eq!(ran.code, 127, "{}", ran.stderr);
    let status = client(&app.instance.base)
        .lease_status(&key("k"))
        .await
        .unwrap();
    assert_eq!(status.state, LeaseState::Released);
    assert!(status.recovery.is_none());
    app.stop().await;
}

#[tokio::test]
async fn with_crash_recovery_a_failing_command_leaves_a_recovery_record() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--crash-recovery", "--", "sh", "-c", "exit 3"],
    )
    .await;
    assert_eq!(ran.code, 3, "{}", ran.stderr);
    let status = client(&app.instance.base)
        .lease_status(&key("k"))
        .await
        .unwrap();
    assert_eq!(status.state, LeaseState::RecoveryPending);
    assert_eq!(
        status.recovery.unwrap().reason,
        RecoveryReason::RecoveryRequired
    );
    app.stop().await;
}

#[tokio::test]
async fn with_crash_recovery_a_succeeding_command_just_releases() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--crash-recovery", "--", "true"],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        state_of(&app.instance.base, "k").await,
        LeaseState::Released
    );
    app.stop().await;
}

#[tokio::test]
async fn a_ttl_too_short_for_the_grace_is_refused_before_acquiring() {
    let app = TestApp::spawn().await;
    let dir = scratch();
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["k", "--ttl", "3s", "--grace", "2s", "--", "true"],
    )
    .await;
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("too short"), "{}", ran.stderr);
    let e = client(&app.instance.base)
        .lease_status(&key("k"))
        .await
        .unwrap_err();
    assert!(
        matches!(e, Error::NotFound { .. }),
        "nothing acquired: {e:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_api_key_given_to_run_reaches_the_commands_own_calls() {
    let app = TestApp::spawn().await;
    let writer = app.make_key("runner", Scope::Write, "").await;
    let dir = scratch();
    let script = r#"printf 'keyed' | "$SF_BIN" snapshot put "$SNAPFENCE_KEY" >/dev/null"#;
    let ran = run(
        &app.instance.base,
        dir.path(),
        &["--api-key", &writer, "k", "--", "sh", "-c", script],
    )
    .await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let reader = snapfence_client::Client::builder(app.instance.base.clone())
        .api_key(writer)
        .build()
        .unwrap();
    assert_eq!(reader.get_snapshot(&key("k")).await.unwrap().body, "keyed");
    app.stop().await;
}
