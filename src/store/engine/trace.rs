//! Spans for OpenTelemetry, made only once [`trace_requests`] has turned them on: each batch is a
//! span of its own, linked to the spans of the requests it carried (a batch has many parents).

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TraceContextExt as _;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The target of the spans that are exported, and of no other.
pub const TRACE_TARGET: &str = "snapfence::trace";

static ON: AtomicBool = AtomicBool::new(false);

/// Turns the request and batch spans on; the telemetry calls it when it exports traces.
pub fn trace_requests() {
    ON.store(true, Ordering::Relaxed);
}

/// Whether spans are exported; when not, no request pays for them.
pub fn tracing_requests() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The span a request is in, to link its batch to.
pub(crate) fn origin() -> Option<Span> {
    tracing_requests().then(Span::current)
}

/// A batch of `kind` carrying `size` requests, linked to each of their spans.
pub(crate) fn batch<'a>(
    kind: &'static str,
    size: usize,
    origins: impl Iterator<Item = &'a Span>,
) -> Span {
    if !tracing_requests() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TRACE_TARGET,
        "batch",
        otel.name = %format_args!("batch {kind}"),
        otel.kind = "internal",
        batch.kind = kind,
        batch.size = size,
        db.system.name = "postgresql",
    );
    for origin in origins {
        span.add_link(origin.context().span().span_context().clone());
    }
    span
}
