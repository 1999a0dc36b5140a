//! The HTTP face of `docs/api.md`: one module per resource with thin handlers, one error type,
//! validating extractors.

pub mod audit;
pub mod auth;
pub mod error;
pub mod extract;
pub mod idempotency;
pub mod leases;
pub mod limits;
pub mod ops;
pub mod snapshots;
mod state;
mod txn;
pub mod ui;
pub mod watch;

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, State};
use axum::http::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use tokio::sync::Semaphore;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::Level;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::domain::{ErrorCode, Principal};
use crate::metrics::Metrics;
use crate::store;
use error::ApiError;
use extract::REQUEST_ID;
pub use state::{AppState, Shared};

/// The whole API with its middleware: request ids, a span per matched route, panics as 500.
pub fn router(state: AppState) -> Router {
    let middleware = ServiceBuilder::new()
        .map_request(drop_unusable_request_id)
        .layer(SetRequestIdLayer::new(REQUEST_ID.clone(), MakeRequestUuid))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request<_>| {
                    let route = req
                        .extensions()
                        .get::<MatchedPath>()
                        .map_or("unmatched", MatchedPath::as_str);
                    let request_id = req
                        .headers()
                        .get(&REQUEST_ID)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("");
                    if !store::tracing_requests() {
                        return tracing::info_span!("request", method = %req.method(), route, request_id);
                    }
                    let method = req.method();
                    let span = tracing::info_span!(
                        target: store::TRACE_TARGET,
                        "request",
                        method = %method,
                        route,
                        request_id,
                        otel.name = %format_args!("{method} {route}"),
                        otel.kind = "server",
                        http.request.method = %method,
                        http.route = route,
                        http.response.status_code = tracing::field::Empty,
                        otel.status_code = tracing::field::Empty,
                    );
                    // A parent that is not a valid `traceparent` leaves the span a root.
                    let _ = span.set_parent(TraceContextPropagator::new().extract(&HeaderExtractor(req.headers())));
                    span
                })
                // The access log is at `debug`: writing it costs about as much as serving a read.
                .on_response(DefaultOnResponse::new().level(Level::DEBUG)),
        )
        .layer(PropagateRequestIdLayer::new(REQUEST_ID.clone()))
        .layer(CatchPanicLayer::custom(panic_response));
    // One semaphore for the instance (`Router::layer` would make it per route).
    let serving = Arc::new(Semaphore::new(state.rules.max_concurrent_requests));
    let shed = axum::middleware::from_fn(move |req, next| limits::shed(serving.clone(), req, next));
    let authorize = axum::middleware::from_fn_with_state(state.clone(), auth::authorize);
    let metrics = state.metrics.clone();
    let max_header_bytes = state.rules.max_header_bytes;
    let db_bound = state.db.options().get_acquire_timeout();
    // Health checks and scrapes are never shed: an overloaded instance is alive.
    let api = api_routes()
        .router
        .layer(authorize)
        .layer(axum::middleware::from_fn(extract::strict_query))
        .layer(shed)
        .merge(ops::routes().router)
        .merge(ui::routes().router)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(axum::middleware::from_fn(move |req, next| {
            limit_head(max_header_bytes, req, next)
        }))
        .layer(axum::middleware::from_fn(
            move |req, next: axum::middleware::Next| crate::store::within(db_bound, next.run(req)),
        ))
        .layer(axum::middleware::from_fn_with_state(metrics, observe))
        .layer(axum::middleware::from_fn(error::log_errors));
    let api = if store::tracing_requests() {
        api.layer(axum::middleware::from_fn(traced))
    } else {
        api
    };
    api.layer(middleware)
}

/// The answer's status on the request's span, and its `traceparent`, so a caller can find the
/// trace.
async fn traced(req: Request<axum::body::Body>, next: axum::middleware::Next) -> Response {
    let mut answer = next.run(req).await;
    let span = tracing::Span::current();
    span.record("http.response.status_code", answer.status().as_u16());
    if answer.status().is_server_error() {
        span.record("otel.status_code", "error");
    }
    let headers = answer.headers_mut();
    TraceContextPropagator::new().inject_context(&span.context(), &mut HeaderInjector(headers));
    if headers.get("tracestate").is_some_and(|v| v.is_empty()) {
        headers.remove("tracestate");
    }
    answer
}

/// The longest `x-request-id` kept from a client.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// Drops a client's `x-request-id` unless it is short visible ASCII, so the service makes one.
fn drop_unusable_request_id<B>(mut req: Request<B>) -> Request<B> {
    let mut ids = req.headers().get_all(&REQUEST_ID).iter();
    let usable = match (ids.next(), ids.next()) {
        (Some(id), None) => {
            (1..=MAX_REQUEST_ID_BYTES).contains(&id.len())
                && id.as_bytes().iter().all(u8::is_ascii_graphic)
        }
        (None, _) => true,
        (Some(_), Some(_)) => false,
    };
    if !usable {
        req.headers_mut().remove(&REQUEST_ID);
    }
    req
}

/// The longest request target served (longer is 414): a list naming a 512-byte key fits, and it is
/// nginx's default.
pub const MAX_URI_BYTES: usize = 8 * 1024;

async fn limit_head(
    limit: usize,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let uri = req.uri();
    let target = uri.path_and_query().map_or(0, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.scheme_str().map_or(0, |s| s.len() + "://".len());
    if target > MAX_URI_BYTES {
        return ApiError::UriTooLong {
            size: Some(target),
            limit: MAX_URI_BYTES,
        }
        .into_response();
    }
    let size: usize = req
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if size > limit {
        return ApiError::HeadersTooLarge { size, limit }.into_response();
    }
    next.run(req).await
}

/// A router that remembers its paths, for the test that compares them with `openapi.yaml`.
pub struct Routes {
    router: Router<AppState>,
    paths: Vec<&'static str>,
}

impl Routes {
    fn new() -> Self {
        Self {
            router: Router::new(),
            paths: Vec::new(),
        }
    }

    fn route(mut self, path: &'static str, methods: MethodRouter<AppState>) -> Self {
        self.paths.push(path);
        self.router = self.router.route(path, methods);
        self
    }

    fn route_without_query(self, path: &'static str, methods: MethodRouter<AppState>) -> Self {
        self.route(
            path,
            methods.route_layer(axum::middleware::from_fn(extract::no_query)),
        )
    }

    fn merge(mut self, other: Routes) -> Self {
        self.paths.extend(other.paths);
        self.router = self.router.merge(other.router);
        self
    }
}

fn api_routes() -> Routes {
    Routes::new()
        .merge(leases::routes())
        .merge(snapshots::routes())
        .merge(txn::routes())
        .merge(audit::routes())
        .merge(watch::routes())
}

fn routes() -> Routes {
    api_routes().merge(ops::routes()).merge(ui::routes())
}

/// Every path the API routes, in axum's `{param}` syntax (which is also OpenAPI's).
pub fn paths() -> Vec<&'static str> {
    routes().paths
}

async fn observe(
    State(metrics): State<Arc<Metrics>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = req.method().clone();
    let started = Instant::now();
    let response = next.run(req).await;
    let code = response.extensions().get::<ErrorCode>().copied();
    let principal = response
        .extensions()
        .get::<Principal>()
        .map(|p| p.name.as_str());
    metrics.observe(
        &route,
        method.as_str(),
        response.status().as_u16(),
        code,
        principal,
        started.elapsed(),
    );
    response
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such endpoint; see openapi.yaml for the API".into())
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

fn panic_response(err: Box<dyn Any + Send + 'static>) -> Response {
    let message = err
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| err.downcast_ref::<&str>().copied())
        .unwrap_or("unknown panic");
    tracing::error!(panic = message, "handler panicked");
    ApiError::Internal.into_response()
}
