//! API keys: scopes, prefixes, revocation, bad bearer values, and the audit principal.

use std::time::Duration;

use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use snapfence::domain::{KeyName, KeyPrefix, Scope};
use snapfence::store::keys;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::time::Instant;

use crate::harness::{Instance, TestApp, fresh_database, problem, token};

fn bearer(r: RequestBuilder, token: &str) -> RequestBuilder {
    r.header("Authorization", format!("Bearer {token}"))
}

async fn acquire_as(app: &TestApp, token: &str, key_path: &str) -> reqwest::Response {
    bearer(
        app.request(Method::POST, &format!("/v1/leases/{key_path}")),
        token,
    )
    .json(&json!({"owner": "w", "ttl_ms": 30000}))
    .send()
    .await
    .unwrap()
}

#[tokio::test]
async fn once_a_key_exists_a_request_without_one_is_refused_with_401() {
    let app = TestApp::spawn().await;
    assert_eq!(
        app.get("/v1/leases").await.status(),
        StatusCode::OK,
        "open while no key exists"
    );
    app.make_key("ops", Scope::Admin, "").await;
    let r = app.get("/v1/leases").await;
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let body = problem(r, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("snapfence keys create")
    );
    app.stop().await;
}

#[tokio::test]
async fn health_readiness_and_metrics_stay_open_when_keys_exist() {
    let app = TestApp::spawn().await;
    app.make_key("ops", Scope::Admin, "").await;
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(app.get(path).await.status(), StatusCode::OK, "{path}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_read_key_may_read_but_not_lease_or_write() {
    let app = TestApp::spawn().await;
    let writer = app.make_key("writer", Scope::Write, "").await;
    let reader = app.make_key("reader", Scope::Read, "").await;
    let g: Value = acquire_as(&app, &writer, "k").await.json().await.unwrap();
    let r = bearer(app.request(Method::GET, "/v1/leases/k"), &reader)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    problem(
        acquire_as(&app, &reader, "other").await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let put = bearer(app.request(Method::PUT, "/v1/snapshots/k"), &reader)
        .header("Fencing-Token", token(&g).to_string())
        .body("x");
    problem(
        put.send().await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    app.stop().await;
}

#[tokio::test]
async fn a_write_key_may_lease_and_write_but_only_an_admin_key_reads_the_audit_log() {
    let app = TestApp::spawn().await;
    let writer = app.make_key("writer", Scope::Write, "").await;
    let admin = app.make_key("admin", Scope::Admin, "").await;
    let g: Value = acquire_as(&app, &writer, "k").await.json().await.unwrap();
    let put = bearer(app.request(Method::PUT, "/v1/snapshots/k"), &writer)
        .header("Fencing-Token", token(&g).to_string())
        .body("x");
    assert_eq!(put.send().await.unwrap().status(), StatusCode::CREATED);
    let audit = |t: &str| bearer(app.request(Method::GET, "/v1/audit/rejections"), t).send();
    problem(
        audit(&writer).await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_eq!(audit(&admin).await.unwrap().status(), StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn a_prefixed_key_is_refused_alike_for_existing_and_missing_keys_outside_its_prefix() {
    let app = TestApp::spawn().await;
    let admin = app.make_key("admin", Scope::Admin, "").await;
    let jobs = app.make_key("jobs", Scope::Write, "jobs/").await;
    acquire_as(&app, &admin, "secret%2Fexists").await;
    assert_eq!(
        acquire_as(&app, &jobs, "jobs%2F1").await.status(),
        StatusCode::CREATED
    );
    let mut answers = Vec::new();
    for path in ["/v1/leases/secret%2Fexists", "/v1/leases/secret%2Fmissing"] {
        let r = bearer(app.request(Method::GET, path), &jobs)
            .send()
            .await
            .unwrap();
        let body = problem(r, StatusCode::FORBIDDEN, "forbidden").await;
        answers.push(body["detail"].clone());
    }
    assert_eq!(
        answers[0], answers[1],
        "a 403 says nothing about what exists"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_prefixed_key_lists_and_audits_only_within_its_prefix() {
    let app = TestApp::spawn().await;
    let jobs = app.make_key("jobs", Scope::Admin, "jobs/").await;
    let get = |path: &str| bearer(app.request(Method::GET, path), &jobs).send();
    problem(
        get("/v1/leases").await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    problem(
        get("/v1/leases?prefix=j").await.unwrap(),
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_eq!(
        get("/v1/leases?prefix=jobs%2Fa").await.unwrap().status(),
        StatusCode::OK
    );
    let audit = get("/v1/audit/rejections").await.unwrap();
    problem(audit, StatusCode::FORBIDDEN, "forbidden").await;
    let audit = get("/v1/audit/rejections?key=jobs%2F1").await.unwrap();
    assert_eq!(audit.status(), StatusCode::OK);
    app.stop().await;
}

/// `GET /v1/leases` on `instance` with `token`.
async fn list_with(app: &TestApp, instance: &Instance, token: &str) -> reqwest::Response {
    bearer(app.request_to(instance, Method::GET, "/v1/leases"), token)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_new_key_works_on_every_instance_before_they_confirm_it() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let (_, t, _) = keys::create(
        app.db(),
        &KeyName::parse("ci").unwrap(),
        Scope::Write,
        &KeyPrefix::parse("").unwrap(),
    )
    .await
    .unwrap()
    .unwrap();
    for instance in [&app.instance, &second] {
        let r = list_with(&app, instance, &t).await;
        assert_eq!(r.status(), StatusCode::OK, "at once, on {}", instance.base);
    }
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn a_revoked_key_is_refused_on_every_instance_once_revoke_returns() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    let t = app.make_key("ci", Scope::Write, "").await;
    for instance in [&app.instance, &second] {
        assert_eq!(list_with(&app, instance, &t).await.status(), StatusCode::OK);
    }
    app.revoke_key("ci").await;
    for instance in [&app.instance, &second] {
        let r = list_with(&app, instance, &t).await;
        problem(r, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn the_first_key_closes_an_open_server_on_every_instance_once_create_returns() {
    let app = TestApp::spawn().await;
    let second = app.another_instance().await;
    for instance in [&app.instance, &second] {
        let open = app.request_to(instance, Method::GET, "/v1/leases").send();
        assert_eq!(open.await.unwrap().status(), StatusCode::OK);
    }
    app.make_key("ops", Scope::Admin, "").await;
    for instance in [&app.instance, &second] {
        let r = app.request_to(instance, Method::GET, "/v1/leases").send();
        problem(r.await.unwrap(), StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    second.stop().await;
    app.stop().await;
}

#[tokio::test]
async fn an_instance_started_while_a_key_is_being_made_confirms_it_before_create_returns() {
    let app = TestApp::spawn().await;
    let confirmations = keys::Confirmations::listen(app.db()).await.unwrap();
    let second = app.another_instance().await;
    let followers = "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'snapfence-key-follower'";
    let started = Instant::now();
    while sqlx::query_scalar::<_, i64>(followers)
        .fetch_one(app.db())
        .await
        .unwrap()
        < 2
    {
        assert!(
            started.elapsed() < A_LOST_LISTENER_IS_NOTICED,
            "both follow the table"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, _, change) = keys::create(
        app.db(),
        &KeyName::parse("ops").unwrap(),
        Scope::Admin,
        &KeyPrefix::parse("").unwrap(),
    )
    .await
    .unwrap()
    .expect("a fresh name");
    let confirmed = confirmations
        .wait(change, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        confirmed.following, 2,
        "the instance started after listening counts"
    );
    assert!(confirmed.silent.is_empty(), "{confirmed:?}");
    let r = app.request_to(&second, Method::GET, "/v1/leases").send();
    problem(r.await.unwrap(), StatusCode::UNAUTHORIZED, "unauthorized").await;
    second.stop().await;
    app.stop().await;
}

/// How long an instance that lost its listening connection may take to notice and check
/// requests against the table: the connection's end reaching it. A ceiling, generous for a
/// loaded machine: it is noticed in milliseconds.
const A_LOST_LISTENER_IS_NOTICED: Duration = Duration::from_secs(30);

#[tokio::test]
async fn an_instance_whose_key_listener_was_cut_still_learns_of_a_revocation() {
    let app = TestApp::spawn().await;
    let t = app.make_key("ci", Scope::Write, "").await;
    assert_eq!(
        list_with(&app, &app.instance, &t).await.status(),
        StatusCode::OK
    );
    // The listener connects beside the first requests: on a loaded machine it may not have yet.
    let listening = Instant::now();
    let cut = loop {
        let cut: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'snapfence-key-follower'",
        )
        .fetch_all(app.db())
        .await
        .unwrap();
        if !cut.is_empty() || listening.elapsed() > A_LOST_LISTENER_IS_NOTICED {
            break cut;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(cut, [true], "the instance's listener was cut");
    // Revoked while the instance may not have heard of the cut yet: no confirmation to wait for.
    keys::revoke(app.db(), &KeyName::parse("ci").unwrap())
        .await
        .unwrap()
        .expect("a live key");
    let started = Instant::now();
    while list_with(&app, &app.instance, &t).await.status() == StatusCode::OK {
        assert!(
            started.elapsed() < A_LOST_LISTENER_IS_NOTICED,
            "the revoked key still works after {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = list_with(&app, &app.instance, &t).await;
    problem(r, StatusCode::UNAUTHORIZED, "unauthorized").await;
    app.stop().await;
}

#[tokio::test]
async fn wrong_and_malformed_bearer_values_are_refused_alike() {
    let app = TestApp::spawn().await;
    let good = app.make_key("ci", Scope::Write, "").await;
    let (id, secret) = good.strip_prefix("sf_").unwrap().split_once('_').unwrap();
    let wrong_secret = format!("sf_{id}_{}", secret.chars().rev().collect::<String>());
    let unknown_id = format!("sf_999_{secret}");
    let mut details = Vec::new();
    for value in [
        format!("Bearer {wrong_secret}"),
        format!("Bearer {unknown_id}"),
        "Bearer sf_garbage".to_string(),
        format!("Basic {good}"),
        format!("bearer{good}"),
    ] {
        let r = app
            .request(Method::GET, "/v1/leases")
            .header("Authorization", value)
            .send()
            .await
            .unwrap();
        details.push(problem(r, StatusCode::UNAUTHORIZED, "unauthorized").await["detail"].clone());
    }
    assert!(
        details.windows(2).all(|w| w[0] == w[1]),
        "one answer for every bad value"
    );
    app.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let app = TestApp::spawn().await;
    let good = app.make_key("ci", Scope::Write, "").await;
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let r = app
            .request(Method::GET, "/v1/leases")
            .header("Authorization", format!("{scheme} {good}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{scheme}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_bad_bearer_value_is_refused_even_while_no_key_exists() {
    let app = TestApp::spawn().await;
    let r = app
        .request(Method::GET, "/v1/leases")
        .header("Authorization", "Bearer nonsense")
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::UNAUTHORIZED, "unauthorized").await;
    app.stop().await;
}

#[tokio::test]
async fn the_audit_principal_is_the_name_of_the_key() {
    let app = TestApp::spawn().await;
    let admin = app.make_key("auditor", Scope::Admin, "").await;
    let worker = app.make_key("worker-7", Scope::Write, "").await;
    let r = bearer(app.request(Method::PUT, "/v1/snapshots/never"), &worker)
        .header("Fencing-Token", "5")
        .body("x");
    problem(
        r.send().await.unwrap(),
        StatusCode::CONFLICT,
        "unknown_token",
    )
    .await;
    let page: Value = bearer(app.request(Method::GET, "/v1/audit/rejections"), &admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["items"][0]["principal"], "worker-7");
    app.stop().await;
}

#[tokio::test]
async fn a_live_name_cannot_be_given_twice_but_a_revoked_one_can() {
    let app = TestApp::spawn().await;
    app.make_key("dup", Scope::Read, "").await;
    let (name, all) = (
        KeyName::parse("dup").unwrap(),
        KeyPrefix::parse("").unwrap(),
    );
    let again = keys::create(app.db(), &name, Scope::Read, &all).await;
    assert!(again.unwrap().is_none());
    app.revoke_key("dup").await;
    app.make_key("dup", Scope::Read, "").await;
    let listed = keys::list(app.db()).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed[0].revoked_at.is_some() && listed[1].revoked_at.is_none());
    app.stop().await;
}

/// Runs `snapfence keys …` against the app's database.
fn keys_cli(app: &TestApp, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .arg("keys")
        .args(args)
        .arg("--database-url")
        .arg(crate::harness::url_of(&app.options))
        .output()
        .unwrap()
}

/// `snapfence keys ARGS` against a database that is not (yet) a service's.
fn keys_cli_on(options: &PgConnectOptions, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .arg("keys")
        .args(args)
        .arg("--database-url")
        .arg(crate::harness::url_of(options))
        .output()
        .unwrap()
}

async fn has_snapfence_tables(options: &PgConnectOptions) -> bool {
    let mut conn = PgConnection::connect_with(options).await.unwrap();
    sqlx::query_scalar("SELECT to_regclass('leases') IS NOT NULL")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_list_and_revoke_refuse_a_database_that_is_not_a_services_and_change_nothing() {
    let database = fresh_database().await;
    let options = database.options();
    for args in [&["list"][..], &["revoke", "--name", "ops"]] {
        let out = tokio::task::block_in_place(|| keys_cli_on(options, args));
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("holds no snapfence database") && stderr.contains("--data-dir"),
            "{stderr}"
        );
    }
    assert!(!has_snapfence_tables(options).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_create_on_a_new_database_makes_it_and_says_so() {
    let database = fresh_database().await;
    let options = database.options();
    let out = tokio::task::block_in_place(|| {
        keys_cli_on(options, &["create", "--name", "ops", "--scope", "admin"])
    });
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("so this made one"), "{stderr}");
    assert!(
        stderr.contains("no instance is running on this database yet"),
        "{stderr}"
    );
    assert!(has_snapfence_tables(options).await);
}

#[test]
fn keys_list_refuses_a_data_directory_without_a_cluster_and_makes_none() {
    let dir = tempfile::Builder::new()
        .prefix("sf-tmp-")
        .tempdir()
        .unwrap();
    let missing = dir.path().join("snapfence-data");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_snapfence"))
        .args(["keys", "list", "--data-dir"])
        .arg(&missing)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds no snapfence database"));
    assert!(!missing.exists(), "nothing was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_command_creates_lists_and_revokes_keys_in_the_database() {
    let app = TestApp::spawn().await;
    let out = tokio::task::block_in_place(|| {
        keys_cli(&app, &["create", "--name", "ops", "--scope", "admin"])
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(String::from_utf8_lossy(&out.stderr).contains("shown this once"));
    let r = bearer(app.request(Method::GET, "/v1/audit/rejections"), &token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let out = tokio::task::block_in_place(|| keys_cli(&app, &["--output", "json", "list"]));
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed["items"][0]["name"], "ops");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains(&token[5..]),
        "secrets are never listed"
    );
    let out = tokio::task::block_in_place(|| keys_cli(&app, &["revoke", "--name", "ops"]));
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "key \"ops\" revoked: in force on every running instance (1 confirmed)\n"
    );
    let r = bearer(app.request(Method::GET, "/v1/audit/rejections"), &token)
        .send()
        .await
        .unwrap();
    problem(r, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let out = tokio::task::block_in_place(|| keys_cli(&app, &["revoke", "--name", "ops"]));
    assert!(!out.status.success(), "revoking twice is an error");
    app.stop().await;
}
