//! Where anything becomes an HTTP error: [`ApiError`] as problem+json (RFC 9457) with the
//! contract's `code`. The enum is here; the refusals' reasons (`reasons.rs`), the detail texts
//! (`detail.rs`) and the response with its logging (`response.rs`) each have a module.

mod detail;
mod reasons;
mod response;

use std::sync::Arc;

use crate::domain::{
    ChangeId, Holder, IdempotencyKey, InvalidInput, Key, LeaseState, RecoveryRecord,
};
use crate::store::StoreError;
use crate::store::snapshots::Refusal;
use detail::{INDETERMINATE_OUTCOME, database_detail, held_detail, refusal_detail, uri_detail};
pub use reasons::{Throttled, Unavailability, WATCH_RETRY_AFTER};
pub use response::{ErrorCause, log_errors};

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
