//! `/healthz`, `/readyz` and `/metrics`.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::{Value, json};

use super::Routes;
use super::error::{ApiError, Unavailability};
use crate::http::AppState;
use crate::store;

pub(super) fn routes() -> Routes {
    Routes::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    if store::ready(&state.db).await? {
        Ok(Json(json!({"status": "ready"})))
    } else {
        Err(ApiError::Unavailable(Unavailability::Database))
    }
}

/// An unanswering database leaves the gauges at their last value.
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let m = &state.metrics;
    let hot = state.db.hot_status();
    m.pool_connections
        .get_or_create(&[("state", "in_use")])
        .set((hot.open - hot.idle) as i64);
    m.pool_connections
        .get_or_create(&[("state", "idle")])
        .set(hot.idle as i64);
    m.pool_waiting.set(hot.waiting as i64);
    m.pool_max.set(hot.max as i64);
    // The store counts; the counters take its totals as they are.
    for t in state.db.batch_totals() {
        let label = [("kind", t.kind)];
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        m.batches
            .get_or_create(&label)
            .inner()
            .store(t.batches, relaxed);
        m.batched_requests
            .get_or_create(&label)
            .inner()
            .store(t.requests, relaxed);
    }
    m.lease_waiters.set(state.waiters.waiting() as i64);
    m.watch_streams.set(state.changes.watching() as i64);
    let lag = state.changes.lag();
    let stages = [("read", lag.read), ("stream", lag.stream)];
    for (stage, behind) in stages {
        let behind = i64::try_from(behind).unwrap_or(i64::MAX);
        m.watch_lag.get_or_create(&[("stage", stage)]).set(behind);
    }
    match store::audit::sizes(&state.db).await {
        Ok(sizes) => {
            for (log, rows, bytes) in sizes {
                m.audit_rows.get_or_create(&[("log", log.name())]).set(rows);
                m.audit_bytes
                    .get_or_create(&[("log", log.name())])
                    .set(bytes);
            }
        }
        Err(e) => tracing::debug!(error = %e, "audit log gauges not refreshed"),
    }
    match store::leases::count_recovery_pending(&state.db).await {
        Ok(n) => {
            m.recovery_records_open.set(n);
        }
        Err(e) => tracing::debug!(error = %e, "recovery records gauge not refreshed"),
    }
    ([(header::CONTENT_TYPE, OPENMETRICS)], m.render())
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
