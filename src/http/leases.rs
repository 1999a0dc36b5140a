//! `/v1/leases`, and (beyond the contract) a key's queue of waiting acquires.

use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use serde::Deserialize;

use super::Routes;
use super::error::ApiError;
use super::extract::{
    ApiJson, ApiQuery, Context, FencingTokenHeader, KeyPath, PageParams, key_page,
};
use super::idempotency::IdempotencyHeader;
use super::limits::Serving;
use crate::domain::{
    AcquireRequest, FencingToken, Grant, Holder, Key, KeyStatus, LeaseState, Page, RenewRequest,
    TtlMs, Waiter,
};
use crate::http::AppState;
use crate::store::RequestContext;
use crate::store::idempotency::Gated;
use crate::store::leases::queue;
use crate::store::leases::{self, AcquireOutcome, Ending, LeaseChange, ListQuery, NewLease};

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
        .route_without_query("/v1/leases/{key}/reconciled", post(reconciled))
        .route("/v1/leases/{key}/waiters", get(waiters))
}

async fn acquire(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    Context(mut ctx, idempotency): Context,
    serving: Option<Extension<Serving>>,
    ApiJson(body): ApiJson<AcquireRequest>,
) -> Result<Response, ApiError> {
    body.checked_reconcile()?;
    let canonical = serde_json::to_vec(&body).expect("a request serializes");
    idempotency.attach(&mut ctx, "acquire", &key, &[&canonical]);
    let wait = body
        .checked_wait()?
        .map(|w| w.min(state.rules.max_wait))
        .filter(|w| !w.is_zero());
    let req = NewLease {
        ttl: TtlMs::new(body.ttl_ms, state.rules.ttl_bounds)?,
        key: key.clone(),
        owner: body.owner,
        metadata: body.metadata,
        crash_recovery: body.crash_recovery,
        reconciled: body.reconciled,
        reconciling: body.reconciling,
    };
    let done = match wait {
        None if state.waiters.holds(&ctx) => Ok(Gated::InProgress),
        None => leases::acquire(&state.db, &req, &ctx).await,
        Some(wait) => {
            let _waiting = state
                .limits
                .admit_waiter(key.as_str())
                .map_err(ApiError::TooManyRequests)?;
            if let Some(Extension(serving)) = serving {
                serving.leave();
            }
            state.waiters.acquire(&req, &ctx, wait).await
        }
    };
    idempotency.respond(done, |outcome| match outcome {
        AcquireOutcome::Granted {
            lease,
            recovered,
            kept,
        } => Ok((
            StatusCode::CREATED,
            Json(Grant {
                lease,
                recovered: recovered.map(|r| *r),
                recovery: kept.map(|r| *r),
            }),
        )
            .into_response()),
        AcquireOutcome::Held {
            holder,
            state,
            waiters,
        } => Err(ApiError::LeaseHeld {
            key,
            holder: Box::new(Holder::from(&holder)),
            state,
            waiters,
        }),
        AcquireOutcome::RecoveryRequired { recovery } => Err(ApiError::RecoveryRequired {
            key,
            recovery: Box::new(recovery),
        }),
    })
}

async fn renew(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    Context(mut ctx, idempotency): Context,
    ApiJson(body): ApiJson<RenewRequest>,
) -> Result<Response, ApiError> {
    let canonical = serde_json::to_vec(&body).expect("a request serializes");
    idempotency.attach(&mut ctx, "renew", &key, &[&canonical]);
    let ttl = body
        .ttl_ms
        .map(|ms| TtlMs::new(ms, state.rules.ttl_bounds))
        .transpose()?;
    let done = leases::renew(&state.db, &key, body.token, ttl, &ctx).await;
    idempotency.respond(done, |change| match change {
        LeaseChange::Done(lease) => Ok(Json(lease).into_response()),
        LeaseChange::Lost => Err(lost(key, body.token)),
    })
}

fn lost(key: Key, token: FencingToken) -> ApiError {
    ApiError::LeaseLost {
        key,
        token: token.get(),
    }
}

struct LiveLeaseCall {
    key: Key,
    token: FencingToken,
    ctx: RequestContext,
    idempotency: IdempotencyHeader,
}

impl FromRequestParts<AppState> for LiveLeaseCall {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let KeyPath(key) = KeyPath::from_request_parts(parts, state).await?;
        let FencingTokenHeader(token) =
            FencingTokenHeader::from_request_parts(parts, state).await?;
        let Context(ctx, idempotency) = Context::from_request_parts(parts, state).await?;
        Ok(Self {
            key,
            token,
            ctx,
            idempotency,
        })
    }
}

async fn end(state: AppState, call: LiveLeaseCall, ending: Ending) -> Result<Response, ApiError> {
    let LiveLeaseCall {
        key,
        token,
        mut ctx,
        idempotency,
    } = call;
    let operation = match ending {
        Ending::Release => "release",
        Ending::Abandon => "abandon",
        Ending::RequireRecovery => "require-recovery",
    };
    idempotency.attach(&mut ctx, operation, &key, &[&token.get().to_be_bytes()]);
    let done = leases::end(&state.db, &key, token, ending, &ctx).await;
    idempotency.respond(done, |change| match change {
        LeaseChange::Done(_) => Ok(StatusCode::NO_CONTENT.into_response()),
        LeaseChange::Lost => Err(lost(key, token)),
    })
}

async fn release(State(state): State<AppState>, call: LiveLeaseCall) -> Result<Response, ApiError> {
    end(state, call, Ending::Release).await
}

async fn abandon(State(state): State<AppState>, call: LiveLeaseCall) -> Result<Response, ApiError> {
    end(state, call, Ending::Abandon).await
}

async fn require_recovery(
    State(state): State<AppState>,
    call: LiveLeaseCall,
) -> Result<Response, ApiError> {
    end(state, call, Ending::RequireRecovery).await
}

async fn reconciled(
    State(state): State<AppState>,
    call: LiveLeaseCall,
) -> Result<Response, ApiError> {
    let LiveLeaseCall {
        key,
        token,
        mut ctx,
        idempotency,
    } = call;
    idempotency.attach(&mut ctx, "reconciled", &key, &[&token.get().to_be_bytes()]);
    let done = leases::reconciled(&state.db, &key, token, &ctx).await;
    idempotency.respond(done, |change| match change {
        LeaseChange::Done(lease) => Ok(Json(lease).into_response()),
        LeaseChange::Lost => Err(lost(key, token)),
    })
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
    let (prefix, limit, after) = key_page(params.prefix, params.limit, params.cursor.as_deref())?;
    let q = ListQuery {
        prefix,
        state: params.state,
        limit,
        after,
    };
    Ok(Json(leases::list(&state.db, &q).await?))
}

/// Beyond the contract: the key's waiters in grant order.
async fn waiters(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    ApiQuery(params): ApiQuery<PageParams>,
) -> Result<Json<Page<Waiter>>, ApiError> {
    let (limit, after) = params.checked()?;
    Ok(Json(queue::waiters(&state.db, &key, limit, after).await?))
}
