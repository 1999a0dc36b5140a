//! `/metrics`: the figures move as the instance serves.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::harness::{TestApp, token};

/// The value of one sample line (`name{labels} value`) in the metrics text, 0 when absent.
pub(crate) fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) async fn scrape(app: &TestApp) -> String {
    let r = app.get("/metrics").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
    r.text().await.unwrap()
}

#[tokio::test]
async fn lease_write_and_refusal_counters_move_as_requests_are_served() {
    let app = TestApp::spawn().await;
    let before = scrape(&app).await;
    assert_eq!(sample(&before, "snapfence_leases_granted_total"), 0.0);

    let a = token(&app.acquire("k", "a", 30000).await);
    app.acquire_with("k", json!({"owner": "b", "ttl_ms": 1000}))
        .await;
    app.put("k", a, "x").await;
    // Only now shortened to expire: the calls above find it live however loaded the machine.
    app.request(Method::POST, "/v1/leases/k/renew")
        .json(&json!({"token": a, "ttl_ms": 150}))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.acquire("k", "b", 30000).await;
    app.put("k", a, "late").await;
    app.put("never", 1, "x").await;
    app.request(Method::POST, "/v1/leases/k/renew")
        .json(&json!({"token": a}))
        .send()
        .await
        .unwrap();

    let after = scrape(&app).await;
    assert_eq!(sample(&after, "snapfence_leases_granted_total"), 2.0);
    assert_eq!(
        sample(
            &after,
            r#"snapfence_leases_conflicted_total{code="lease_held"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(&after, r#"snapfence_leases_lost_total{route="renew"}"#),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            r#"snapfence_writes_accepted_total{operation="put"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            r#"snapfence_rejections_total{reason="stale_token"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &after,
            r#"snapfence_rejections_total{reason="unknown_token"}"#
        ),
        1.0
    );
    let puts =
        r#"snapfence_http_requests_total{route="/v1/snapshots/{key}",method="PUT",status="409"}"#;
    assert_eq!(sample(&after, puts), 2.0);
    let latency =
        r#"snapfence_http_request_duration_seconds_count{route="/v1/leases/{key}",method="POST"}"#;
    assert_eq!(sample(&after, latency), 3.0);
    app.stop().await;
}

#[tokio::test]
async fn the_recovery_and_pool_gauges_are_read_at_scrape_time() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 30000).await);
    app.request(Method::POST, "/v1/leases/k/abandon")
        .header("Fencing-Token", t.to_string())
        .send()
        .await
        .unwrap();
    let text = scrape(&app).await;
    assert_eq!(sample(&text, "snapfence_recovery_records_open"), 1.0);
    assert_eq!(sample(&text, "snapfence_db_pool_max_connections"), 8.0);
    let in_use = sample(&text, r#"snapfence_db_pool_connections{state="in_use"}"#);
    let idle = sample(&text, r#"snapfence_db_pool_connections{state="idle"}"#);
    assert!(
        in_use + idle >= 1.0,
        "the pool has connections: {in_use} + {idle}"
    );
    app.stop().await;
}

#[tokio::test]
async fn requests_waiting_for_a_database_connection_are_counted() {
    let app = TestApp::spawn().await;
    let t = token(&app.acquire("k", "a", 60000).await);
    // Hold the key's row lock. An instance sends one key's requests one batch at a time, in
    // their order: the first renew's batch holds a connection and waits on the lock, and the
    // other ten renews wait for it to end.
    let mut blocker = app.db().begin().await.unwrap();
    sqlx::query("SELECT 1 FROM leases WHERE key = 'k' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let renews: Vec<_> = (0..11)
        .map(|_| {
            let r = app
                .request(Method::POST, "/v1/leases/k/renew")
                .json(&serde_json::json!({"token": t}));
            tokio::spawn(async move { r.send().await.unwrap().status() })
        })
        .collect();
    let waiting = r#"snapfence_db_pool_waiting"#;
    let in_use = r#"snapfence_db_pool_connections{state="in_use"}"#;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(4);
    let text = loop {
        let text = scrape(&app).await;
        if sample(&text, waiting) == 10.0 || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(
        sample(&text, in_use),
        1.0,
        "one batch, on one connection, waits on the lock"
    );
    assert_eq!(
        sample(&text, waiting),
        10.0,
        "11 renews of one key, one sent"
    );
    blocker.rollback().await.unwrap();
    for renew in renews {
        assert_eq!(renew.await.unwrap(), reqwest::StatusCode::OK);
    }
    assert_eq!(sample(&scrape(&app).await, waiting), 0.0);
    app.stop().await;
}

#[tokio::test]
async fn refused_writes_are_counted_by_the_api_key_that_sent_them() {
    let app = TestApp::spawn().await;
    let noisy = app
        .make_key("noisy", snapfence::domain::Scope::Write, "")
        .await;
    // A second key that sends nothing: counted apart, so not at all.
    app.make_key("quiet", snapfence::domain::Scope::Write, "")
        .await;
    let put = |key: &str, token: i64| {
        app.request(Method::PUT, &format!("/v1/snapshots/{token}"))
            .header("Authorization", format!("Bearer {key}"))
            .header("Fencing-Token", token.to_string())
            .body("x")
            .send()
    };
    for token in 1..=3 {
        assert_eq!(
            put(&noisy, token).await.unwrap().status(),
            StatusCode::CONFLICT
        );
    }
    let text = scrape(&app).await;
    let by = |who: &str| {
        sample(
            &text,
            &format!(r#"snapfence_rejections_by_principal_total{{principal="{who}"}}"#),
        )
    };
    assert_eq!((by("noisy"), by("quiet")), (3.0, 0.0), "{text}");
    app.stop().await;
}

#[tokio::test]
async fn the_audit_logs_size_is_exported() {
    let app = TestApp::spawn().await;
    for token in 1..=4 {
        app.put(&format!("never-leased-{token}"), token, "x").await;
    }
    // PostgreSQL's statistics reach the catalogue within seconds of the commits: a generous
    // ceiling on waiting for them, not a speed expectation.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = scrape(&app).await;
        let rows = sample(&text, r#"snapfence_audit_rows{log="rejections"}"#);
        let bytes = sample(&text, r#"snapfence_audit_bytes{log="rejections"}"#);
        if rows >= 4.0 {
            assert!(bytes > 0.0, "{text}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the audit rows gauge reached 4 within 60 s: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    app.stop().await;
}

#[tokio::test]
async fn the_watch_lag_is_exported_by_stage_and_settles_at_zero_once_a_stream_has_its_event() {
    let app = TestApp::spawn().await;
    let mut watch = app
        .request(Method::GET, "/v1/watch?prefix=lag%2F")
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), StatusCode::OK);
    app.acquire("lag/a", "w", 30000).await;
    let mut seen = String::new();
    while !seen.contains("lease.granted") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), watch.chunk())
            .await
            .expect("the grant is delivered")
            .unwrap()
            .expect("the stream stays open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let text = scrape(&app).await;
    for stage in ["read", "stream"] {
        let series = format!("snapfence_watch_lag_changes{{stage=\"{stage}\"}}");
        assert!(text.lines().any(|l| l.starts_with(&series)), "{text}");
        assert_eq!(sample(&text, &series), 0.0, "{series}");
    }
    drop(watch);
    app.stop().await;
}
