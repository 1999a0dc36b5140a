//! `/v1/leases`: acquire, renew, release, abandon, require-recovery, get and list.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;

use super::Routes;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery, Context, FencingTokenHeader, KeyPath};
use crate::domain::{
    AcquireRequest, Cursor, FencingToken, Grant, Holder, Key, KeyPrefix, KeyStatus, Lease,
    LeaseState, Page, PageLimit, RenewRequest, TtlMs,
};
use crate::state::AppState;
use crate::store::leases::{self, AcquireOutcome, Ending, LeaseChange, ListQuery, NewLease};

/// The lease routes.
pub(super) fn routes() -> Routes {
    Routes::new()
        .route("/v1/leases", get(list))
        .route_without_query(
            "/v1/leases/{key}",
            post(acquire).get(status).delete(release),
        )
        .route_without_query("/v1/leases/{key}/renew", post(renew))
        .route_without_query("/v1/leases/{key}/abandon", post(abandon))
        .route_without_query("/v1/leases/{key}/require-recovery", post(require_recovery))
}

async fn acquire(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    Context(ctx): Context,
    ApiJson(body): ApiJson<AcquireRequest>,
) -> Result<Response, ApiError> {
    let req = NewLease {
        ttl: TtlMs::new(body.ttl_ms, state.rules.ttl_bounds)?,
        key: key.clone(),
        owner: body.owner,
        metadata: body.metadata,
        crash_recovery: body.crash_recovery,
        reconciled: body.reconciled,
    };
    match leases::acquire(&state.db, &req, &ctx).await? {
        AcquireOutcome::Granted { lease, recovered } => {
            Ok((StatusCode::CREATED, Json(Grant { lease, recovered })).into_response())
        }
        AcquireOutcome::Held { holder } => Err(ApiError::LeaseHeld {
            key,
            holder: Box::new(Holder::from(&holder)),
        }),
        AcquireOutcome::RecoveryRequired { recovery } => Err(ApiError::RecoveryRequired {
            key,
            recovery: Box::new(recovery),
        }),
    }
}

async fn renew(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    ApiJson(body): ApiJson<RenewRequest>,
) -> Result<Json<Lease>, ApiError> {
    let ttl = body
        .ttl_ms
        .map(|ms| TtlMs::new(ms, state.rules.ttl_bounds))
        .transpose()?;
    match leases::renew(&state.db, &key, body.token, ttl).await? {
        LeaseChange::Done(lease) => Ok(Json(lease)),
        LeaseChange::Lost => Err(lost(key, body.token)),
    }
}

fn lost(key: Key, token: FencingToken) -> ApiError {
    ApiError::LeaseLost {
        key,
        token: token.get(),
    }
}

async fn end(
    state: AppState,
    key: Key,
    token: FencingToken,
    ending: Ending,
) -> Result<StatusCode, ApiError> {
    match leases::end(&state.db, &key, token, ending).await? {
        LeaseChange::Done(_) => Ok(StatusCode::NO_CONTENT),
        LeaseChange::Lost => Err(lost(key, token)),
    }
}

async fn release(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    FencingTokenHeader(token): FencingTokenHeader,
) -> Result<StatusCode, ApiError> {
    end(state, key, token, Ending::Release).await
}

async fn abandon(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    FencingTokenHeader(token): FencingTokenHeader,
) -> Result<StatusCode, ApiError> {
    end(state, key, token, Ending::Abandon).await
}

async fn require_recovery(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    FencingTokenHeader(token): FencingTokenHeader,
) -> Result<StatusCode, ApiError> {
    end(state, key, token, Ending::RequireRecovery).await
}

async fn status(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
) -> Result<Json<KeyStatus>, ApiError> {
    leases::status(&state.db, &key)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("key {key:?} has never been leased")))
}

/// The query of a list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    state: Option<LeaseState>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<Page<KeyStatus>>, ApiError> {
    let q = ListQuery {
        prefix: KeyPrefix::parse(params.prefix.unwrap_or_default())?,
        state: params.state,
        limit: PageLimit::new(params.limit)?,
        after: params.cursor.as_deref().map(Cursor::decode).transpose()?,
    };
    Ok(Json(leases::list(&state.db, &q).await?))
}
