//! An [`ApiError`] as a response: its status and code, the problem+json body, `Retry-After`, and
//! the middleware that logs a store failure's cause once.

use std::sync::Arc;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{ApiError, Throttled};
use crate::domain::headers::PROBLEM_JSON;
use crate::domain::{AuditId, ErrorCode, Problem, RefusalFields};
use crate::store::StoreError;

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
        // A waiter refused frees its connection too, so a flood of them cannot hold every
        // connection the instance may keep.
        if let Self::TooManyRequests(
            Throttled::Waiters { .. } | Throttled::InstanceWaiters { .. },
        ) = &self
        {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}
