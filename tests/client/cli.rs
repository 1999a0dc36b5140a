//! The `snapfence` binary's lease, snapshot and audit commands: golden files of `--output json`
//! for each subcommand and of the message and exit code for each error, compared after
//! normalising what differs between runs (times, tokens, ids, ports).

use std::time::Duration;

use serde_json::Value;
use snapfence::Rules;
use snapfence::domain::Scope;
use snapfence_client::{AcquireRequest, PutOptions};

use crate::harness::TestApp;
use crate::proxy::{Mode, Proxy};
use crate::support::{
    Normaliser, Outage, cli, cli_with_stdin, client, closed_port, golden, grant, key,
    normalise_text, owner, upstream,
};

const TTL: Duration = Duration::from_secs(30);

/// Runs the binary with `--output json`, which must succeed, and compares its normalised
/// output with `golden/NAME.json`.
async fn json_golden(base: &str, args: &[&str], stdin: &[u8], name: &str) -> Value {
    let mut all = vec!["--output", "json"];
    all.extend(args);
    let ran = cli_with_stdin(base, &all, stdin).await;
    assert_eq!(ran.code, 0, "{args:?}: {}", ran.stderr);
    let value: Value = serde_json::from_str(&ran.stdout).expect("JSON on stdout");
    let shown = Normaliser::default().json(value.clone());
    golden(
        &format!("{name}.json"),
        &format!("{}\n", serde_json::to_string_pretty(&shown).unwrap()),
    );
    value
}

/// Runs the binary, which must fail with `code`, and compares its exit code and normalised
/// stderr with `golden/errors/NAME.txt`.
pub(crate) async fn error_golden(base: &str, args: &[&str], code: i32, name: &str) {
    let ran = cli(base, args).await;
    assert_eq!(ran.code, code, "{args:?}: {}", ran.stderr);
    assert!(ran.stdout.is_empty(), "errors go to stderr: {}", ran.stdout);
    golden(
        &format!("errors/{name}.txt"),
        &format!(
            "$ snapfence {}\nexit {}\n{}",
            args.join(" "),
            ran.code,
            normalise_text(&ran.stderr, base)
        ),
    );
}

#[tokio::test]
async fn lease_acquire_prints_the_grant() {
    let app = TestApp::spawn().await;
    let args = [
        "lease",
        "acquire",
        "jobs/42",
        "--owner",
        "worker-7",
        "--ttl",
        "30s",
        "--metadata",
        r#"{"pid": 4242}"#,
        "--crash-recovery",
    ];
    json_golden(&app.instance.base, &args, b"", "lease-acquire").await;
    app.stop().await;
}

#[tokio::test]
async fn lease_acquire_with_wait_waits_in_the_queue_and_prints_the_grant_once_released() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let held = grant(&c, &key("jobs/42"), "worker-7", TTL).await;
    let base = app.instance.base.clone();
    let waiting = tokio::spawn(async move {
        let args = [
            "--output", "json", "lease", "acquire", "jobs/42", "--owner", "worker-8",
        ];
        cli(&base, &[&args[..], &["--wait", "30s"]].concat()).await
    });
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_waiters")
            .fetch_one(app.db())
            .await
            .unwrap();
        if queued == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the CLI never waited in the queue"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    c.release(&key("jobs/42"), held.lease.token).await.unwrap();
    let ran = waiting.await.unwrap();
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let grant: Value = serde_json::from_str(&ran.stdout).unwrap();
    assert_eq!(grant["owner"], "worker-8");
    assert!(grant["token"].as_i64().unwrap() > held.lease.token.get());
    app.stop().await;
}

#[tokio::test]
async fn lease_acquire_refuses_a_wait_over_five_minutes() {
    let app = TestApp::spawn().await;
    let ran = cli(
        &app.instance.base,
        &["lease", "acquire", "k", "--wait", "6m"],
    )
    .await;
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("at most 5m"), "{}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn lease_renew_prints_the_renewed_lease() {
    let app = TestApp::spawn().await;
    let t = grant(&client(&app.instance.base), &key("k"), "w", TTL)
        .await
        .lease
        .token
        .to_string();
    let args = ["lease", "renew", "k", "--token", &t, "--ttl", "1m"];
    json_golden(&app.instance.base, &args, b"", "lease-renew").await;
    app.stop().await;
}

#[tokio::test]
async fn lease_release_abandon_and_require_recovery_print_what_they_did() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    for (command, name) in [
        ("release", "lease-release"),
        ("abandon", "lease-abandon"),
        ("require-recovery", "lease-require-recovery"),
    ] {
        let k = key(command);
        let t = grant(&c, &k, "w", TTL).await.lease.token.to_string();
        let args = ["lease", command, command, "--token", &t];
        json_golden(&app.instance.base, &args, b"", name).await;
    }
    app.stop().await;
}

#[tokio::test]
async fn lease_acquire_reconciling_prints_the_kept_record_and_lease_reconciled_the_lease() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let first = grant(&c, &key("deploy"), "deployer-1", TTL).await;
    c.abandon(&key("deploy"), first.lease.token).await.unwrap();
    let args = [
        "lease",
        "acquire",
        "deploy",
        "--owner",
        "deployer-2",
        "--reconciling",
    ];
    let g = json_golden(&app.instance.base, &args, b"", "lease-acquire-reconciling").await;
    assert_eq!(g["recovery"]["token"], first.lease.token.get());
    let t = g["token"].to_string();
    let args = ["lease", "reconciled", "deploy", "--token", &t];
    json_golden(&app.instance.base, &args, b"", "lease-reconciled").await;
    assert_eq!(c.lease_status(&key("deploy")).await.unwrap().recovery, None);
    app.stop().await;
}

#[tokio::test]
async fn lease_acquire_refuses_reconciled_with_reconciling_as_a_usage_error() {
    let app = TestApp::spawn().await;
    let args = ["lease", "acquire", "k", "--reconciled", "--reconciling"];
    let ran = cli(&app.instance.base, &args).await;
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("--reconciling"), "{}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn lease_reconciled_with_a_lost_lease_exits_11() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let g = grant(&c, &key("k"), "w", TTL).await;
    c.release(&key("k"), g.lease.token).await.unwrap();
    let t = g.lease.token.to_string();
    let ran = cli(
        &app.instance.base,
        &["lease", "reconciled", "k", "--token", &t],
    )
    .await;
    assert_eq!(ran.code, 11, "{}", ran.stderr);
    assert!(ran.stderr.contains("lease_lost"), "{}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn lease_show_prints_the_state_lease_and_recovery_record() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let g = grant(&c, &key("k"), "w", TTL).await;
    c.abandon(&key("k"), g.lease.token).await.unwrap();
    json_golden(
        &app.instance.base,
        &["lease", "show", "k"],
        b"",
        "lease-show",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn lease_show_as_a_table_aligns_its_fields() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let request = AcquireRequest::new(owner("worker-7"), TTL)
        .metadata(snapfence::domain::Metadata::new(serde_json::json!({"pid": 7})).unwrap());
    c.acquire(&key("jobs/42"), &request).await.unwrap();
    let ran = cli(&app.instance.base, &["lease", "show", "jobs/42"]).await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    golden(
        "lease-show.table",
        &normalise_text(&ran.stdout, &app.instance.base),
    );
    app.stop().await;
}

#[tokio::test]
async fn lease_list_prints_a_page_with_its_cursor() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    for k in ["jobs/1", "jobs/2", "jobs/3"] {
        grant(&c, &key(k), "w", TTL).await;
    }
    let args = ["lease", "list", "--prefix", "jobs/", "--limit", "2"];
    let page = json_golden(&app.instance.base, &args, b"", "lease-list").await;
    let table = cli(&app.instance.base, &args).await;
    let cursor = page["next_cursor"].as_str().unwrap();
    assert!(
        table.stderr.contains(&format!("--cursor {cursor}")),
        "a table tells how to go on: {}",
        table.stderr
    );
    app.stop().await;
}

#[tokio::test]
async fn snapshot_put_prints_the_version_written() {
    let app = TestApp::spawn().await;
    let t = grant(&client(&app.instance.base), &key("k"), "w", TTL)
        .await
        .lease
        .token
        .to_string();
    let args = [
        "snapshot",
        "put",
        "k",
        "--token",
        &t,
        "--content-type",
        "application/json",
    ];
    json_golden(&app.instance.base, &args, br#"{"step":3}"#, "snapshot-put").await;
    app.stop().await;
}

#[tokio::test]
async fn snapshot_get_writes_the_body_to_a_file_and_prints_its_metadata() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("k"), "w", TTL).await.lease.token;
    c.put_snapshot(&key("k"), t, "v1", &PutOptions::default())
        .await
        .unwrap();
    let dir = tempfile::Builder::new()
        .prefix("sf-tmp-")
        .tempdir()
        .unwrap();
    let out = dir.path().join("body");
    let args = ["snapshot", "get", "k", "--out", out.to_str().unwrap()];
    json_golden(&app.instance.base, &args, b"", "snapshot-get").await;
    assert_eq!(std::fs::read(&out).unwrap(), b"v1");
    let to_stdout = cli(
        &app.instance.base,
        &["snapshot", "get", "k", "--version", "1"],
    )
    .await;
    assert_eq!(to_stdout.stdout, "v1", "without --out the body is stdout");
    app.stop().await;
}

#[tokio::test]
async fn snapshot_versions_prints_the_retained_versions() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("k"), "w", TTL).await.lease.token;
    for body in ["v1", "v2"] {
        c.put_snapshot(&key("k"), t, body, &PutOptions::default())
            .await
            .unwrap();
    }
    let args = ["snapshot", "versions", "k"];
    json_golden(&app.instance.base, &args, b"", "snapshot-versions").await;
    app.stop().await;
}

#[tokio::test]
async fn snapshot_delete_prints_what_it_did() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("k"), "w", TTL).await.lease.token;
    c.put_snapshot(&key("k"), t, "v1", &PutOptions::default())
        .await
        .unwrap();
    let t = t.to_string();
    let args = ["snapshot", "delete", "k", "--token", &t];
    json_golden(&app.instance.base, &args, b"", "snapshot-delete").await;
    app.stop().await;
}

#[tokio::test]
async fn audit_rejections_prints_the_refused_writes() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let old = grant(&c, &key("k"), "w1", TTL).await.lease.token;
    c.release(&key("k"), old).await.unwrap();
    grant(&c, &key("k"), "w2", TTL).await;
    let refused = c
        .put_snapshot(&key("k"), old, "x", &PutOptions::default())
        .await;
    assert!(refused.is_err());
    let args = [
        "audit",
        "rejections",
        "--key",
        "k",
        "--reason",
        "stale_token",
        "--since",
        "1h",
    ];
    json_golden(&app.instance.base, &args, b"", "audit-rejections").await;
    app.stop().await;
}

#[tokio::test]
async fn audit_recoveries_prints_the_reconciled_records() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let first = grant(&c, &key("deploy"), "deployer-1", TTL).await;
    c.abandon(&key("deploy"), first.lease.token).await.unwrap();
    let reconciled = AcquireRequest::new(owner("deployer-2"), TTL).reconciled(true);
    c.acquire(&key("deploy"), &reconciled).await.unwrap();
    let args = ["audit", "recoveries", "--reason", "abandoned"];
    json_golden(&app.instance.base, &args, b"", "audit-recoveries").await;
    app.stop().await;
}

#[tokio::test]
async fn with_output_json_a_refused_call_prints_its_problem_on_stdout() {
    let app = TestApp::spawn().await;
    grant(&client(&app.instance.base), &key("k"), "worker-7", TTL).await;
    let args = [
        "--output", "json", "lease", "acquire", "k", "--owner", "worker-8",
    ];
    let ran = cli(&app.instance.base, &args).await;
    assert_eq!(ran.code, 10, "the exit code is the table's: {}", ran.stderr);
    let problem: Value = serde_json::from_str(&ran.stdout).expect("a problem on stdout");
    assert_eq!(problem["code"], "lease_held");
    assert_eq!(problem["status"], 409);
    assert_eq!(problem["type"], "urn:snapfence:problem:lease_held");
    assert_eq!(problem["holder"]["owner"], "worker-7");
    assert!(
        ran.stderr.contains("lease_held"),
        "and the message on stderr: {}",
        ran.stderr
    );
    app.stop().await;
}

#[tokio::test]
async fn with_output_json_a_failure_without_a_code_prints_a_problem_whose_code_is_null() {
    let base = format!("http://127.0.0.1:{}", closed_port());
    let ran = cli(&base, &["--output", "json", "lease", "show", "k"]).await;
    assert_eq!(ran.code, 13, "{}", ran.stderr);
    let problem: Value = serde_json::from_str(&ran.stdout).expect("a problem on stdout");
    assert!(problem["code"].is_null(), "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("nothing was sent"), "{detail}");
}

#[tokio::test]
async fn invalid_request_says_what_was_wrong() {
    let app = TestApp::spawn().await;
    let args = ["lease", "acquire", "k", "--owner", "w", "--ttl", "1ms"];
    error_golden(&app.instance.base, &args, 1, "invalid_request").await;
    app.stop().await;
}

/// Durations in the command line's own terms: `30s`, `1m`, never the API's `ttl_ms` or a
/// parser's "expected number at 0".
#[tokio::test]
async fn a_ttl_that_is_not_a_duration_says_how_to_write_one() {
    let app = TestApp::spawn().await;
    let args = ["lease", "acquire", "k", "--owner", "w", "--ttl", "abc"];
    error_golden(&app.instance.base, &args, 2, "usage_ttl_not_a_duration").await;
    let ran = cli(
        &app.instance.base,
        &[
            "lease",
            "renew",
            "k",
            "--token",
            "1",
            "--ttl",
            "5 minutes please",
        ],
    )
    .await;
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(ran.stderr.contains("such as 30s, 1m"), "{}", ran.stderr);
    assert!(!ran.stderr.contains("expected number"), "{}", ran.stderr);
    app.stop().await;
}

#[tokio::test]
async fn a_zero_ttl_is_refused_before_anything_is_sent_in_the_clis_terms() {
    let app = TestApp::spawn().await;
    let args = ["lease", "acquire", "k", "--owner", "w", "--ttl", "0s"];
    error_golden(&app.instance.base, &args, 2, "usage_ttl_zero").await;
    for args in [
        &["lease", "renew", "k", "--token", "1", "--ttl", "0"][..],
        &["run", "k", "--ttl", "0ms", "--", "true"][..],
    ] {
        let ran = cli(&app.instance.base, args).await;
        assert_eq!(ran.code, 2, "{args:?}: {}", ran.stderr);
        assert!(
            ran.stderr.contains("a TTL above 0: write e.g. 30s or 1m"),
            "{}",
            ran.stderr
        );
        assert!(!ran.stderr.contains("ttl_ms"), "{}", ran.stderr);
    }
    // Nothing was acquired: the key is free for another.
    grant(&client(&app.instance.base), &key("k"), "other", TTL).await;
    app.stop().await;
}

#[tokio::test]
async fn lease_held_says_who_holds_the_key_until_when() {
    let app = TestApp::spawn().await;
    grant(&client(&app.instance.base), &key("k"), "worker-7", TTL).await;
    let args = ["lease", "acquire", "k", "--owner", "worker-8"];
    error_golden(&app.instance.base, &args, 10, "lease_held").await;
    app.stop().await;
}

#[tokio::test]
async fn recovery_required_says_how_to_reconcile() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let g = grant(&c, &key("k"), "deployer-1", TTL).await;
    c.abandon(&key("k"), g.lease.token).await.unwrap();
    let args = ["lease", "acquire", "k", "--owner", "deployer-2"];
    error_golden(&app.instance.base, &args, 10, "recovery_required").await;
    app.stop().await;
}

#[tokio::test]
async fn lease_lost_says_to_stop_and_acquire_again() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let g = grant(&c, &key("k"), "w", TTL).await;
    c.release(&key("k"), g.lease.token).await.unwrap();
    let t = g.lease.token.to_string();
    let args = ["lease", "renew", "k", "--token", &t];
    error_golden(&app.instance.base, &args, 11, "lease_lost").await;
    app.stop().await;
}

#[tokio::test]
async fn stale_token_says_the_holder_was_superseded() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let old = grant(&c, &key("k"), "w1", TTL).await.lease.token;
    c.release(&key("k"), old).await.unwrap();
    grant(&c, &key("k"), "w2", TTL).await;
    let t = old.to_string();
    let args = ["snapshot", "delete", "k", "--token", &t];
    error_golden(&app.instance.base, &args, 12, "stale_token").await;
    app.stop().await;
}

#[tokio::test]
async fn unknown_token_says_to_write_with_your_own_grant() {
    let app = TestApp::spawn().await;
    let args = ["snapshot", "delete", "never-leased", "--token", "99"];
    error_golden(&app.instance.base, &args, 12, "unknown_token").await;
    app.stop().await;
}

#[tokio::test]
async fn precondition_failed_says_to_read_again() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("k"), "w", TTL).await.lease.token;
    c.put_snapshot(&key("k"), t, "v1", &PutOptions::default())
        .await
        .unwrap();
    let t = t.to_string();
    let args = [
        "snapshot",
        "delete",
        "k",
        "--token",
        &t,
        "--if-match",
        "\"stale\"",
    ];
    error_golden(&app.instance.base, &args, 1, "precondition_failed").await;
    app.stop().await;
}

#[tokio::test]
async fn not_found_says_what_is_missing() {
    let app = TestApp::spawn().await;
    error_golden(
        &app.instance.base,
        &["snapshot", "get", "none"],
        1,
        "not_found",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn payload_too_large_says_the_limit() {
    let app = TestApp::spawn_with(Rules {
        max_snapshot_bytes: 16,
        ..Rules::default()
    })
    .await;
    let t = grant(&client(&app.instance.base), &key("k"), "w", TTL)
        .await
        .lease
        .token
        .to_string();
    let big = tempfile::Builder::new()
        .prefix("sf-tmp-")
        .tempfile()
        .unwrap();
    std::fs::write(big.path(), [b'x'; 17]).unwrap();
    let file = big.path().to_str().unwrap();
    let args = ["snapshot", "put", "k", "--token", &t, "--file", file];
    let ran = cli(&app.instance.base, &args).await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    let shown = ["snapshot", "put", "k", "--token", &t, "--file", "FILE"];
    golden(
        "errors/payload_too_large.txt",
        &format!(
            "$ snapfence {}\nexit {}\n{}",
            shown.join(" "),
            ran.code,
            normalise_text(&ran.stderr, &app.instance.base)
        ),
    );
    app.stop().await;
}

#[tokio::test]
async fn unauthorized_says_to_pass_an_api_key() {
    let app = TestApp::spawn().await;
    app.make_key("ops", Scope::Admin, "").await;
    error_golden(
        &app.instance.base,
        &["lease", "show", "k"],
        1,
        "unauthorized",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn forbidden_says_what_the_key_may_not_do() {
    let app = TestApp::spawn().await;
    let reader = app.make_key("reader", Scope::Read, "").await;
    let ran = cli(
        &app.instance.base,
        &[
            "--api-key",
            &reader,
            "lease",
            "acquire",
            "k",
            "--owner",
            "w",
        ],
    )
    .await;
    assert_eq!(ran.code, 1, "{}", ran.stderr);
    golden(
        "errors/forbidden.txt",
        &format!(
            "$ snapfence --api-key KEY lease acquire k --owner w\nexit {}\n{}",
            ran.code,
            normalise_text(&ran.stderr, &app.instance.base)
        ),
    );
    app.stop().await;
}

#[tokio::test]
async fn unavailable_says_nothing_was_changed() {
    let outage = Outage::start().await;
    let args = ["lease", "acquire", "k", "--owner", "w"];
    error_golden(&outage.base, &args, 13, "unavailable").await;
    outage.stop().await;
}

#[tokio::test]
async fn no_server_says_nothing_was_sent_and_where_it_looked() {
    let base = format!("http://127.0.0.1:{}", closed_port());
    error_golden(&base, &["lease", "show", "k"], 13, "transport_refused").await;
}

#[tokio::test]
async fn a_write_whose_answers_were_all_lost_says_how_to_check_it() {
    let app = TestApp::spawn().await;
    let t = grant(&client(&app.instance.base), &key("k"), "w", TTL)
        .await
        .lease
        .token
        .to_string();
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    // More lost answers than the command makes attempts.
    proxy.next_connections(vec![Mode::DropAnswer; 16]);
    let args = ["snapshot", "delete", "k", "--token", &t];
    error_golden(&proxy.base(), &args, 13, "transport_indeterminate").await;
    app.stop().await;
}

#[tokio::test]
async fn a_write_whose_answer_was_lost_is_retried_with_its_key_and_done_once() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("k"), "w", TTL).await.lease.token;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    proxy.next_connections(vec![Mode::DropAnswer]);
    let token = t.to_string();
    let args = ["snapshot", "put", "k", "--token", &token];
    let ran = cli_with_stdin(&proxy.base(), &args, b"once").await;
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert_eq!(
        proxy.connections(),
        2,
        "the lost answer's attempt, and its retry"
    );
    let versions = c
        .list_versions(&key("k"), &Default::default())
        .await
        .unwrap();
    assert_eq!(versions.items.len(), 1, "written once");
    app.stop().await;
}

#[tokio::test]
async fn a_fenced_command_without_a_token_is_a_usage_error() {
    let app = TestApp::spawn().await;
    error_golden(
        &app.instance.base,
        &["snapshot", "put", "k"],
        2,
        "usage_token",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn run_with_a_ttl_too_short_for_its_grace_says_what_would_do() {
    let app = TestApp::spawn().await;
    let args = ["run", "k", "--ttl", "5s", "--grace", "5s", "--", "true"];
    error_golden(&app.instance.base, &args, 2, "run_ttl_too_short").await;
    app.stop().await;
}

#[tokio::test]
async fn a_token_that_is_not_a_number_is_a_usage_error_naming_the_flag() {
    let ran = cli(
        "http://127.0.0.1:1",
        &["lease", "renew", "k", "--token", "abc"],
    )
    .await;
    assert_eq!(ran.code, 2, "{}", ran.stderr);
    assert!(
        ran.stderr.contains("--token 17") && !ran.stderr.contains("header"),
        "{}",
        ran.stderr
    );
}

#[tokio::test]
async fn snapshot_list_prints_the_keys_under_the_prefix_that_have_a_snapshot() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    for k in ["jobs/1", "jobs/2", "other"] {
        let t = grant(&c, &key(k), "w", TTL).await.lease.token;
        c.put_snapshot(&key(k), t, "body", &PutOptions::default())
            .await
            .unwrap();
    }
    grant(&c, &key("jobs/3"), "w", TTL).await;
    let args = ["snapshot", "list", "--prefix", "jobs/"];
    let page = json_golden(&app.instance.base, &args, b"", "snapshot-list").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2);
    app.stop().await;
}

#[tokio::test]
async fn lease_waiters_prints_the_keys_queue_in_grant_order() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let held = grant(&c, &key("jobs/42"), "worker-7", TTL).await;
    let base = app.instance.base.clone();
    let waiting = tokio::spawn(async move {
        let args = ["lease", "acquire", "jobs/42", "--owner", "worker-8"];
        cli(&base, &[&args[..], &["--wait", "30s"]].concat()).await
    });
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while c.lease_status(&key("jobs/42")).await.unwrap().waiters != 1 {
        assert!(
            tokio::time::Instant::now() < until,
            "the CLI never waited in the queue"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let args = ["lease", "waiters", "jobs/42"];
    let page = json_golden(&app.instance.base, &args, b"", "lease-waiters").await;
    assert_eq!(page["items"][0]["owner"], "worker-8");
    c.release(&key("jobs/42"), held.lease.token).await.unwrap();
    assert_eq!(waiting.await.unwrap().code, 0);
    app.stop().await;
}
