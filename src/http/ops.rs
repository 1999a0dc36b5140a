//! `/healthz` and `/readyz`.

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use serde_json::{Value, json};

use super::Routes;
use super::error::ApiError;
use crate::state::AppState;
use crate::store;

/// The operations routes.
pub(super) fn routes() -> Routes {
    Routes::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// The process is up; says nothing about the database.
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// The database answers and has every migration of this build; otherwise 503.
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    if store::ready(&state.db).await? {
        Ok(Json(json!({"status": "ready"})))
    } else {
        Err(ApiError::Unavailable)
    }
}
