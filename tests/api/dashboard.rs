//! `packaging/grafana/snapfence.json`, the Grafana dashboard: every metric its queries name is
//! one the service exports, it has a panel for each thing an operator watches, and each panel can run.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::harness::{TestApp, token};
use crate::metrics::scrape;

fn dashboard() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/packaging/grafana/snapfence.json"
    );
    let text = std::fs::read_to_string(path).expect("the dashboard in packaging/grafana");
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// The panels that show data (rows only group them).
fn panels(dashboard: &Value) -> Vec<&Value> {
    let all = dashboard["panels"].as_array().expect("a list of panels");
    all.iter().filter(|p| p["type"] != "row").collect()
}

/// Every PromQL query of the dashboard: its panels' targets and its variables' definitions.
fn queries(dashboard: &Value) -> Vec<String> {
    let targets = panels(dashboard)
        .into_iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| &t["expr"]);
    let variables = dashboard["templating"]["list"].as_array().unwrap().iter();
    let definitions = variables.map(|v| &v["definition"]);
    targets
        .chain(definitions)
        .filter_map(|q| Some(q.as_str()?.to_owned()))
        .collect()
}

/// PromQL words that are not metric names: aggregations (`sum by (…) (…)` has no `(` after
/// `sum`) and operators. A function is known by the `(` after its name.
const KEYWORDS: &str = "sum min max avg group stddev stdvar count count_values bottomk topk \
    quantile and or unless bool offset inf nan";

/// Keywords followed by a list of label names, not of series.
const GROUPING: &str = "by without on ignoring group_left group_right";

/// The index just past whatever closes the bracket or quote at `open`, quotes inside skipped
/// (a label value such as `"/v1/snapshots/{key}"` holds brackets).
fn past_closing(b: &[u8], open: usize) -> usize {
    let quoted = matches!(b[open], b'"' | b'\'');
    let close = match b[open] {
        b'{' => b'}',
        b'[' => b']',
        b'(' => b')',
        quote => quote,
    };
    let mut i = open + 1;
    while i < b.len() && b[i] != close {
        i = match b[i] {
            b'\\' => i + 2,
            b'"' | b'\'' if !quoted => past_closing(b, i),
            _ => i + 1,
        };
    }
    i + 1
}

/// The metric names one query selects: every identifier that is not a function, keyword,
/// label name, number, duration, string or Grafana variable.
fn metric_names(query: &str) -> Vec<&str> {
    let b = query.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let (mut names, mut i) = (Vec::new(), 0);
    while i < b.len() {
        let start = i;
        i = match b[i] {
            // Label matchers, ranges and strings.
            b'{' | b'[' | b'"' | b'\'' => past_closing(b, i),
            // `$instance`, `${datasource}`, `$__rate_interval`.
            b'$' if b.get(i + 1) == Some(&b'{') => past_closing(b, i + 1),
            b'$' => i + 1 + b[i + 1..].iter().take_while(|&&c| word(c)).count(),
            // Numbers and durations (`0.99`, `5m`).
            c if c.is_ascii_digit() => {
                i + b[i..].iter().take_while(|&&c| word(c) || c == b'.').count()
            }
            c if word(c) => {
                let end = i + b[i..].iter().take_while(|&&c| word(c)).count();
                let name = &query[start..end];
                let next = query[end..].trim_start();
                if GROUPING.split_whitespace().any(|g| g == name) && next.starts_with('(') {
                    past_closing(b, b.len() - next.len())
                } else {
                    // `label_values(metric, label)`: the label is no series either.
                    let label = query[..start].trim_end().ends_with(',')
                        && query[..start].contains("label_values(");
                    if !KEYWORDS.split_whitespace().any(|k| k == name)
                        && !next.starts_with('(')
                        && !label
                    {
                        names.push(name);
                    }
                    end
                }
            }
            _ => i + 1,
        };
    }
    names
}

#[test]
fn the_query_reader_finds_metric_names_only() {
    let q = concat!(
        r#"histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{route="/v1/{key}", "#,
        r#"instance=~"$instance"}[$__rate_interval]))) / on (route) b_total offset 5m"#,
    );
    assert_eq!(metric_names(q), ["a_bucket", "b_total"]);
    assert_eq!(metric_names("label_values(c_total, instance)"), ["c_total"]);
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let app = TestApp::spawn().await;
    // A labelled family is exported once it has counted something: a grant, a conflict, an
    // accepted write, a stale one, a lost lease; plain gauges (waiters, watches) always are.
    let first = token(&app.acquire("k", "a", 30000).await);
    app.acquire_with("k", json!({"owner": "b", "ttl_ms": 30000}))
        .await;
    app.put("k", first, "x").await;
    app.release("k", first).await;
    app.release("k", first).await;
    app.acquire("k", "b", 30000).await;
    app.put("k", first, "stale").await;
    // Refusals by principal need a key to name; made last, as it turns authentication on.
    let key = app
        .make_key("noisy", snapfence::domain::Scope::Write, "")
        .await;
    app.request(reqwest::Method::PUT, "/v1/snapshots/never")
        .header("Authorization", format!("Bearer {key}"))
        .header("Fencing-Token", "1")
        .body("x")
        .send()
        .await
        .unwrap();

    let text = scrape(&app).await;
    let samples: HashSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let histograms: HashSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" histogram"))
        .collect();
    let exported = |name: &str| {
        samples.contains(name)
            || ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s).is_some_and(|f| histograms.contains(f)))
    };
    let queries = queries(&dashboard());
    let named: Vec<&str> = queries.iter().flat_map(|q| metric_names(q)).collect();
    assert!(
        named.len() >= 10,
        "the dashboard's queries name metrics: {named:?}"
    );
    let missing: Vec<&&str> = named.iter().filter(|n| !exported(n)).collect();
    assert!(missing.is_empty(), "not in /metrics: {missing:?}\n{text}");
    app.stop().await;
}

#[test]
fn the_dashboard_has_panels_for_requests_refusals_batching_waiters_and_watches() {
    let dashboard = dashboard();
    let titles: Vec<String> = panels(&dashboard)
        .iter()
        .map(|p| p["title"].as_str().unwrap_or_default().to_lowercase())
        .collect();
    for topic in [
        "requests by outcome",
        "refused",
        "batch",
        "waiting acquires",
        "watch",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "no panel on {topic:?} in {titles:?}"
        );
    }
}

#[test]
fn every_panel_has_a_datasource_and_a_query() {
    let dashboard = dashboard();
    // The datasource is a variable, so the dashboard imports onto any Prometheus.
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(variables.iter().any(|v| v["type"] == "datasource"));
    for panel in panels(&dashboard) {
        let title = &panel["title"];
        assert_eq!(panel["datasource"]["type"], "prometheus", "{title}");
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "{title} has no target");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: a target with no query");
        }
    }
}
