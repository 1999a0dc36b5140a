//! The testkit's OTLP receiver: real export requests over real HTTP and gRPC, in each encoding
//! an exporter sends, come out as the flat spans the service's tests assert on; what is not
//! OTLP is refused; a waiter wakes on a batch or fails with what it got; a dropped receiver
//! serves no more.

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, any_value::Value,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::span::Link;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;
use snapfence_testkit::otlp::{OtlpReceiver, ReceivedSpan, SpanKind};

// Two traces: span A is a root of the first; span B, in the second, has a parent that was not
// sent (a remote one) and a link to A.
const TRACE_A: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN_A: &str = "00f067aa0ba902b7";
const TRACE_B: &str = "0af7651916cd43dd8448eb211c80319c";
const SPAN_B: &str = "b7ad6b7169203331";
const PARENT_B: &str = "53995c3f42cd8ad8";

fn bytes(hex: &str) -> Vec<u8> {
    hex::decode(hex).unwrap()
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn string(s: &str) -> Value {
    Value::StringValue(s.into())
}

/// The request an exporter would send for spans A and B: one resource, with `service.name`
/// not its first attribute, and each span under its own instrumentation scope.
fn request() -> ExportTraceServiceRequest {
    let a = Span {
        trace_id: bytes(TRACE_A),
        span_id: bytes(SPAN_A),
        name: "lease.acquire".into(),
        kind: SpanKind::Server as i32,
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: 1_700_000_000_001_000_000,
        attributes: vec![
            kv("http.request.method", string("POST")),
            kv("snapfence.fencing_token", Value::IntValue(42)),
            kv("snapfence.granted", Value::BoolValue(true)),
            kv("snapfence.ratio", Value::DoubleValue(0.5)),
            kv(
                "snapfence.keys",
                Value::ArrayValue(ArrayValue {
                    values: vec![
                        AnyValue {
                            value: Some(string("a")),
                        },
                        AnyValue {
                            value: Some(string("b")),
                        },
                    ],
                }),
            ),
        ],
        ..Default::default()
    };
    let b = Span {
        trace_id: bytes(TRACE_B),
        span_id: bytes(SPAN_B),
        parent_span_id: bytes(PARENT_B),
        name: "store.write".into(),
        kind: SpanKind::Client as i32,
        start_time_unix_nano: 1_700_000_000_002_000_000,
        end_time_unix_nano: 1_700_000_000_003_000_000,
        attributes: vec![kv("db.system.name", string("postgresql"))],
        links: vec![Link {
            trace_id: bytes(TRACE_A),
            span_id: bytes(SPAN_A),
            ..Default::default()
        }],
        ..Default::default()
    };
    let scope = |name: &str, span: Span| ScopeSpans {
        scope: Some(InstrumentationScope {
            name: name.into(),
            ..Default::default()
        }),
        spans: vec![span],
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    kv("service.version", string("0.1.0")),
                    kv("service.name", string("snapfence")),
                ],
                ..Default::default()
            }),
            scope_spans: vec![scope("snapfence::http", a), scope("snapfence::store", b)],
            ..Default::default()
        }],
    }
}

/// The same request in OTLP/JSON, written out by hand as the specification spells it (ids in
/// hex, 64-bit integers as strings, enums as numbers) rather than by the crate that decodes it.
const REQUEST_JSON: &str = r#"{
  "resourceSpans": [{
    "resource": {"attributes": [
      {"key": "service.version", "value": {"stringValue": "0.1.0"}},
      {"key": "service.name", "value": {"stringValue": "snapfence"}}
    ]},
    "scopeSpans": [
      {"scope": {"name": "snapfence::http"}, "spans": [{
        "traceId": "4bf92f3577b34da6a3ce929d0e0e4736",
        "spanId": "00f067aa0ba902b7",
        "name": "lease.acquire",
        "kind": 2,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000001000000",
        "attributes": [
          {"key": "http.request.method", "value": {"stringValue": "POST"}},
          {"key": "snapfence.fencing_token", "value": {"intValue": "42"}},
          {"key": "snapfence.granted", "value": {"boolValue": true}},
          {"key": "snapfence.ratio", "value": {"doubleValue": 0.5}},
          {"key": "snapfence.keys", "value": {"arrayValue": {"values": [
            {"stringValue": "a"}, {"stringValue": "b"}
          ]}}}
        ]
      }]},
      {"scope": {"name": "snapfence::store"}, "spans": [{
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "parentSpanId": "53995c3f42cd8ad8",
        "name": "store.write",
        "kind": 3,
        "startTimeUnixNano": "1700000000002000000",
        "endTimeUnixNano": "1700000000003000000",
        "attributes": [
          {"key": "db.system.name", "value": {"stringValue": "postgresql"}}
        ],
        "links": [
          {"traceId": "4bf92f3577b34da6a3ce929d0e0e4736", "spanId": "00f067aa0ba902b7"}
        ]
      }]}
    ]
  }]
}"#;

/// What the receiver must make of [`request`], written out field by field.
fn expected() -> Vec<ReceivedSpan> {
    let attributes = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    vec![
        ReceivedSpan {
            name: "lease.acquire".into(),
            trace_id: TRACE_A.into(),
            span_id: SPAN_A.into(),
            parent_span_id: None,
            kind: 2,
            attributes: attributes(&[
                ("http.request.method", "POST"),
                ("snapfence.fencing_token", "42"),
                ("snapfence.granted", "true"),
                ("snapfence.ratio", "0.5"),
                ("snapfence.keys", "[a, b]"),
            ]),
            links: vec![],
            service_name: Some("snapfence".into()),
        },
        ReceivedSpan {
            name: "store.write".into(),
            trace_id: TRACE_B.into(),
            span_id: SPAN_B.into(),
            parent_span_id: Some(PARENT_B.into()),
            kind: 3,
            attributes: attributes(&[("db.system.name", "postgresql")]),
            links: vec![(TRACE_A.into(), SPAN_A.into())],
            service_name: Some("snapfence".into()),
        },
    ]
}

/// `POST {endpoint}/v1/traces` with `body` as `content_type`.
async fn post(receiver: &OtlpReceiver, content_type: &str, body: Vec<u8>) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/traces", receiver.endpoint()))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .expect("the receiver answers")
}

fn content_type(response: &reqwest::Response) -> Option<&str> {
    response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn protobuf_export_is_kept_as_flat_spans() {
    let receiver = OtlpReceiver::start().await;
    assert!(receiver.endpoint().starts_with("http://127.0.0.1:"));
    assert_eq!(receiver.spans(), vec![]);

    let response = post(
        &receiver,
        "application/x-protobuf",
        request().encode_to_vec(),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(content_type(&response), Some("application/x-protobuf"));
    let answer = ExportTraceServiceResponse::decode(response.bytes().await.unwrap())
        .expect("an ExportTraceServiceResponse");
    assert_eq!(answer, ExportTraceServiceResponse::default());
    assert_eq!(receiver.spans(), expected());

    // Not protobuf (a field tag with wire type 7, which does not exist): refused, nothing kept.
    let garbage = b"\xff\xff\xff\xff not protobuf".to_vec();
    assert!(ExportTraceServiceRequest::decode(&garbage[..]).is_err());
    let response = post(&receiver, "application/x-protobuf", garbage).await;
    assert_eq!(response.status(), 400);
    assert_eq!(receiver.spans(), expected());
}

#[tokio::test]
async fn json_export_is_kept_as_flat_spans() {
    let receiver = OtlpReceiver::start().await;
    let response = post(
        &receiver,
        "application/json; charset=utf-8",
        REQUEST_JSON.into(),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert_eq!(content_type(&response), Some("application/json"));
    let answer: serde_json::Value = response.json().await.unwrap();
    assert_eq!(answer, serde_json::json!({}));
    assert_eq!(receiver.spans(), expected());

    let response = post(
        &receiver,
        "application/json",
        b"{\"resourceSpans\": [".to_vec(),
    )
    .await;
    assert_eq!(response.status(), 400);
    assert_eq!(receiver.spans(), expected());
}

#[tokio::test]
async fn grpc_export_is_kept_as_flat_spans() {
    let receiver = OtlpReceiver::start().await;
    assert_ne!(receiver.grpc_endpoint(), receiver.endpoint());
    let mut client = TraceServiceClient::connect(receiver.grpc_endpoint())
        .await
        .expect("a gRPC connection to the receiver");
    let answer = client
        .export(request())
        .await
        .expect("the export is accepted");
    assert_eq!(answer.into_inner(), ExportTraceServiceResponse::default());
    assert_eq!(receiver.spans(), expected());
}

#[tokio::test]
async fn what_is_not_otlp_is_refused() {
    let receiver = OtlpReceiver::start().await;
    let body = request().encode_to_vec();

    let response = post(&receiver, "text/plain", body.clone()).await;
    assert_eq!(response.status(), 415);

    let response = reqwest::Client::new()
        .post(format!("{}/v1/traces", receiver.endpoint()))
        .header("content-type", "application/x-protobuf")
        .header("content-encoding", "gzip")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);

    let response = reqwest::get(format!("{}/v1/traces", receiver.endpoint()))
        .await
        .unwrap();
    assert_eq!(response.status(), 405);

    assert_eq!(receiver.spans(), vec![]);
}

#[tokio::test]
async fn wait_for_wakes_on_a_batch() {
    let receiver = OtlpReceiver::start().await;
    let endpoint = receiver.endpoint();
    let sender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        reqwest::Client::new()
            .post(format!("{endpoint}/v1/traces"))
            .header("content-type", "application/x-protobuf")
            .body(request().encode_to_vec())
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(receiver.spans(), vec![]);
    let spans = receiver
        .wait_for(Duration::from_secs(10), |spans| {
            spans.iter().any(|s| s.name == "store.write")
        })
        .await;
    assert_eq!(spans, expected());
    assert_eq!(sender.await.unwrap(), 200);
}

#[tokio::test]
#[should_panic(expected = "did not satisfy the predicate within 300ms; the 2 received")]
async fn wait_for_fails_with_what_it_got() {
    let receiver = OtlpReceiver::start().await;
    let response = post(
        &receiver,
        "application/x-protobuf",
        request().encode_to_vec(),
    )
    .await;
    assert_eq!(response.status(), 200);
    receiver
        .wait_for(Duration::from_millis(300), |spans| spans.len() == 3)
        .await;
}

#[tokio::test]
async fn a_dropped_receiver_serves_no_more() {
    let receiver = OtlpReceiver::start().await;
    let addrs = [receiver.endpoint(), receiver.grpc_endpoint()]
        .map(|e| e.strip_prefix("http://").unwrap().to_string());
    for addr in &addrs {
        tokio::net::TcpStream::connect(addr)
            .await
            .expect("the receiver listens");
    }
    drop(receiver);
    // The servers stop on their own tasks: give them a moment.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for addr in &addrs {
        loop {
            match tokio::net::TcpStream::connect(addr).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                other => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{addr} still takes connections after the drop: {other:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}
