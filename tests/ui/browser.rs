//! The operator page in a headless Chromium against a real server that the test fills: what it
//! shows in each view, what a read-scope key may not do, and a screenshot of each view in
//! `target/ui-screenshots/` (the leases view's also in `docs/operator-page.png` when
//! `SNAPFENCE_DOCS_SCREENSHOT=1`). The tests take turns (one browser at a time on a small machine);
//! each waits for what it expects with a ceiling of [`CEILING`], never for a fixed time.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use snapfence::domain::Scope;
use tokio::sync::Mutex;

use crate::harness::{TestApp, enc, token};
use crate::webdriver::{Browser, CEILING};

/// One browser at a time: Chromium is heavy on two cores, and the tests stay independent.
static ONE_BROWSER: Mutex<()> = Mutex::const_new(());

/// The text of the lease row of `arguments[0]` once its holder is `arguments[1]`.
const LEASE_ROW: &str = "
    const [key, holder] = arguments;
    const row = [...document.querySelectorAll('#lease-table tbody tr')]
        .find((r) => r.dataset.key === key);
    return row && row.querySelector('.holder').textContent === holder ? row.innerText : null;";

/// The keys of the lease table's rows, once it has been loaded.
const LEASE_KEYS: &str = "
    if (!document.querySelector('#view-leases').dataset.loaded) return null;
    return [...document.querySelectorAll('#lease-table tbody tr')].map((r) => r.dataset.key).join(' ');";

/// The chart's refusals by reason (the sum of its bars' counts), once it has any bar.
const CHART_COUNTS: &str = "
    const counts = {};
    for (const bar of document.querySelectorAll('#chart rect.bar')) {
        counts[bar.dataset.reason] = (counts[bar.dataset.reason] || 0) + Number(bar.dataset.count);
    }
    return counts;";

/// The ids of the audit table's rows.
const AUDIT_IDS: &str = "
    return [...document.querySelectorAll('#audit-table tbody tr')].map((r) => Number(r.dataset.id));";

async fn acquire_as(app: &TestApp, api_key: &str, key: &str, body: Value) -> Value {
    let r = app
        .request(Method::POST, &format!("/v1/leases/{}", enc(key)))
        .bearer_auth(api_key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "acquire {key}");
    r.json().await.unwrap()
}

async fn put_as(app: &TestApp, api_key: &str, key: &str, token: i64) -> reqwest::Response {
    app.request(Method::PUT, &format!("/v1/snapshots/{}", enc(key)))
        .bearer_auth(api_key)
        .header("Fencing-Token", token.to_string())
        .body("late")
        .send()
        .await
        .unwrap()
}

/// Waits until the API, asked with `api_key` if given, says `key` is in `state` (an expiry is
/// the database clock's to decide).
async fn api_state_is(app: &TestApp, api_key: Option<&str>, key: &str, state: &str) {
    let deadline = Instant::now() + CEILING;
    loop {
        let mut request = app.request(Method::GET, &format!("/v1/leases/{}", enc(key)));
        if let Some(api_key) = api_key {
            request = request.bearer_auth(api_key);
        }
        let status: Value = request.send().await.unwrap().json().await.unwrap();
        if status["state"] == state {
            return;
        }
        assert!(Instant::now() < deadline, "{key} is not {state}: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The operator page as the README shows it: the leases view with a key in every state.
const DOCS_SCREENSHOT: &str = "docs/operator-page.png";

/// With `SNAPFENCE_DOCS_SCREENSHOT=1`, copies `shot` to [`DOCS_SCREENSHOT`], so that the README's
/// picture is the page as it is: `SNAPFENCE_DOCS_SCREENSHOT=1 cargo test --locked --test ui
/// a_lease_made_by_the_test`.
fn keep_for_the_docs(shot: &Path) {
    if std::env::var_os("SNAPFENCE_DOCS_SCREENSHOT").is_some_and(|v| v == "1") {
        let to = Path::new(env!("CARGO_MANIFEST_DIR")).join(DOCS_SCREENSHOT);
        std::fs::copy(shot, &to)
            .unwrap_or_else(|e| panic!("copying {} to {}: {e}", shot.display(), to.display()));
    }
}

fn ui(app: &TestApp, view: &str) -> String {
    format!("{}/ui#{view}", app.instance.base)
}

#[tokio::test]
async fn a_lease_made_by_the_test_appears_with_its_holder_token_metadata_and_a_live_countdown() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    // Keys in every state, as an operator finds them.
    let grant = app
        .acquire_with(
            "jobs/7",
            json!({"owner": "worker-7", "ttl_ms": 600_000,
                   "metadata": {"pid": 4242, "host": "build-3", "target": "nightly"}}),
        )
        .await
        .json::<Value>()
        .await
        .unwrap();
    app.acquire_with(
        "jobs/8",
        json!({"owner": "worker-8", "ttl_ms": 90_000, "metadata": {"pid": 17}}),
    )
    .await;
    let done = app.acquire("jobs/6", "worker-6", 60_000).await;
    app.release("jobs/6", token(&done)).await;
    app.acquire_with(
        "reports/daily",
        json!({"owner": "cron-1", "ttl_ms": 3_600_000, "metadata": {"schedule": "0 3 * * *"}}),
    )
    .await;
    app.acquire_with(
        "jobs/9",
        json!({"owner": "worker-9", "ttl_ms": 100, "crash_recovery": true,
               "metadata": {"pid": 99, "step": "upload"}}),
    )
    .await;
    api_state_is(&app, None, "jobs/9", "recovery_pending").await;

    browser.goto(&ui(&app, "leases")).await;
    let row = browser
        .wait_for(
            "jobs/7 is listed with its holder",
            LEASE_ROW,
            json!(["jobs/7", "worker-7"]),
        )
        .await;
    let row = row.as_str().unwrap();
    assert!(row.contains("held"), "{row}");
    assert!(
        row.contains(&token(&grant).to_string()),
        "the token in {row}"
    );
    assert!(
        row.contains("\"host\":\"build-3\""),
        "the metadata in {row}"
    );
    // On loopback with no API key configured the page, like the API, needs no key.
    assert_eq!(
        browser
            .eval("return document.body.dataset.access;", json!([]))
            .await,
        "admin"
    );
    let countdown = "
        const [key, before] = arguments;
        const cell = document.querySelector(`#lease-table tr[data-key=\"${key}\"] .countdown`);
        const text = cell && cell.textContent;
        return text && text.startsWith('in ') && text !== before ? text : null;";
    let first = browser
        .wait_for("a countdown to expiry", countdown, json!(["jobs/7", ""]))
        .await;
    browser
        .wait_for(
            "the countdown moves between two reads",
            countdown,
            json!(["jobs/7", first]),
        )
        .await;
    assert_eq!(
        browser
            .wait_for("every key listed", LEASE_KEYS, json!([]))
            .await,
        "jobs/6 jobs/7 jobs/8 jobs/9 reports/daily"
    );
    let shot = browser.screenshot("leases").await;
    keep_for_the_docs(&shot);

    // Filters: by prefix, then also by state.
    browser
        .type_into("#lease-filter input[name=\"prefix\"]", "jobs/")
        .await;
    browser.click("#lease-filter button[type=\"submit\"]").await;
    let only = "
        const want = arguments[0];
        const keys = [...document.querySelectorAll('#lease-table tbody tr')].map((r) => r.dataset.key).join(' ');
        return keys === want ? keys : null;";
    browser
        .wait_for(
            "only the keys under jobs/",
            only,
            json!(["jobs/6 jobs/7 jobs/8 jobs/9"]),
        )
        .await;
    browser
        .select("#lease-filter select[name=\"state\"]", "held")
        .await;
    browser
        .wait_for(
            "only the held keys under jobs/",
            only,
            json!(["jobs/7 jobs/8"]),
        )
        .await;
    browser
        .select("#lease-filter select[name=\"state\"]", "recovery_pending")
        .await;
    browser
        .wait_for("only the key waiting for recovery", only, json!(["jobs/9"]))
        .await;
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn a_stale_write_appears_in_the_audit_table_and_as_a_bar_of_the_chart_at_its_time() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    // worker-a gives its lease up, worker-b takes the key, and worker-a writes late.
    let a = app.acquire("jobs/42", "worker-a", 60_000).await;
    app.release("jobs/42", token(&a)).await;
    app.acquire("jobs/42", "worker-b", 60_000).await;
    let r = app.put("jobs/42", token(&a), "late").await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let refusal: Value = r.json().await.unwrap();
    assert_eq!(refusal["code"], "stale_token");
    let audit_id = refusal["audit_id"].as_i64().unwrap();
    // And a token never issued, on another key.
    let c = app.acquire("reports/daily", "cron-1", 60_000).await;
    let r = app.put("reports/daily", token(&c) + 100, "x").await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let logged: Value = app
        .get("/v1/audit/rejections?key=jobs%2F42")
        .await
        .json()
        .await
        .unwrap();
    let at = logged["items"][0]["at"].as_str().unwrap().to_string();

    browser.goto(&ui(&app, "refused")).await;
    let row = browser
        .wait_for(
            "the stale write is a row of the audit table",
            "const row = document.querySelector(`#audit-table tr[data-id=\"${arguments[0]}\"]`);
             return row ? row.innerText : null;",
            json!([audit_id]),
        )
        .await;
    let row = row.as_str().unwrap();
    for shown in [
        "jobs/42",
        "stale_token",
        "worker-b",
        "put",
        &token(&a).to_string(),
    ] {
        assert!(row.contains(shown), "{shown} in {row}");
    }
    let counts = browser
        .wait_for(
            "the chart draws both refusals",
            &format!(
                "{CHART_COUNTS} return counts.stale_token && counts.unknown_token ? counts : null;"
            ),
            json!([]),
        )
        .await;
    assert_eq!(counts, json!({"stale_token": 1, "unknown_token": 1}));
    // The stale write's bar covers the time the audit log gives it.
    let start = browser
        .eval(
            "return document.querySelector('#chart rect.bar[data-reason=\"stale_token\"]').dataset.start;",
            json!([]),
        )
        .await;
    let start = chrono::DateTime::parse_from_rfc3339(start.as_str().unwrap()).unwrap();
    let at = chrono::DateTime::parse_from_rfc3339(&at).unwrap();
    assert!(
        start <= at && at < start + chrono::Duration::minutes(1),
        "the bar of {start} holds the refusal at {at}"
    );
    browser.screenshot("refused").await;

    // The chart by key prefix: only jobs/, then nothing.
    browser
        .type_into("#chart-filter input[name=\"prefix\"]", "jobs/")
        .await;
    browser
        .wait_for(
            "only the refusal under jobs/ is drawn",
            &format!("{CHART_COUNTS} return counts.stale_token === 1 && !counts.unknown_token;"),
            json!([]),
        )
        .await;
    browser
        .type_into("#chart-filter input[name=\"prefix\"]", "nothing/")
        .await;
    browser
        .wait_for(
            "no bar for a prefix without refusals",
            "return document.querySelectorAll('#chart rect.bar').length === 0;",
            json!([]),
        )
        .await;
    // The table by the audit API's own filters.
    browser
        .select("#audit-filter select[name=\"reason\"]", "unknown_token")
        .await;
    browser.click("#audit-filter button[type=\"submit\"]").await;
    browser
        .wait_for(
            "only the unknown token is listed",
            "const rows = [...document.querySelectorAll('#audit-table tbody tr')];
             return rows.length === 1 && rows[0].dataset.key === 'reports/daily';",
            json!([]),
        )
        .await;
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn the_audit_table_pages_by_next_cursor_and_the_chart_selects_a_principal() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    let admin = app.make_key("ops", Scope::Admin, "").await;
    let writer_a = app.make_key("writer-a", Scope::Write, "").await;
    let writer_b = app.make_key("writer-b", Scope::Write, "").await;
    let old = acquire_as(
        &app,
        &writer_a,
        "jobs/1",
        json!({"owner": "a", "ttl_ms": 100}),
    )
    .await;
    api_state_is(&app, Some(&admin), "jobs/1", "expired").await;
    acquire_as(
        &app,
        &writer_b,
        "jobs/1",
        json!({"owner": "b", "ttl_ms": 60_000}),
    )
    .await;
    for (writer, n) in [(&writer_a, 20), (&writer_b, 10)] {
        for _ in 0..n {
            let r = put_as(&app, writer, "jobs/1", token(&old)).await;
            assert_eq!(r.status(), StatusCode::CONFLICT);
        }
    }

    browser.goto(&ui(&app, "refused")).await;
    browser.type_into("#api-key", &admin).await;
    browser.click("#key-form button[type=\"submit\"]").await;
    // The audit's filters show once the page knows the key is an admin's.
    browser
        .wait_for(
            "the admin's page",
            "return document.body.dataset.access === 'admin' && !document.querySelector('#audit-filter').closest('[hidden]') ? true : null;",
            json!([]),
        )
        .await;
    browser
        .select("#audit-filter select[name=\"limit\"]", "25")
        .await;
    browser.click("#audit-filter button[type=\"submit\"]").await;
    let first = browser
        .wait_for(
            "a first page of 25",
            &format!(
                "const ids = (() => {{ {AUDIT_IDS} }})(); return ids.length === 25 ? ids : null;"
            ),
            json!([]),
        )
        .await;
    let first: Vec<i64> = serde_json::from_value(first).unwrap();
    browser
        .click(".pager[data-for=\"refused\"] [data-page=\"next\"]")
        .await;
    let second = browser
        .wait_for(
            "an older page of 5",
            &format!(
                "const ids = (() => {{ {AUDIT_IDS} }})(); return ids.length === 5 ? ids : null;"
            ),
            json!([]),
        )
        .await;
    let second: Vec<i64> = serde_json::from_value(second).unwrap();
    let oldest_first = first.iter().min().unwrap();
    assert!(
        second.iter().all(|id| id < oldest_first),
        "the older page {second:?} comes after {first:?}"
    );
    assert_eq!(
        browser
            .eval(
                "return document.querySelector('.pager[data-for=\"refused\"] [data-page=\"next\"]').disabled;",
                json!([])
            )
            .await,
        true,
        "no page after the last"
    );

    // The chart by principal: the names of the keys that wrote.
    browser
        .wait_for(
            "both writers are principals to choose from",
            "return document.querySelectorAll('#chart-filter select[name=\"principal\"] option[value^=\"writer-\"]').length === 2;",
            json!([]),
        )
        .await;
    for (name, n) in [("writer-a", 20), ("writer-b", 10)] {
        browser
            .select("#chart-filter select[name=\"principal\"]", name)
            .await;
        browser
            .wait_for(
                &format!("the chart counts {n} refusals of {name}"),
                &format!("{CHART_COUNTS} return counts.stale_token === arguments[0];"),
                json!([n]),
            )
            .await;
    }
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn a_read_scope_key_sees_no_admin_actions_and_an_admin_key_may_abandon() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    let admin = app.make_key("ops", Scope::Admin, "").await;
    let reader = app.make_key("viewer", Scope::Read, "").await;
    let writer = app.make_key("worker", Scope::Write, "").await;
    acquire_as(
        &app,
        &writer,
        "jobs/7",
        json!({"owner": "worker-7", "ttl_ms": 600_000, "metadata": {"pid": 4242}}),
    )
    .await;

    // Without a key the page loads and says that the API wants one.
    browser.goto(&ui(&app, "leases")).await;
    browser
        .wait_for(
            "the page asks for a key",
            "return document.body.dataset.access === 'none' && !document.querySelector('#view-leases .error').hidden;",
            json!([]),
        )
        .await;

    browser.type_into("#api-key", &reader).await;
    browser.click("#key-form button[type=\"submit\"]").await;
    browser
        .wait_for(
            "the lease, read with the read key",
            LEASE_ROW,
            json!(["jobs/7", "worker-7"]),
        )
        .await;
    assert_eq!(
        browser
            .eval("return document.body.dataset.access;", json!([]))
            .await,
        "reader"
    );
    let visible_actions = "
        const visible = (el) => el.offsetParent !== null;
        return [...document.querySelectorAll('[data-action], .admin-only, .admin-data')].filter(visible).length;";
    assert_eq!(
        browser.eval(visible_actions, json!([])).await,
        0,
        "no admin action for a read key"
    );
    assert_eq!(
        browser
            .eval(
                "return document.querySelectorAll('[data-action]').length;",
                json!([])
            )
            .await,
        0
    );
    browser.screenshot("read-only").await;
    // The refused writes are the audit log's: an admin key's alone.
    browser.click(".tabs a[data-view=\"refused\"]").await;
    browser
        .wait_for(
            "the refused writes say they need an admin key",
            "const n = document.querySelector('.needs-admin');
             return !n.hidden && n.textContent.includes('admin') && document.querySelector('#chart-card').hidden;",
            json!([]),
        )
        .await;
    assert_eq!(browser.eval(visible_actions, json!([])).await, 0);
    // The key is in the session's storage and nowhere in the address.
    assert!(!browser.url().await.contains(&reader));
    assert_eq!(
        browser
            .eval(
                "return sessionStorage.getItem('snapfence.apiKey');",
                json!([])
            )
            .await,
        reader.as_str()
    );
    assert_eq!(
        browser
            .eval(
                "return document.querySelector('#api-key').value;",
                json!([])
            )
            .await,
        "",
        "the key is not left in the input"
    );

    // An admin key sees the action, which asks before it abandons.
    browser.click(".tabs a[data-view=\"leases\"]").await;
    browser.click("#forget-key").await;
    browser.type_into("#api-key", &admin).await;
    browser.click("#key-form button[type=\"submit\"]").await;
    browser
        .click("#lease-table tr[data-key=\"jobs/7\"] [data-action=\"abandon\"]")
        .await;
    browser
        .click("#lease-table tr[data-key=\"jobs/7\"] [data-action=\"confirm-abandon\"]")
        .await;
    api_state_is(&app, Some(&admin), "jobs/7", "recovery_pending").await;
    browser
        .wait_for(
            "the abandoned lease waits for recovery",
            "const row = document.querySelector('#lease-table tr[data-key=\"jobs/7\"]');
             return row && row.dataset.state === 'recovery_pending' && !document.querySelector('#recovery-count').hidden;",
            json!([]),
        )
        .await;
    let status: Value = app
        .request(Method::GET, "/v1/leases/jobs%2F7")
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["recovery"]["reason"], "abandoned");
    assert_eq!(status["recovery"]["owner"], "worker-7");
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn recovery_records_pending_show_the_previous_holders_metadata() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    app.acquire_with(
        "jobs/9",
        json!({"owner": "worker-9", "ttl_ms": 100, "crash_recovery": true,
               "metadata": {"pid": 99, "step": "upload", "worktree": "/srv/w/9"}}),
    )
    .await;
    let held = app
        .acquire_with(
            "deploy/web",
            json!({"owner": "deployer", "ttl_ms": 60_000, "metadata": {"release": "v2.4.1"}}),
        )
        .await
        .json::<Value>()
        .await
        .unwrap();
    let r = app
        .request(Method::POST, "/v1/leases/deploy%2Fweb/abandon")
        .header("Fencing-Token", token(&held).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    app.acquire("jobs/10", "worker-10", 60_000).await;
    api_state_is(&app, None, "jobs/9", "recovery_pending").await;

    browser.goto(&ui(&app, "recovery")).await;
    let rows = browser
        .wait_for(
            "both records are listed",
            "const rows = [...document.querySelectorAll('#recovery-table tbody tr')];
             return rows.length === 2 ? rows.map((r) => [r.dataset.key, r.innerText]) : null;",
            json!([]),
        )
        .await;
    let rows: Vec<(String, String)> = serde_json::from_value(rows).unwrap();
    assert_eq!(rows[0].0, "deploy/web");
    for shown in ["abandoned", "deployer", "\"release\": \"v2.4.1\""] {
        assert!(rows[0].1.contains(shown), "{shown} in {}", rows[0].1);
    }
    assert_eq!(rows[1].0, "jobs/9");
    for shown in ["expired", "worker-9", "\"worktree\": \"/srv/w/9\""] {
        assert!(rows[1].1.contains(shown), "{shown} in {}", rows[1].1);
    }
    browser
        .wait_for(
            "the tab counts the two records",
            "return document.querySelector('#recovery-count').textContent === '2';",
            json!([]),
        )
        .await;
    browser.screenshot("recovery").await;
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn a_keys_snapshot_versions_are_listed_and_each_downloads_as_stored() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    let grant = app.acquire("jobs/7", "worker-7", 60_000).await;
    let t = token(&grant);
    let mut written = Vec::new();
    for body in [
        "first body\n",
        "{\"step\": 2, \"done\": false}",
        "{\"step\": 3, \"done\": true}",
    ] {
        let r = app
            .request(Method::PUT, "/v1/snapshots/jobs%2F7")
            .header("Fencing-Token", t.to_string())
            .header(
                "Content-Type",
                if body.starts_with('{') {
                    "application/json"
                } else {
                    "text/plain"
                },
            )
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        written.push(r.json::<Value>().await.unwrap());
    }

    browser.goto(&ui(&app, "snapshots")).await;
    browser
        .type_into("#snapshot-form input[name=\"key\"]", "jobs/7")
        .await;
    browser
        .click("#snapshot-form button[type=\"submit\"]")
        .await;
    let rows = browser
        .wait_for(
            "the three versions, newest first",
            "const rows = [...document.querySelectorAll('#version-table tbody tr')];
             return rows.length === 3 ? rows.map((r) => [r.dataset.version, r.innerText, r.cells[3].title]) : null;",
            json!([]),
        )
        .await;
    let rows: Vec<(String, String, String)> = serde_json::from_value(rows).unwrap();
    for ((version, text, etag), meta) in rows.iter().zip(written.iter().rev()) {
        assert_eq!(version, &meta["version"].to_string());
        assert_eq!(etag, meta["etag"].as_str().unwrap(), "the full ETag");
        for shown in [
            format!("{} B", meta["size"]),
            t.to_string(),
            meta["content_type"].as_str().unwrap().to_string(),
        ] {
            assert!(text.contains(&shown), "{shown} in {text}");
        }
    }
    assert!(browser.url().await.ends_with("#snapshots/jobs%2F7"));
    browser.screenshot("snapshots").await;

    // The oldest version downloads, fetched with the page's key, as it was stored.
    browser
        .click("#version-table tr[data-version=\"1\"] [data-action=\"download\"]")
        .await;
    let file = browser.downloads().join("jobs_7.v1.txt");
    let deadline = Instant::now() + CEILING;
    while !file.exists() {
        assert!(
            Instant::now() < deadline,
            "no download in {}: {:?}",
            browser.downloads().display(),
            std::fs::read_dir(browser.downloads())
                .unwrap()
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "first body\n");
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

/// Whether every column of the visible `table` (`arguments[0]`) fits its card, so that none is
/// cut off or needs a sideways scroll: the overflow in pixels, 0 when it fits.
const OVERFLOW: &str = "
    const table = document.querySelector(arguments[0]);
    const scroll = table.closest('.scroll');
    const last = table.querySelector('thead th:last-child').getBoundingClientRect();
    const box = scroll.getBoundingClientRect();
    return Math.max(0, scroll.scrollWidth - scroll.clientWidth, Math.ceil(last.right - box.right));";

/// A waiting acquire of `key` by `owner` (for a minute), in a task of its own.
fn wait_for_lease(app: &TestApp, key: &str, owner: &str) -> tokio::task::JoinHandle<StatusCode> {
    let waiting = app
        .request(Method::POST, &format!("/v1/leases/{}", enc(key)))
        .json(&json!({"owner": owner, "ttl_ms": 60_000, "wait_ms": 60_000}));
    tokio::spawn(async move { waiting.send().await.unwrap().status() })
}

/// Waits until `n` acquires wait for `key`, as its status counts them.
async fn until_waiting(app: &TestApp, key: &str, n: i64) {
    let deadline = Instant::now() + CEILING;
    loop {
        let status: Value = app
            .get(&format!("/v1/leases/{}", enc(key)))
            .await
            .json()
            .await
            .unwrap();
        if status["waiters"] == n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} never waited for {key}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The text of the Waiting cell of the lease row of `arguments[0]`, once it names a waiter.
const WAITING_CELL: &str = "
    const row = [...document.querySelectorAll('#lease-table tbody tr')]
        .find((r) => r.dataset.key === arguments[0]);
    const cell = row && row.querySelector('td.waiters');
    return cell && cell.querySelector('.queue') ? cell.innerText : null;";

/// The footer's state and text once it says the view was read.
const FOOTER_UPDATED: &str = "
    const el = document.querySelector('#updated');
    return el.dataset.state === 'updated' ? el.textContent : null;";

#[tokio::test]
async fn at_800_px_every_lease_column_fits_and_the_footer_says_when_the_data_was_read() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    app.acquire_with(
        "jobs/long-running-nightly-build-of-the-main-branch",
        json!({"owner": "worker-7@build-host-3.example", "ttl_ms": 600_000,
               "metadata": {"pid": 4242, "host": "build-3", "target": "nightly",
                            "command": "make release ARCH=x86_64 PROFILE=lto"}}),
    )
    .await;
    app.acquire_with(
        "jobs/8",
        json!({"owner": "worker-8", "ttl_ms": 90_000, "metadata": {"pid": 17}}),
    )
    .await;
    // The Waiting column with a queue in it fits too.
    let waiters = [
        wait_for_lease(
            &app,
            "jobs/long-running-nightly-build-of-the-main-branch",
            "worker-9@build-host-4.example",
        ),
        wait_for_lease(
            &app,
            "jobs/long-running-nightly-build-of-the-main-branch",
            "worker-10@build-host-5.example",
        ),
    ];
    until_waiting(
        &app,
        "jobs/long-running-nightly-build-of-the-main-branch",
        2,
    )
    .await;

    browser.resize(800, 860).await;
    browser.goto(&ui(&app, "leases")).await;
    assert_eq!(
        browser
            .wait_for("both keys listed", LEASE_KEYS, json!([]))
            .await,
        "jobs/8 jobs/long-running-nightly-build-of-the-main-branch"
    );
    let footer = browser
        .wait_for("the footer says when", FOOTER_UPDATED, json!([]))
        .await;
    assert!(
        footer.as_str().unwrap().starts_with("updated ")
            && footer.as_str().unwrap().ends_with(" UTC"),
        "{footer}"
    );
    assert_eq!(
        browser
            .eval("return window.innerWidth <= 800;", json!([]))
            .await,
        true,
        "the window is 800 px wide"
    );
    let overflow = browser.eval(OVERFLOW, json!(["#lease-table"])).await;
    assert_eq!(
        overflow, 0,
        "Metadata and Actions fit at 800 px ({overflow} px over)"
    );
    let actions = browser
        .eval(
            "const b = document.querySelector('#lease-table tbody tr [data-action]');
             if (!b) return null;
             const r = b.getBoundingClientRect();
             return r.right <= window.innerWidth && r.width > 0;",
            json!([]),
        )
        .await;
    assert_eq!(actions, true, "an action button is on screen");
    let queue = browser
        .wait_for(
            "the queue is shown",
            WAITING_CELL,
            json!(["jobs/long-running-nightly-build-of-the-main-branch"]),
        )
        .await;
    assert!(
        queue.as_str().unwrap().starts_with('2'),
        "two waiting: {queue}"
    );
    browser.screenshot("leases-800px").await;
    waiters.iter().for_each(tokio::task::JoinHandle::abort);

    // The server goes away: the footer says the data on screen is from the last good read.
    let read = footer
        .as_str()
        .unwrap()
        .trim_start_matches("updated ")
        .to_owned();
    app.stop().await;
    let failed = browser
        .wait_for(
            "the footer says the refresh failed",
            "const el = document.querySelector('#updated');
             return el.dataset.state === 'failed' ? el.textContent : null;",
            json!([]),
        )
        .await;
    let failed = failed.as_str().unwrap();
    assert!(failed.starts_with("could not refresh at "), "{failed}");
    assert!(
        failed.contains("showing what was read at "),
        "{failed} (first read {read})"
    );
    browser.close().await;
}

/// The change stream's mode in the footer (`live`, `polling`), once it is `arguments[0]`.
const WATCH_MODE: &str = "
    const el = document.querySelector('#mode');
    return el.dataset.mode === arguments[0] ? el.textContent : null;";

#[tokio::test]
async fn changes_reach_the_page_from_the_watch_stream_without_polling() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    browser.goto(&ui(&app, "leases")).await;
    browser
        .wait_for(
            "the page follows the change stream",
            WATCH_MODE,
            json!(["live"]),
        )
        .await;
    assert_eq!(
        browser
            .wait_for("the empty table", LEASE_KEYS, json!([]))
            .await,
        ""
    );

    let grant = app
        .acquire_with(
            "jobs/7",
            json!({"owner": "worker-7", "ttl_ms": 600_000, "metadata": {"pid": 4242}}),
        )
        .await
        .json::<Value>()
        .await
        .unwrap();
    browser
        .wait_for(
            "the grant appears",
            LEASE_ROW,
            json!(["jobs/7", "worker-7"]),
        )
        .await;
    app.release("jobs/7", token(&grant)).await;
    browser
        .wait_for(
            "the release appears",
            "const row = document.querySelector('#lease-table tr[data-key=\"jobs/7\"]');
             return row && row.dataset.state === 'released' ? true : null;",
            json!([]),
        )
        .await;
    let (events, polls) = (
        browser
            .eval(
                "return document.body.dataset.watchEvents || '0';",
                json!([]),
            )
            .await,
        browser
            .eval("return document.body.dataset.polls || '0';", json!([]))
            .await,
    );
    assert!(
        events.as_str().unwrap().parse::<u32>().unwrap() >= 2,
        "the grant and the release came as changes: {events}"
    );
    assert_eq!(polls, "0", "no polling while the stream is live");
    browser.screenshot("leases-live").await;
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn a_key_that_may_not_watch_everything_falls_back_to_polling() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    // Confined to jobs/: the stream of the whole service is refused (403), the lease list under
    // jobs/ is not.
    let reader = app.make_key("viewer", Scope::Read, "jobs/").await;
    let writer = app.make_key("worker", Scope::Write, "jobs/").await;

    browser.goto(&ui(&app, "leases")).await;
    browser.type_into("#api-key", &reader).await;
    browser.click("#key-form button[type=\"submit\"]").await;
    browser
        .type_into("#lease-filter input[name=\"prefix\"]", "jobs/")
        .await;
    browser.click("#lease-filter button[type=\"submit\"]").await;
    let mode = browser
        .wait_for(
            "the page falls back to polling",
            WATCH_MODE,
            json!(["polling"]),
        )
        .await;
    assert!(
        mode.as_str().unwrap().contains("refreshes every 5 s"),
        "{mode}"
    );

    acquire_as(
        &app,
        &writer,
        "jobs/8",
        json!({"owner": "worker-8", "ttl_ms": 600_000}),
    )
    .await;
    browser
        .wait_for(
            "the grant appears by polling",
            LEASE_ROW,
            json!(["jobs/8", "worker-8"]),
        )
        .await;
    let polls = browser
        .eval(
            "return Number(document.body.dataset.polls || '0');",
            json!([]),
        )
        .await;
    assert!(polls.as_i64().unwrap() >= 1, "it polled: {polls}");
    browser.screenshot("leases-polling").await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn an_admin_reconciles_a_recovery_record_after_a_confirmation_and_a_reader_cannot() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    let admin = app.make_key("ops", Scope::Admin, "").await;
    let reader = app.make_key("viewer", Scope::Read, "").await;
    let writer = app.make_key("worker", Scope::Write, "").await;
    let held = acquire_as(
        &app,
        &writer,
        "deploy/web",
        json!({"owner": "deployer", "ttl_ms": 60_000, "metadata": {"release": "v2.4.1"}}),
    )
    .await;
    let r = app
        .request(Method::POST, "/v1/leases/deploy%2Fweb/abandon")
        .bearer_auth(&writer)
        .header("Fencing-Token", token(&held).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    api_state_is(&app, Some(&admin), "deploy/web", "recovery_pending").await;
    let listed = "
        const row = document.querySelector('#recovery-table tr[data-key=\"deploy/web\"]');
        return row ? row.innerText : null;";

    // A reader sees the record, and no way to reconcile it.
    browser.goto(&ui(&app, "recovery")).await;
    browser.type_into("#api-key", &reader).await;
    browser.click("#key-form button[type=\"submit\"]").await;
    browser
        .wait_for(
            "the reader's page",
            "return document.body.dataset.access === 'reader' ? true : null;",
            json!([]),
        )
        .await;
    browser
        .wait_for("the record is listed", listed, json!([]))
        .await;
    assert_eq!(
        browser
            .eval(
                "return document.querySelectorAll('#recovery-table [data-action]').length;",
                json!([]),
            )
            .await,
        0
    );

    // An admin asks, is asked to confirm, may cancel, then confirms.
    browser.type_into("#api-key", &admin).await;
    browser.click("#key-form button[type=\"submit\"]").await;
    browser
        .click("#recovery-table tr[data-key=\"deploy/web\"] [data-action=\"reconcile\"]")
        .await;
    let question = browser
        .wait_for(
            "a confirmation",
            "const c = document.querySelector('#recovery-table .confirm');
             return c ? c.innerText : null;",
            json!([]),
        )
        .await;
    assert!(
        question
            .as_str()
            .unwrap()
            .contains("Has what deployer left been dealt with?"),
        "{question}"
    );
    api_state_is(&app, Some(&admin), "deploy/web", "recovery_pending").await;
    browser.screenshot("recovery-reconcile-confirm").await;
    browser
        .click("#recovery-table tr[data-key=\"deploy/web\"] [data-action=\"confirm-reconcile\"]")
        .await;
    browser
        .wait_for(
            "the record leaves the list",
            "return document.querySelector('#recovery-table tr[data-key=\"deploy/web\"]') ? null : true;",
            json!([]),
        )
        .await;
    let banner = browser
        .eval(
            "return document.querySelector('#banner').textContent;",
            json!([]),
        )
        .await;
    assert!(
        banner
            .as_str()
            .unwrap()
            .starts_with("Reconciled deploy/web"),
        "{banner}"
    );
    api_state_is(&app, Some(&admin), "deploy/web", "released").await;
    // The record went to the audit log, reconciled by the page.
    let audit: Value = app
        .request(Method::GET, "/v1/audit/recoveries?key=deploy%2Fweb")
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let entry = &audit["items"][0];
    assert_eq!(entry["recovery"]["owner"], "deployer", "{audit}");
    assert_eq!(entry["principal"], "ops", "the admin's key: {audit}");
    assert_eq!(entry["reconciled_by"], "operator page", "{audit}");
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn the_keys_under_a_prefix_that_hold_a_snapshot_are_listed_and_lead_to_their_versions() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    for (key, bodies) in [
        ("jobs/1", &["one"][..]),
        ("jobs/2", &["two", "two, again"][..]),
        ("jobs/3", &[][..]), // a lease, never a snapshot
        ("reports/daily", &["report"][..]),
    ] {
        let grant = app.acquire(key, "writer", 60_000).await;
        for body in bodies {
            let r = app.put(key, token(&grant), body.to_string()).await;
            assert!(r.status().is_success(), "put {key}");
        }
    }

    browser.goto(&ui(&app, "snapshots")).await;
    browser
        .type_into("#snapshot-keys-form input[name=\"prefix\"]", "jobs/")
        .await;
    browser
        .click("#snapshot-keys-form button[type=\"submit\"]")
        .await;
    let rows = browser
        .wait_for(
            "the keys under jobs/ with a snapshot",
            "if (!document.querySelector('#snapshot-keys-card').dataset.loaded) return null;
             return [...document.querySelectorAll('#snapshot-keys-table tbody tr')]
                 .map((r) => [...r.cells].map((c) => c.innerText));",
            json!([]),
        )
        .await;
    let rows: Vec<Vec<String>> = serde_json::from_value(rows).unwrap();
    let keys: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(keys, ["jobs/1", "jobs/2"], "{rows:?}");
    assert_eq!(rows[1][1], "2", "jobs/2's current version: {rows:?}");
    assert_eq!(rows[1][2], "10 B", "its size: {rows:?}");
    browser.screenshot("snapshot-keys").await;

    browser
        .click("#snapshot-keys-table tr[data-key=\"jobs/2\"] a")
        .await;
    browser
        .wait_for(
            "jobs/2's versions",
            "return document.querySelectorAll('#version-table tbody tr').length === 2 ? true : null;",
            json!([]),
        )
        .await;
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn a_held_keys_waiting_acquires_appear_in_grant_order_and_move_up_when_it_is_released() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    let holder = app
        .acquire_with(
            "jobs/build",
            json!({"owner": "worker-7", "ttl_ms": 600_000}),
        )
        .await
        .json::<Value>()
        .await
        .unwrap();
    browser.goto(&ui(&app, "leases")).await;
    browser
        .wait_for(
            "the page follows the change stream",
            WATCH_MODE,
            json!(["live"]),
        )
        .await;
    browser
        .wait_for("the holder", LEASE_ROW, json!(["jobs/build", "worker-7"]))
        .await;

    // Queued one after the other, so the queue's order is known; no change event announces them.
    let first = wait_for_lease(&app, "jobs/build", "worker-8");
    until_waiting(&app, "jobs/build", 1).await;
    let second = wait_for_lease(&app, "jobs/build", "worker-9");
    until_waiting(&app, "jobs/build", 2).await;
    let queue = browser
        .wait_for(
            "both waiters shown in order",
            "const row = document.querySelector('#lease-table tr[data-key=\"jobs/build\"]');
             const cell = row && row.querySelector('td.waiters');
             return cell && row.dataset.waiters === '2' && cell.querySelectorAll('.queue li').length === 2
                 ? cell.innerText : null;",
            json!([]),
        )
        .await;
    assert_eq!(queue, "2 worker-8, worker-9", "{queue}");
    browser.screenshot("leases-waiters").await;

    app.release("jobs/build", token(&holder)).await;
    let granted = tokio::time::timeout(CEILING, first).await.unwrap().unwrap();
    assert_eq!(granted, StatusCode::CREATED);
    let moved_up = browser
        .wait_for(
            "the first waiter holds the key and the second is next",
            "const row = document.querySelector('#lease-table tr[data-key=\"jobs/build\"]');
             return row && row.querySelector('.holder').textContent === 'worker-8'
                 && row.dataset.waiters === '1' ? row.querySelector('td.waiters').innerText : null;",
            json!([]),
        )
        .await;
    assert_eq!(moved_up, "1 worker-9");
    second.abort();
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}

#[tokio::test]
async fn the_snapshot_keys_under_a_prefix_page_a_hundred_at_a_time() {
    let _turn = ONE_BROWSER.lock().await;
    let Some(browser) = Browser::start().await else {
        return;
    };
    let app = TestApp::spawn().await;
    for i in 0..101 {
        let key = format!("jobs/{i:03}");
        let grant = app.acquire(&key, "writer", 60_000).await;
        let r = app.put(&key, token(&grant), "x").await;
        assert!(r.status().is_success(), "put {key}");
    }
    browser.goto(&ui(&app, "snapshots")).await;
    browser
        .type_into("#snapshot-keys-form input[name=\"prefix\"]", "jobs/")
        .await;
    browser
        .click("#snapshot-keys-form button[type=\"submit\"]")
        .await;
    const KEYS_SHOWN: &str = "
        const rows = [...document.querySelectorAll('#snapshot-keys-table tbody tr')];
        return rows.length && rows[0].dataset.key === arguments[0]
            ? [rows.length, rows[rows.length - 1].dataset.key] : null;";
    let first = browser
        .wait_for("the first page", KEYS_SHOWN, json!(["jobs/000"]))
        .await;
    assert_eq!(first, json!([100, "jobs/099"]));
    browser
        .click(".pager[data-for=\"snapshot-keys\"] [data-page=\"next\"]")
        .await;
    let second = browser
        .wait_for("the second page", KEYS_SHOWN, json!(["jobs/100"]))
        .await;
    assert_eq!(second, json!([1, "jobs/100"]));
    let next_disabled = browser
        .eval(
            "return document.querySelector('.pager[data-for=\"snapshot-keys\"] [data-page=\"next\"]').disabled;",
            json!([]),
        )
        .await;
    assert_eq!(next_disabled, true, "the last page");
    browser.screenshot("snapshot-keys-page-2").await;
    browser.assert_no_console_errors().await;
    browser.close().await;
    app.stop().await;
}
