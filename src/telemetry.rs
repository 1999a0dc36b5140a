//! Logs (a `RUST_LOG`-style filter, default `info`, plain or JSON lines on stderr) and, when the
//! standard `OTEL_*` variables ask for them, OpenTelemetry traces over OTLP (HTTP or gRPC): a span
//! per request named by its route, and one per batch, linked to the requests it carried.

use std::io::IsTerminal;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer as _, Registry};

use crate::config::LogFormat;
use crate::store::TRACE_TARGET;

/// What [`init`] started; [`Telemetry::shutdown`] sends the spans not yet exported.
#[must_use = "shut it down at exit, or the last spans are lost"]
pub struct Telemetry(Option<SdkTracerProvider>);

impl Telemetry {
    /// Exports what is left, for up to five seconds. Call outside the async runtime.
    pub fn shutdown(self) {
        if let Some(provider) = self.0 {
            if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
                tracing::warn!(error = %e, "exporting the last spans failed");
            }
        }
    }
}

/// Installs the global subscriber, with the trace exporter if the environment configures one.
/// Call once, at start, before any async runtime exists.
pub fn init(format: LogFormat) -> Telemetry {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let fmt = match format {
        LogFormat::Plain => fmt.boxed(),
        LogFormat::Json => fmt.json().flatten_event(true).boxed(),
    };
    let (provider, failed) = match traces_wanted() {
        Some(protocol) => match provider(protocol) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e)),
        },
        None => (None, None),
    };
    // Only the request and batch spans are exported: every other span is the logs' context.
    // (`filter_fn` here left every span without its OpenTelemetry context: `Targets` does not.)
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("snapfence"))
            .with_filter(Targets::new().with_target(TRACE_TARGET, tracing::Level::INFO))
    });
    Registry::default()
        .with(fmt.with_filter(filter))
        .with(otel)
        .init();
    if let Some(e) = failed {
        tracing::error!(error = %e, "OTEL_* asks for traces but the exporter could not be made: tracing is off; check OTEL_EXPORTER_OTLP_ENDPOINT");
    }
    if provider.is_some() {
        crate::store::trace_requests();
        tracing::info!("exporting traces over OTLP, as the OTEL_* variables say");
    }
    Telemetry(provider)
}

/// The protocol to export with, if the standard variables configure traces: an OTLP endpoint is
/// named (or `OTEL_TRACES_EXPORTER=otlp`), and neither `OTEL_SDK_DISABLED=true` nor
/// `OTEL_TRACES_EXPORTER=none` says otherwise.
fn traces_wanted() -> Option<Protocol> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return None;
    }
    let exporter = var("OTEL_TRACES_EXPORTER");
    let endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or(var("OTEL_EXPORTER_OTLP_ENDPOINT"));
    match exporter.as_deref() {
        Some("otlp") => {}
        Some(_) => return None,
        None if endpoint.is_none() => return None,
        None => {}
    }
    let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or(var("OTEL_EXPORTER_OTLP_PROTOCOL"));
    Some(match protocol.as_deref() {
        Some("grpc") => Protocol::Grpc,
        Some("http/json") => Protocol::HttpJson,
        _ => Protocol::HttpBinary,
    })
}

fn provider(
    protocol: Protocol,
) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let builder = SdkTracerProvider::builder().with_resource(resource());
    let builder = match protocol {
        Protocol::Grpc => builder.with_batch_exporter(OnItsRuntime::grpc()?),
        // The blocking client needs no runtime on the exporting thread.
        http => builder.with_batch_exporter(
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(http)
                .build()?,
        ),
    };
    Ok(builder.build())
}

/// `service.name` is `snapfence` unless `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`) says.
fn resource() -> Resource {
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name("snapfence").build()
    }
}

/// The gRPC exporter with a Tokio runtime of its own: the batch processor exports from a plain
/// thread, where tonic's connections would find no reactor.
#[derive(Debug)]
struct OnItsRuntime {
    exporter: opentelemetry_otlp::SpanExporter,
    runtime: tokio::runtime::Runtime,
}

impl OnItsRuntime {
    fn grpc() -> Result<Self, opentelemetry_otlp::ExporterBuildError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-grpc")
            .enable_all()
            .build()
            .map_err(|e| opentelemetry_otlp::ExporterBuildError::InternalFailure(e.to_string()))?;
        let exporter = {
            let _in = runtime.enter();
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_protocol(Protocol::Grpc)
                .build()?
        };
        Ok(Self { exporter, runtime })
    }
}

impl SpanExporter for OnItsRuntime {
    fn export(&self, batch: Vec<SpanData>) -> impl Future<Output = OTelSdkResult> + Send {
        std::future::ready(self.runtime.block_on(self.exporter.export(batch)))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.exporter.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.exporter.set_resource(resource);
    }
}
