//! Prometheus metrics of one instance at `GET /metrics`; each instance has its own registry, so
//! instances in one process never mix figures.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::domain::ErrorCode;

/// The labels of a request: its matched route (never the raw path), method and status.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The matched route, e.g. `/v1/leases/{key}`, or `unmatched`.
    pub route: String,
    /// The HTTP method.
    pub method: String,
    /// The status code.
    pub status: u16,
}

/// The labels of a latency observation.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The matched route.
    pub route: String,
    /// The HTTP method.
    pub method: String,
}

/// The API key of a request, by its name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrincipalLabel {
    /// The key's name.
    pub principal: String,
}

/// One label, e.g. `("reason", "stale_token")`.
pub type Label = [(&'static str, &'static str); 1];

/// Every metric of an instance. See the metrics table of docs/operations.md for what each one means.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Requests answered, by route, method and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Request latency in seconds, by route and method.
    pub latency: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// Leases granted.
    pub leases_granted: Counter,
    /// Acquires refused, by code (`lease_held`, `recovery_required`).
    pub leases_conflicted: Family<Label, Counter>,
    /// Lease changes refused with `lease_lost`, by route.
    pub leases_lost: Family<Label, Counter>,
    /// Fenced writes accepted, by operation (`put`, `delete`).
    pub writes_accepted: Family<Label, Counter>,
    /// Fenced writes refused, by reason (`stale_token`, `unknown_token`).
    pub rejections: Family<Label, Counter>,
    /// Fenced writes refused, by API key: which tenant floods the audit log.
    pub rejections_by_principal: Family<PrincipalLabel, Counter>,
    /// Rows in each audit log, PostgreSQL's estimate.
    pub audit_rows: Family<Label, Gauge>,
    /// Bytes on disk of each audit log with its indexes, read at scrape time.
    pub audit_bytes: Family<Label, Gauge>,
    /// Keys whose recovery record is open, read at scrape time.
    pub recovery_records_open: Gauge,
    /// Connections of the hot pool, by state (`in_use`, `idle`).
    pub pool_connections: Family<Label, Gauge>,
    /// Requests waiting for a hot connection or in an unsent batch.
    pub pool_waiting: Gauge,
    /// That pool's size limit.
    pub pool_max: Gauge,
    /// Batches sent, by kind (`put`, `acquire`, `txn`, ...), read at scrape time.
    pub batches: Family<Label, Counter>,
    /// Requests those batches carried, by kind: over `batches`, the mean batch size.
    pub batched_requests: Family<Label, Counter>,
    /// Acquires of this instance waiting in a key's queue, read at scrape time.
    pub lease_waiters: Gauge,
    /// Watch streams this instance serves, read at scrape time.
    pub watch_streams: Gauge,
    /// Changes this instance's watches are behind, by `stage`, read at scrape time.
    pub watch_lag: Family<Label, Gauge>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("snapfence");
        let m = Metrics {
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            leases_granted: Counter::default(),
            leases_conflicted: Family::default(),
            leases_lost: Family::default(),
            writes_accepted: Family::default(),
            rejections: Family::default(),
            rejections_by_principal: Family::default(),
            audit_rows: Family::default(),
            audit_bytes: Family::default(),
            recovery_records_open: Gauge::default(),
            pool_connections: Family::default(),
            pool_waiting: Gauge::default(),
            pool_max: Gauge::default(),
            batches: Family::default(),
            batched_requests: Family::default(),
            lease_waiters: Gauge::default(),
            watch_streams: Gauge::default(),
            watch_lag: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "http_requests",
            "Requests answered, by route, method and status",
            m.requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Request latency in seconds, by route and method",
            m.latency.clone(),
        );
        registry.register("leases_granted", "Leases granted", m.leases_granted.clone());
        registry.register(
            "leases_conflicted",
            "Acquires refused, by code (lease_held, recovery_required)",
            m.leases_conflicted.clone(),
        );
        registry.register(
            "leases_lost",
            "Lease changes refused with lease_lost, by operation",
            m.leases_lost.clone(),
        );
        registry.register(
            "writes_accepted",
            "Fenced writes accepted, by operation (put, delete)",
            m.writes_accepted.clone(),
        );
        registry.register(
            "rejections",
            "Fenced writes refused and audited, by reason (stale_token, unknown_token)",
            m.rejections.clone(),
        );
        registry.register(
            "rejections_by_principal",
            "Fenced writes refused and audited, by the API key that sent them",
            m.rejections_by_principal.clone(),
        );
        registry.register(
            "audit_rows",
            "Rows in each audit log (rejections, recoveries), PostgreSQL's estimate at scrape time",
            m.audit_rows.clone(),
        );
        registry.register(
            "audit_bytes",
            "Bytes on disk of each audit log with its indexes, at scrape time",
            m.audit_bytes.clone(),
        );
        registry.register(
            "recovery_records_open",
            "Keys whose recovery record blocks the next grant (read at scrape time)",
            m.recovery_records_open.clone(),
        );
        registry.register(
            "db_pool_connections",
            "Database pool connections of this instance, by state (in_use, idle)",
            m.pool_connections.clone(),
        );
        registry.register(
            "db_pool_waiting",
            "Requests waiting for a database pool connection or in a batch not sent yet",
            m.pool_waiting.clone(),
        );
        registry.register(
            "db_pool_max_connections",
            "Database pool size limit",
            m.pool_max.clone(),
        );
        registry.register(
            "batches",
            "Batched statements sent, by kind (acquire, put, txn, ...)",
            m.batches.clone(),
        );
        registry.register(
            "batched_requests",
            "Requests carried by batched statements, by kind; over batches, the mean batch size",
            m.batched_requests.clone(),
        );
        registry.register(
            "lease_waiters",
            "Acquires of this instance waiting in a key's queue (wait_ms)",
            m.lease_waiters.clone(),
        );
        registry.register(
            "watch_streams",
            "Watch streams this instance serves",
            m.watch_streams.clone(),
        );
        registry.register(
            "watch_lag_changes",
            "Changes numbered but not yet handed to this instance's watches (stage=read), and \
             handed on but not yet taken by its slowest live stream (stage=stream)",
            m.watch_lag.clone(),
        );
        Arc::new(Metrics { registry, ..m })
    }

    /// Counts one answered request, so every figure is defined here rather than per handler.
    pub fn observe(
        &self,
        route: &str,
        method: &str,
        status: u16,
        code: Option<ErrorCode>,
        principal: Option<&str>,
        elapsed: Duration,
    ) {
        self.observe_request(route, method, status, elapsed);
        let ok = (200..300).contains(&status);
        match (method, route, code) {
            ("POST", "/v1/leases/{key}", None) if ok => {
                self.leases_granted.inc();
            }
            (_, _, Some(code @ (ErrorCode::LeaseHeld | ErrorCode::RecoveryRequired))) => {
                Self::inc(&self.leases_conflicted, "code", code.as_str())
            }
            (_, _, Some(ErrorCode::LeaseLost)) => {
                Self::inc(&self.leases_lost, "route", route_name(route))
            }
            ("PUT", "/v1/snapshots/{key}", None) if ok => {
                Self::inc(&self.writes_accepted, "operation", "put")
            }
            ("DELETE", "/v1/snapshots/{key}", None) if ok => {
                Self::inc(&self.writes_accepted, "operation", "delete")
            }
            (_, _, Some(code @ (ErrorCode::StaleToken | ErrorCode::UnknownToken))) => {
                Self::inc(&self.rejections, "reason", code.as_str());
                if let Some(principal) = principal {
                    self.rejections_by_principal
                        .get_or_create(&PrincipalLabel {
                            principal: principal.to_owned(),
                        })
                        .inc();
                }
            }
            _ => {}
        }
    }

    fn observe_request(&self, route: &str, method: &str, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.to_owned(),
                method: method.to_owned(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&RouteLabels {
                route: route.to_owned(),
                method: method.to_owned(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Bumps a counter with one label.
    pub fn inc(family: &Family<Label, Counter>, name: &'static str, value: &'static str) {
        family.get_or_create(&[(name, value)]).inc();
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

fn route_name(route: &str) -> &'static str {
    match route {
        "/v1/leases/{key}/renew" => "renew",
        "/v1/leases/{key}/abandon" => "abandon",
        "/v1/leases/{key}/require-recovery" => "require_recovery",
        "/v1/leases/{key}/reconciled" => "reconciled",
        _ => "release",
    }
}
