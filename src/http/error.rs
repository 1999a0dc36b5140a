//! The one place where anything becomes an HTTP error: [`ApiError`] and its problem+json body
//! (RFC 9457) with the contract's stable `code`. Handlers return `Result<_, ApiError>`; store
//! errors convert with `?`, and refusals (which are outcomes, not errors) are mapped by the
//! handler that knows the operation.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::domain::{InvalidInput, Key, Lease, RecoveryRecord, rfc3339_millis};
use crate::store::StoreError;
use crate::store::snapshots::{Refusal, RefusalReason};

/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `holder` of a `lease_held` answer: who holds the key and until when. The holder's token
/// is not shown, so a competitor cannot borrow it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// The holder's owner name.
    pub owner: String,
    /// When the live lease was granted.
    #[serde(with = "rfc3339_millis")]
    pub acquired_at: chrono::DateTime<chrono::Utc>,
    /// When it expires unless renewed.
    #[serde(with = "rfc3339_millis")]
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// Its metadata.
    pub metadata: Option<Value>,
}

impl From<&Lease> for Holder {
    fn from(l: &Lease) -> Self {
        Self {
            owner: l.owner.as_str().to_owned(),
            acquired_at: l.acquired_at,
            expires_at: l.expires_at,
            metadata: l.metadata.as_ref().map(|m| m.as_json().clone()),
        }
    }
}

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
}

/// The contract code of an error answer, left on the response for the metrics middleware.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

/// Every error the API answers with, one variant per contract code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: malformed JSON, a bad key, a TTL out of bounds, a bad header, an unknown field.
    #[error("{0}")]
    InvalidRequest(String),
    /// 428: a fenced call without `Fencing-Token`.
    #[error("this call is fenced: send the token of your lease grant as `Fencing-Token: <token>`")]
    TokenRequired,
    /// 409: another lease is live.
    #[error("key {key:?} is held by {:?} until {}; retry once it expires or is released", holder.owner, holder.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))]
    LeaseHeld {
        /// The key.
        key: Key,
        /// The live lease.
        holder: Box<Holder>,
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
    /// 500: a bug. The cause is logged, never sent.
    #[error("internal error; it was logged with this request's x-request-id")]
    Internal,
}

fn refusal_detail(key: &Key, r: &Refusal) -> String {
    let highest = r.highest.map_or_else(
        || "none (the key never had a lease)".to_owned(),
        |t| t.to_string(),
    );
    match r.reason {
        RefusalReason::StaleToken => format!(
            "token {} is stale for key {key:?} (newest token {highest}, or its lease was released or abandoned): \
             this holder was superseded. Stop writing and acquire the key again; the refusal is audit row {}",
            r.presented, r.audit_id
        ),
        RefusalReason::UnknownToken => format!(
            "token {} was never issued for key {key:?} (newest token {highest}): write with the token of \
             your own grant; the refusal is audit row {}",
            r.presented, r.audit_id
        ),
    }
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            Self::TokenRequired => StatusCode::PRECONDITION_REQUIRED,
            Self::LeaseHeld { .. }
            | Self::RecoveryRequired { .. }
            | Self::LeaseLost { .. }
            | Self::Refused { .. } => StatusCode::CONFLICT,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The contract's stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidRequest(_) => "invalid_request",
            Self::TokenRequired => "token_required",
            Self::LeaseHeld { .. } => "lease_held",
            Self::RecoveryRequired { .. } => "recovery_required",
            Self::LeaseLost { .. } => "lease_lost",
            Self::Refused { refusal, .. } => refusal.reason.as_str(),
            Self::Unauthorized(_) => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::PreconditionFailed => "precondition_failed",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::Unavailable(_) => "unavailable",
            Self::HeadersTooLarge { .. } => "invalid_request",
            Self::RequestTimeout(_) => "request_timeout",
            Self::Internal => "internal",
        }
    }

    /// The fields the contract adds to the problem for this code.
    fn extensions(&self) -> Map<String, Value> {
        let value = match self {
            Self::LeaseHeld { holder, .. } => json!({ "holder": holder }),
            Self::RecoveryRequired { recovery, .. } => json!({ "recovery": recovery }),
            Self::Refused { refusal, .. } => json!({
                "presented_token": refusal.presented,
                "highest_token": refusal.highest,
                "audit_id": refusal.audit_id,
            }),
            _ => json!({}),
        };
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        Self::InvalidRequest(e.0)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(cause) => {
                tracing::warn!(error = %cause, "database unavailable");
                Self::Unavailable(Unavailability::Database)
            }
            other => {
                tracing::error!(error = ?other, "database error");
                Self::Internal
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let mut body = Map::new();
        body.insert(
            "type".into(),
            json!(format!("urn:snapfence:problem:{}", self.code())),
        );
        body.insert(
            "title".into(),
            json!(status.canonical_reason().unwrap_or("Error")),
        );
        body.insert("status".into(), json!(status.as_u16()));
        body.insert("detail".into(), json!(self.to_string()));
        body.insert("code".into(), json!(self.code()));
        body.extend(self.extensions());
        let mut response = (status, Value::Object(body).to_string()).into_response();
        response.extensions_mut().insert(ErrorCode(self.code()));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        match self {
            Self::Unavailable(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            Self::Unauthorized(_) => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}
