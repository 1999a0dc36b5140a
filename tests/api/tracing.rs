//! OpenTelemetry traces from `snapfence serve` to a real OTLP receiver on loopback: a span per
//! request named by its route and parented by the caller's `traceparent`, the batch it joined as a
//! span linked to it, the answer's `traceparent`; and none of it without the `OTEL_*` variables.

use std::ffi::OsStr;
use std::time::Duration;

use reqwest::{Client, Response, StatusCode};
use serde_json::json;
use snapfence_testkit::otlp::{OtlpReceiver, ReceivedSpan, SpanKind};

use crate::harness::{migrated_database, token, url_of};
use crate::serve::{Served, serve_with_env, short_tempdir};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

/// The service on a migrated database with `env` added; the database lives as long as the test.
async fn serve_traced(
    env: &[(&str, &str)],
) -> (Served, crate::harness::TestDatabase, tempfile::TempDir) {
    let db = migrated_database().await;
    let url = url_of(db.options());
    let dir = short_tempdir();
    let args = [OsStr::new("--database-url"), OsStr::new(&url)];
    let served = serve_with_env(&args, env, &dir.path().join("serve.log")).await;
    (served, db, dir)
}

fn traceparent(parent: &str) -> String {
    format!("00-{TRACE}-{parent}-01")
}

/// The trace id and span id of an answer's `traceparent`.
fn answered_in(r: &Response) -> (String, String) {
    let header = r
        .headers()
        .get("traceparent")
        .expect("the answer carries a traceparent")
        .to_str()
        .unwrap()
        .to_owned();
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(parts.len(), 4, "{header}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// A grant and a fenced put, each sent with the caller's `traceparent`, and the spans they made.
async fn put_traced(receiver: &OtlpReceiver, base: &str) -> (Vec<ReceivedSpan>, String) {
    let http = Client::new();
    let granted = http
        .post(format!("{base}/v1/leases/tenant-secret-key"))
        .header("traceparent", traceparent("1111111111111111"))
        .json(&json!({"owner": "w", "ttl_ms": 60000}))
        .send()
        .await
        .unwrap();
    assert_eq!(granted.status(), StatusCode::CREATED);
    let t = token(&granted.json().await.unwrap());
    let put = http
        .put(format!("{base}/v1/snapshots/tenant-secret-key"))
        .header("traceparent", traceparent(CALLER))
        .header("Fencing-Token", t.to_string())
        .body("state")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);
    let (trace, put_span) = answered_in(&put);
    assert_eq!(trace, TRACE, "the answer is in the caller's trace");
    let spans = receiver
        .wait_for(Duration::from_secs(20), |spans| {
            spans.iter().any(|s| s.span_id == put_span)
                && spans
                    .iter()
                    .any(|s| s.links.iter().any(|(_, id)| *id == put_span))
        })
        .await;
    (spans, put_span)
}

fn assert_put_traced(spans: &[ReceivedSpan], put_span: &str) {
    let put = spans.iter().find(|s| s.span_id == put_span).unwrap();
    assert_eq!(put.name, "PUT /v1/snapshots/{key}");
    assert_eq!(put.trace_id, TRACE);
    assert_eq!(put.parent_span_id.as_deref(), Some(CALLER));
    assert_eq!(put.kind, SpanKind::Server as i32);
    assert_eq!(put.attributes["http.route"], "/v1/snapshots/{key}");
    assert_eq!(put.attributes["http.request.method"], "PUT");
    assert_eq!(put.attributes["http.response.status_code"], "201");
    assert_eq!(put.service_name.as_deref(), Some("snapfence"));
    let batch = spans
        .iter()
        .find(|s| s.links.iter().any(|(_, id)| id == put_span))
        .expect("a batch span links to the put");
    assert_eq!(batch.name, "batch put");
    assert_eq!(batch.attributes["batch.kind"], "put");
    assert!(batch.attributes["batch.size"].parse::<u64>().unwrap() >= 1);
    assert_eq!(batch.links[0], (TRACE.to_owned(), put_span.to_owned()));
    // A batch has many parents: it starts a trace of its own.
    assert_ne!(batch.trace_id, TRACE);
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(named(spans, "POST /v1/leases/{key}").len(), 1, "{names:?}");
    assert_eq!(named(spans, "batch acquire").len(), 1);
    // Route templates only: the key is a tenant's data.
    for span in spans {
        assert!(
            span.attributes
                .values()
                .all(|v| !v.contains("tenant-secret-key")),
            "{span:?}"
        );
    }
}

/// A service exporting to `receiver` over `protocol` (at `endpoint`): a fenced put's spans.
async fn a_put_traced_over(receiver: &OtlpReceiver, endpoint: &str, protocol: &str) {
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let (served, _db, _dir) = serve_traced(&env).await;
    let (spans, put_span) = put_traced(receiver, &served.base).await;
    assert_put_traced(&spans, &put_span);
    served.terminate();
    assert!(served.wait().await.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_put_is_a_request_span_in_the_callers_trace_linked_from_its_batch_over_otlp_http()
{
    let receiver = OtlpReceiver::start().await;
    a_put_traced_over(&receiver, &receiver.endpoint(), "http/protobuf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_spans_go_over_otlp_grpc() {
    let receiver = OtlpReceiver::start().await;
    a_put_traced_over(&receiver, &receiver.grpc_endpoint(), "grpc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_not_yet_sent_are_sent_at_shutdown() {
    let receiver = OtlpReceiver::start().await;
    let endpoint = receiver.endpoint();
    // A schedule longer than the test: only the shutdown's flush can send them.
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
    ];
    let (served, _db, _dir) = serve_traced(&env).await;
    let r = Client::new()
        .get(format!("{}/v1/leases/nobody", served.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let (_, span) = answered_in(&r);
    assert!(receiver.spans().is_empty());
    served.terminate();
    assert!(served.wait().await.success());
    let spans = receiver.spans();
    let get = spans
        .iter()
        .find(|s| s.span_id == span)
        .expect("sent at shutdown");
    assert_eq!(get.name, "GET /v1/leases/{key}");
    assert_eq!(get.parent_span_id, None, "no traceparent came: a root span");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_otel_variables_nothing_is_traced_and_no_traceparent_is_answered() {
    let (served, _db, _dir) = serve_traced(&[]).await;
    let r = Client::new()
        .get(format!("{}/v1/leases/nobody", served.base))
        .header("traceparent", traceparent(CALLER))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert!(r.headers().get("traceparent").is_none());
    served.terminate();
    assert!(served.wait().await.success());
}
