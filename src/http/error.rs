//! Where anything becomes an HTTP error: [`ApiError`] as problem+json (RFC 9457) with the
//! contract's `code`.

use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::domain::RefusalReason;
use crate::domain::headers::PROBLEM_JSON;
use crate::domain::{
    AuditId, ChangeId, ErrorCode, Holder, IdempotencyKey, InvalidInput, Key, LeaseState, Problem,
    RecoveryRecord, RefusalFields,
};
use crate::store::StoreError;
use crate::store::snapshots::Refusal;

/// Why the service answers `503 unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unavailability {
    /// The database cannot be reached, or gave up on the statement.
    #[error("the database is unavailable")]
    Database,
    /// The instance is at its cap of concurrent requests and shed this one unread.
    #[error(
        "this instance is at its limit of concurrent requests and shed this one before reading it"
    )]
    Overloaded,
    /// The bodies being received hold the instance's budget, and this one would pass it.
    #[error(
        "this instance is receiving as many request bodies as it may hold at once ({limit} bytes together, --max-body-bytes-in-flight), and this one would pass that, so it was refused before it was stored"
    )]
    BodyBudget {
        /// The budget in bytes.
        limit: usize,
    },
}

/// Why an API key's request is answered `429`: refused before it was read, so nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Throttled {
    /// The key has its most requests in flight on this instance.
    #[error(
        "API key {key:?} already has {limit} requests in flight on this instance, its limit, so this one was refused unread and nothing was changed; send it again once one of them is answered, or ask an operator to raise --max-in-flight-per-key"
    )]
    InFlight {
        /// The key's name.
        key: String,
        /// Its limit.
        limit: usize,
    },
    /// The key is over its rate on this instance.
    #[error(
        "API key {key:?} is over its rate limit on this instance ({per_second} requests a second, bursts of {burst}), so this one was refused unread and nothing was changed; send it again in {retry_after} s (Retry-After), or ask an operator to raise --rate-limit-per-key"
    )]
    Rate {
        /// The key's name.
        key: String,
        /// The rate.
        per_second: f64,
        /// The burst.
        burst: u32,
        /// Whole seconds until the key's next request may be admitted.
        retry_after: u64,
    },
    /// The key has its most watch streams open on this instance.
    #[error(
        "API key {key:?} already has {limit} watch streams open on this instance, its limit, so this one was refused; close one (one stream of a shorter prefix can replace several), or ask an operator to raise --max-watches-per-key"
    )]
    Watches {
        /// The key's name.
        key: String,
        /// Its limit.
        limit: usize,
    },
    /// The instance has its most watch streams open.
    #[error(
        "this instance already serves {limit} watch streams, its limit, so this one was refused; try again after Retry-After, or through another instance (an operator may raise --max-watches)"
    )]
    InstanceWatches {
        /// The limit.
        limit: usize,
    },
}

/// The `Retry-After` of a watch stream refused for the streams open.
pub const WATCH_RETRY_AFTER: u64 = 5;

impl Throttled {
    /// Seconds until the request may be admitted (a second for a key at its cap in flight).
    pub fn retry_after(&self) -> u64 {
        match self {
            Self::InFlight { .. } => 1,
            Self::Rate { retry_after, .. } => *retry_after,
            Self::Watches { .. } | Self::InstanceWatches { .. } => WATCH_RETRY_AFTER,
        }
    }
}

/// Every error the API answers with, one variant per contract code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: malformed JSON, a bad key, a TTL out of bounds, a bad header, an unknown field.
    #[error("{0}")]
    InvalidRequest(String),
    /// 428: a fenced call without `Fencing-Token`.
    #[error("this call is fenced: send the token of your lease grant as `Fencing-Token: <token>`")]
    TokenRequired,
    /// 409: another lease is live, or the key is free and goes to earlier waiters.
    #[error("{}", held_detail(key, holder, *state, *waiters))]
    LeaseHeld {
        /// The key.
        key: Key,
        /// The live lease; on a free key, the last one.
        holder: Box<Holder>,
        /// The key's state as the acquire found it.
        state: LeaseState,
        /// On a free key, the live waiters queued before the request.
        waiters: Option<i64>,
    },
    /// 409: a recovery record blocks the grant.
    #[error("key {key:?} keeps a recovery record ({}) left by {:?}; reconcile what it left behind, then acquire with \"reconciled\": true", recovery.reason.as_str(), recovery.owner.as_str())]
    RecoveryRequired {
        /// The key.
        key: Key,
        /// The retained record.
        recovery: Box<RecoveryRecord>,
    },
    /// 409: the token is not the key's live lease.
    #[error(
        "token {token} is not the live lease of key {key:?}: it expired, was released, or was superseded; stop working on the key and acquire it again"
    )]
    LeaseLost {
        /// The key.
        key: Key,
        /// The token presented.
        token: i64,
    },
    /// 409: a fenced write was refused (`stale_token` or `unknown_token`).
    #[error("{}", refusal_detail(key, refusal))]
    Refused {
        /// The key.
        key: Key,
        /// The refusal, already in the audit log.
        refusal: Refusal,
    },
    /// 401: credentials are required, or the ones sent are not a live key's.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// 403: the key may not do this, or not to this key.
    #[error("{0}")]
    Forbidden(String),
    /// 412: `If-Match` did not match.
    #[error(
        "If-Match matches no current snapshot (another ETag, or none yet); GET it again and retry with its ETag, or leave If-Match out to write the first one"
    )]
    PreconditionFailed,
    /// 412: a transaction's op's precondition did not hold.
    #[error(
        "the precondition of op {op_index} (if_match or if_none_match) does not hold; nothing of the transaction was written. GET the key again and retry with its ETag"
    )]
    OpPreconditionFailed {
        /// The op, from 0.
        op_index: usize,
    },
    /// 404: nothing at this address.
    #[error("{0}")]
    NotFound(String),
    /// 405: the path exists but not with this method.
    #[error("this path does not accept that method; see openapi.yaml for the methods it takes")]
    MethodNotAllowed,
    /// 413: the body is over the limit.
    #[error("the body is over this server's limit of {limit} bytes; nothing was stored. {hint}")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
        /// What the client can do about it.
        hint: &'static str,
    },
    /// 429: the API key is at its cap of requests in flight, or over its rate.
    #[error("{0}")]
    TooManyRequests(Throttled),
    /// 503: the service cannot answer now; nothing was changed.
    #[error("{0}; nothing was changed. Retry with backoff")]
    Unavailable(Unavailability),
    /// 408: the body did not arrive within the body timeout; nothing was read into the store.
    #[error(
        "the request body did not arrive within {0:?}; nothing was stored. Send it faster, or in smaller snapshots"
    )]
    RequestTimeout(std::time::Duration),
    /// 431: the request's headers are over the limit.
    #[error(
        "the request headers are {size} bytes, over this server's limit of {limit}; send fewer or smaller headers"
    )]
    HeadersTooLarge {
        /// Their size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// 414: the request target is over the limit (`size` is unknown when hyper measured it).
    #[error("{}", uri_detail(*size, *limit))]
    UriTooLong {
        /// Its size, when known.
        size: Option<usize>,
        /// The limit.
        limit: usize,
    },
    /// 431: the head is over hyper's own limits (`crate::conn::HeadLimits`).
    #[error(
        "the request head (request line and headers) is over this server's limit of {bytes} bytes or {fields} header fields; send fewer or smaller headers"
    )]
    HeadTooLarge {
        /// The limit in bytes.
        bytes: usize,
        /// The limit in header fields.
        fields: usize,
    },
    /// 422: the Idempotency-Key was used before for another request; nothing changed.
    #[error(
        "Idempotency-Key {0:?} was used before for a different request (another key, token, body or precondition); nothing was changed. Send a new key for a new request"
    )]
    IdempotencyKeyReused(IdempotencyKey),
    /// 409: another request with this Idempotency-Key is running; nothing changed.
    #[error(
        "a request with Idempotency-Key {0:?} is still running; nothing was changed by this one. Retry after Retry-After to get its answer"
    )]
    RequestInProgress(IdempotencyKey),
    /// 503 indeterminate with an Idempotency-Key to retry with.
    #[error(
        "{}. Send it again with the same Idempotency-Key {key:?}: the answer then says what happened, and nothing is done twice",
        INDETERMINATE_OUTCOME
    )]
    IndeterminateRetry {
        /// The failure.
        cause: Arc<StoreError>,
        /// The request's Idempotency-Key.
        key: IdempotencyKey,
    },
    /// 410: a watch resumed from a change older than the retained history.
    #[error(
        "change {since} is older than the retained history, which starts after change {horizon}: the changes between are gone. Read the current state of the keys, then watch again without since (or Last-Event-ID)"
    )]
    Compacted {
        /// The id the watch asked to resume after.
        since: ChangeId,
        /// The highest id pruned.
        horizon: ChangeId,
    },
    /// 500: a bug. The cause is logged, never sent.
    #[error("internal error; it was logged with this request's x-request-id")]
    Internal,
    /// The store failed: `503 unavailable`, `503 indeterminate` or `500`; the cause is logged,
    /// never sent.
    #[error("{}", database_detail(.0))]
    Database(Arc<StoreError>),
}

fn uri_detail(size: Option<usize>, limit: usize) -> String {
    let size = size.map_or_else(String::new, |n| format!("{n} bytes, "));
    format!(
        "the request target is {size}over this server's limit of {limit} bytes; a key is at most 512 bytes (1536 percent-encoded), so send a shorter path and query"
    )
}

fn database_detail(e: &StoreError) -> String {
    match e {
        StoreError::Unavailable(_) => ApiError::Unavailable(Unavailability::Database).to_string(),
        StoreError::Indeterminate(_) => format!("{INDETERMINATE_OUTCOME}. {INDETERMINATE_NEXT}"),
        StoreError::Internal(_) | StoreError::Migrate(_) => ApiError::Internal.to_string(),
    }
}

const INDETERMINATE_OUTCOME: &str = "the request reached the database, but its answer did not \
    come back in time (the link broke, or the deadline passed): it may or may not have taken effect";

const INDETERMINATE_NEXT: &str = "Read the key (GET its lease or snapshot) to see what happened \
    before you retry, or send changing calls with an Idempotency-Key, which makes a retry safe";

/// The cause of a failed store call, left on its response for [`log_errors`].
#[derive(Debug, Clone)]
pub struct ErrorCause(pub Arc<StoreError>);

/// Logs each [`ErrorCause`] once in the request's span: unavailability as a warning, else an error.
pub async fn log_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let response = next.run(req).await;
    if let Some(ErrorCause(cause)) = response.extensions().get::<ErrorCause>() {
        match &**cause {
            StoreError::Unavailable(e) => tracing::warn!(error = %e, "database unavailable"),
            StoreError::Indeterminate(e) => {
                tracing::warn!(error = %e, "the outcome of a change is unknown");
            }
            StoreError::Internal(_) | StoreError::Migrate(_) => {
                tracing::error!(error = ?cause, "database error");
            }
        }
    }
    response
}

fn held_detail(key: &Key, holder: &Holder, state: LeaseState, waiters: Option<i64>) -> String {
    let ended = match state {
        LeaseState::Held => {
            return format!(
                "key {key:?} is held by {:?} until {}; retry once it expires or is released",
                holder.owner,
                holder
                    .expires_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            );
        }
        LeaseState::Released => "was released",
        LeaseState::Expired => "expired",
        LeaseState::RecoveryPending => "has no live lease",
    };
    let to = match waiters {
        Some(1) => "the waiting acquire queued before this request".to_owned(),
        Some(n) => format!("the first of the {n} waiting acquires queued before this request"),
        None => "a waiting acquire queued before this request".to_owned(),
    };
    format!(
        "key {key:?} {ended} (last held by {:?}), and goes to {to}: send wait_ms to queue behind them",
        holder.owner
    )
}

fn refusal_detail(key: &Key, r: &Refusal) -> String {
    let highest = r.highest.map_or_else(
        || "none (the key never had a lease)".to_owned(),
        |t| t.to_string(),
    );
    let fence = if &r.fence == key {
        format!("key {key:?}")
    } else {
        format!("key {key:?} under the fence {:?}", r.fence)
    };
    match r.reason {
        RefusalReason::StaleToken => format!(
            "token {} is stale for {fence} (newest token {highest}, or its lease was released or abandoned, \
             or a newer token wrote the key): this holder was superseded. Stop writing and acquire the \
             key again; the refusal is audit row {}",
            r.presented, r.audit_id
        ),
        RefusalReason::UnknownToken => format!(
            "token {} was never issued for {fence} (newest token {highest}): write with the token of \
             your own grant; the refusal is audit row {}",
            r.presented, r.audit_id
        ),
    }
}

impl ApiError {
    /// The code's status, except targets or headers over the limit (414 or 431).
    pub fn status(&self) -> StatusCode {
        match self {
            Self::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            Self::HeadersTooLarge { .. } | Self::HeadTooLarge { .. } => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            other => StatusCode::from_u16(other.code().status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// The contract's stable machine-readable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::InvalidRequest(_)
            | Self::UriTooLong { .. }
            | Self::HeadersTooLarge { .. }
            | Self::HeadTooLarge { .. } => ErrorCode::InvalidRequest,
            Self::TokenRequired => ErrorCode::TokenRequired,
            Self::LeaseHeld { .. } => ErrorCode::LeaseHeld,
            Self::RecoveryRequired { .. } => ErrorCode::RecoveryRequired,
            Self::LeaseLost { .. } => ErrorCode::LeaseLost,
            Self::Refused { refusal, .. } => refusal.reason.code(),
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::Forbidden(_) => ErrorCode::Forbidden,
            Self::PreconditionFailed | Self::OpPreconditionFailed { .. } => {
                ErrorCode::PreconditionFailed
            }
            Self::NotFound(_) => ErrorCode::NotFound,
            Self::MethodNotAllowed => ErrorCode::MethodNotAllowed,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::TooManyRequests(_) => ErrorCode::TooManyRequests,
            Self::Unavailable(_) => ErrorCode::Unavailable,
            Self::RequestTimeout(_) => ErrorCode::RequestTimeout,
            Self::Internal => ErrorCode::Internal,
            Self::Compacted { .. } => ErrorCode::Compacted,
            Self::IdempotencyKeyReused(_) => ErrorCode::IdempotencyKeyReused,
            Self::RequestInProgress(_) => ErrorCode::RequestInProgress,
            Self::IndeterminateRetry { .. } => ErrorCode::Indeterminate,
            Self::Database(e) => match **e {
                StoreError::Unavailable(_) => ErrorCode::Unavailable,
                StoreError::Indeterminate(_) => ErrorCode::Indeterminate,
                StoreError::Internal(_) | StoreError::Migrate(_) => ErrorCode::Internal,
            },
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            Self::TooManyRequests(throttled) => Some(throttled.retry_after()),
            _ => matches!(
                self.code(),
                ErrorCode::Unavailable | ErrorCode::Indeterminate | ErrorCode::RequestInProgress
            )
            .then_some(1),
        }
    }

    fn problem(&self) -> Problem {
        let status = self.status();
        let mut problem = Problem::new(
            self.code(),
            status.canonical_reason().unwrap_or("Error"),
            self.to_string(),
        );
        problem.status = Some(status.as_u16());
        match self {
            Self::LeaseHeld {
                holder,
                state,
                waiters,
                ..
            } => {
                problem.holder = Some((**holder).clone());
                problem.state = Some(*state);
                problem.waiters = *waiters;
            }
            Self::RecoveryRequired { recovery, .. } => {
                problem.recovery = Some((**recovery).clone());
            }
            Self::Refused { refusal, .. } => {
                problem.refusal = Some(RefusalFields {
                    presented_token: refusal.presented,
                    highest_token: refusal.highest,
                    audit_id: AuditId(refusal.audit_id),
                });
                problem.fencing_key = Some(refusal.fence.clone());
            }
            Self::OpPreconditionFailed { op_index } => problem.op_index = Some(*op_index),
            _ => {}
        }
        problem
    }

    pub(crate) fn problem_json(&self) -> String {
        serde_json::to_string(&self.problem()).expect("a problem serializes")
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        Self::InvalidRequest(e.0)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        Self::Database(Arc::new(e))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), self.problem_json()).into_response();
        let code = self.code();
        response.extensions_mut().insert(code);
        if let Self::Database(cause) | Self::IndeterminateRetry { cause, .. } = &self {
            response.extensions_mut().insert(ErrorCause(cause.clone()));
        }
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if code == ErrorCode::Unauthorized {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
