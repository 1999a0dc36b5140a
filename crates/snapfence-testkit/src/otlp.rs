//! A real OTLP trace receiver on loopback ports, so that a test can check the spans the service
//! exports the way a collector would get them: OTLP/HTTP (`POST /v1/traces`, protobuf or JSON)
//! and OTLP/gRPC (`TraceService/Export`), each request decoded from the wire with the messages
//! of `opentelemetry-proto`, the crate the SDK's exporter encodes with. No collector is faked
//! inside the service.
//!
//! What it received is kept as a flat [`ReceivedSpan`] per span, ids in hex and attribute values
//! as strings, for plain `assert_eq!`s. Exporters send in batches on a timer, so a test waits
//! for what it expects with [`OtlpReceiver::wait_for`].
//!
//! Compressed requests (`Content-Encoding: gzip`) are refused with a 415, not guessed at.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The span kinds [`ReceivedSpan::kind`] holds, e.g. `SpanKind::Server as i32`.
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;

/// The largest request either side takes: well above a full batch (512 spans by default), so
/// that a big batch is received rather than refused.
const MAX_REQUEST: usize = 64 << 20;

/// One received span, flattened for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The span's name.
    pub name: String,
    /// The trace id, lowercase hex (32 digits from a conforming exporter).
    pub trace_id: String,
    /// The span id, lowercase hex (16 digits from a conforming exporter).
    pub span_id: String,
    /// The parent's span id in hex; `None` for a root span (empty on the wire).
    pub parent_span_id: Option<String>,
    /// The span kind as on the wire: a [`SpanKind`] as `i32` (0 unspecified, 1 internal,
    /// 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: i32,
    /// The span's attributes, each value rendered as a string: strings as they are, booleans
    /// and numbers as Rust prints them, bytes in hex, arrays as `[a, b]`, maps as `{k: v}`.
    /// A key sent twice keeps its last value.
    pub attributes: BTreeMap<String, String>,
    /// The span's links, each as (trace id, span id) in hex.
    pub links: Vec<(String, String)>,
    /// The `service.name` attribute of the resource the span was sent under.
    pub service_name: Option<String>,
}

/// A running receiver; dropping it stops both servers (open connections are closed once their
/// request in flight, if any, is answered).
pub struct OtlpReceiver {
    http: SocketAddr,
    grpc: SocketAddr,
    /// Every span received so far, in the order received; a watch so that waiters wake on each
    /// batch instead of sleeping between polls.
    spans: Arc<watch::Sender<Vec<ReceivedSpan>>>,
    /// Never sent on: dropping it is the servers' signal to shut down.
    _stop: watch::Sender<()>,
}

impl OtlpReceiver {
    /// Starts a receiver on two free loopback ports, one for OTLP/HTTP and one for OTLP/gRPC.
    pub async fn start() -> Self {
        let spans = Arc::new(watch::Sender::new(Vec::new()));
        let (stop, stopped) = watch::channel(());

        let http_listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the OTLP/HTTP receiver");
        let http = http_listener.local_addr().expect("the OTLP/HTTP address");
        let app = Router::new()
            .route("/v1/traces", post(export_http))
            .layer(DefaultBodyLimit::max(MAX_REQUEST))
            .with_state(spans.clone());
        let mut signal = stopped.clone();
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = signal.changed().await;
            };
            if let Err(e) = axum::serve(http_listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                eprintln!("the OTLP/HTTP receiver stopped: {e}");
            }
        });

        let grpc_listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the OTLP/gRPC receiver");
        let grpc = grpc_listener.local_addr().expect("the OTLP/gRPC address");
        let service =
            TraceServiceServer::new(Grpc(spans.clone())).max_decoding_message_size(MAX_REQUEST);
        let mut signal = stopped;
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = signal.changed().await;
            };
            // The one service, no router: any other method is answered `unimplemented`.
            if let Err(e) = tonic::transport::Server::builder()
                .serve_with_incoming_shutdown(
                    service,
                    tonic::transport::server::TcpIncoming::from(grpc_listener),
                    shutdown,
                )
                .await
            {
                eprintln!("the OTLP/gRPC receiver stopped: {e}");
            }
        });

        Self {
            http,
            grpc,
            spans,
            _stop: stop,
        }
    }

    /// `http://127.0.0.1:PORT`, the OTLP/HTTP base: the value for `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// (the exporter appends `/v1/traces`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// `http://127.0.0.1:PORT` of the OTLP/gRPC side, for an exporter whose protocol is `grpc`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Every span received so far, in the order received.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.borrow().clone()
    }

    /// Waits until `pred` holds for the spans received so far, and returns them; checked now and
    /// again on each batch received. Panics after `bound` with the spans it got.
    pub async fn wait_for(
        &self,
        bound: Duration,
        pred: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + bound;
        let mut received = self.spans.subscribe();
        loop {
            let spans = received.borrow_and_update().clone();
            if pred(&spans) {
                return spans;
            }
            // The sender lives in `self`, so `changed` only ever returns on a new batch.
            if tokio::time::timeout_at(deadline, received.changed())
                .await
                .is_err()
            {
                let spans = self.spans();
                panic!(
                    "the spans received did not satisfy the predicate within {bound:?}; the {} received: {spans:#?}",
                    spans.len()
                );
            }
        }
    }
}

/// `POST /v1/traces`: an `ExportTraceServiceRequest` in protobuf or OTLP/JSON, answered with an
/// empty `ExportTraceServiceResponse` in the same encoding.
async fn export_http(
    State(spans): State<Arc<watch::Sender<Vec<ReceivedSpan>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(encoding) = headers.get(CONTENT_ENCODING)
        && !encoding.as_bytes().eq_ignore_ascii_case(b"identity")
    {
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("the receiver takes no compressed requests (Content-Encoding: {encoding:?})"),
        )
            .into_response();
    }
    let media_type = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match media_type.as_str() {
        "application/x-protobuf" => match ExportTraceServiceRequest::decode(body) {
            Ok(request) => {
                record(&spans, request);
                let answer = ExportTraceServiceResponse::default().encode_to_vec();
                ([(CONTENT_TYPE, "application/x-protobuf")], answer).into_response()
            }
            Err(e) => (
                StatusCode::BAD_REQUEST,
                format!("not an ExportTraceServiceRequest: {e}"),
            )
                .into_response(),
        },
        "application/json" => match serde_json::from_slice::<ExportTraceServiceRequest>(&body) {
            Ok(request) => {
                record(&spans, request);
                ([(CONTENT_TYPE, "application/json")], "{}").into_response()
            }
            Err(e) => (
                StatusCode::BAD_REQUEST,
                format!("not an OTLP/JSON ExportTraceServiceRequest: {e}"),
            )
                .into_response(),
        },
        other => (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("OTLP/HTTP is application/x-protobuf or application/json, not {other:?}"),
        )
            .into_response(),
    }
}

/// The OTLP/gRPC side, into the same record as the HTTP side.
struct Grpc(Arc<watch::Sender<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        record(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Adds the request's spans to the record, in one change so that a waiter sees a whole batch.
fn record(spans: &watch::Sender<Vec<ReceivedSpan>>, request: ExportTraceServiceRequest) {
    let flat = flatten(request);
    spans.send_modify(|all| all.extend(flat));
}

/// One [`ReceivedSpan`] per span of the request, in the request's order.
fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut flat = Vec::new();
    for resource_spans in request.resource_spans {
        let service_name = resource_spans.resource.and_then(|r| {
            r.attributes
                .iter()
                .rfind(|kv| kv.key == "service.name")
                .map(|kv| render(kv.value.as_ref()))
        });
        for span in resource_spans
            .scope_spans
            .into_iter()
            .flat_map(|scope| scope.spans)
        {
            flat.push(ReceivedSpan {
                name: span.name,
                trace_id: hex::encode(&span.trace_id),
                span_id: hex::encode(&span.span_id),
                parent_span_id: (!span.parent_span_id.is_empty())
                    .then(|| hex::encode(&span.parent_span_id)),
                kind: span.kind,
                attributes: attributes(&span.attributes),
                links: span
                    .links
                    .iter()
                    .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                    .collect(),
                service_name: service_name.clone(),
            });
        }
    }
    flat
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), render(kv.value.as_ref())))
        .collect()
}

/// An attribute value as a string (see [`ReceivedSpan::attributes`]); an empty value is `""`.
fn render(value: Option<&AnyValue>) -> String {
    use any_value::Value;
    match value.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex::encode(b),
        Some(Value::ArrayValue(a)) => {
            let items: Vec<_> = a.values.iter().map(|v| render(Some(v))).collect();
            format!("[{}]", items.join(", "))
        }
        Some(Value::KvlistValue(kvs)) => {
            let items: Vec<_> = kvs
                .values
                .iter()
                .map(|kv| format!("{}: {}", kv.key, render(kv.value.as_ref())))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        // A profiles-only reference into a string table no trace request has.
        Some(Value::StringValueStrindex(i)) => format!("<string {i}>"),
    }
}
