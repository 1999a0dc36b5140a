//! [`Error`]: every way a call of the [`Client`](super::Client) can fail, one variant per code of
//! the contract, plus the failures of the transport and of answers that are not the contract's.

use std::fmt;

use reqwest::StatusCode;
use reqwest::header::HeaderMap;

use snapfence_types::headers::{PROBLEM_JSON, REQUEST_ID};
use snapfence_types::{AuditId, FencingToken, RecoveryRecord};
use snapfence_types::{ErrorCode, Holder, LeaseState, Problem, RefusalFields};

/// A failed call. Variants that the server answered carry its `detail`, which says what happened
/// and what to do next; their `Display` is that detail.
///
/// # Did a failed write take effect?
///
/// For a read it does not matter: reads change nothing. A write (acquire, renew, release,
/// abandon, require-recovery, reconciled, put, delete) is sent with a fresh `Idempotency-Key`, the same on
/// every attempt, so the server does it at most once, and a retry after an unknown outcome is
/// answered with what happened (the grant, the version, the refusal); the client retries such
/// failures up to [`RetryPolicy::max_attempts`](super::RetryPolicy) (the server keeps the
/// answers for 24 h by default). Every answer with a contract code is definite: the server did
/// that, or refused it and changed nothing but the audit log. [`Error::is_indeterminate`] is
/// true when even the last attempt left the outcome unknown: [`Error::Indeterminate`] (the
/// server's own word for it), a connection that broke or timed out after the request was sent,
/// a 5xx answer that is not one of the contract's, or an answer that could not be read.
///
/// Resolve such a write by reading:
/// - a put: [`Client::find_write`](super::Client::find_write) looks for a retained version with
///   your token and the ETag of your body (or GET the snapshot and compare its `ETag`,
///   `Fencing-Token` and `Snapshot-Version` headers with what you sent);
/// - a delete: GET the snapshot; `404` means it is gone;
/// - an acquire: [`Client::lease_status`](super::Client::lease_status) shows who holds the key; a
///   lease granted to you whose token you never learnt cannot be used, so wait for it to expire
///   (a `crash_recovery` lease then leaves a recovery record);
/// - a release or abandon: the key's status shows whether your token is still its live lease.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `400 invalid_request`: malformed input (a bad key, a TTL out of the server's bounds…).
    /// Also what the client answers, without sending anything, for input it can tell is invalid.
    #[error("{detail}")]
    InvalidRequest {
        /// What was wrong.
        detail: String,
    },
    /// `428 token_required`: a fenced call without a `Fencing-Token`.
    #[error("{detail}")]
    TokenRequired {
        /// The server's explanation.
        detail: String,
    },
    /// `409 lease_held`: another lease on the key is live, or the key is free and goes to
    /// waiting acquires queued before this one (`state` then says how it became free).
    #[error("{detail}")]
    LeaseHeld {
        /// Who holds it, and until when; on a free key, who held it last.
        holder: Box<Holder>,
        /// The key's state as the acquire found it: `held`, or a free state while the key goes
        /// to `waiters`. `None` from a server that does not say.
        state: Option<LeaseState>,
        /// On a free key, how many waiting acquires are queued before this one.
        waiters: Option<i64>,
        /// The server's explanation.
        detail: String,
    },
    /// `409 recovery_required`: a recovery record blocks the grant until it is reconciled.
    #[error("{detail}")]
    RecoveryRequired {
        /// The retained record.
        recovery: Box<RecoveryRecord>,
        /// The server's explanation.
        detail: String,
    },
    /// `409 lease_lost`: the token is not the key's live lease. A holder that sees this must
    /// stop working on the key.
    #[error("{detail}")]
    LeaseLost {
        /// The server's explanation.
        detail: String,
    },
    /// `409 stale_token`: a fenced write with a superseded token, or the token of a lease its
    /// holder released or abandoned. Recorded in the audit log.
    #[error("{detail}")]
    StaleToken {
        /// The token sent.
        presented: FencingToken,
        /// The key's newest token.
        highest: FencingToken,
        /// The refusal's row in the audit log.
        audit_id: AuditId,
        /// The server's explanation.
        detail: String,
    },
    /// `409 unknown_token`: a fenced write with a token never issued for the key. Recorded in the
    /// audit log.
    #[error("{detail}")]
    UnknownToken {
        /// The token sent.
        presented: FencingToken,
        /// The key's newest token, or `None` for a key that never had a lease.
        highest: Option<FencingToken>,
        /// The refusal's row in the audit log.
        audit_id: AuditId,
        /// The server's explanation.
        detail: String,
    },
    /// `412 precondition_failed`: `If-Match` did not match the current snapshot.
    #[error("{detail}")]
    PreconditionFailed {
        /// For a transaction (v1.3): the op, from 0, whose precondition failed.
        op_index: Option<usize>,
        /// The server's explanation.
        detail: String,
    },
    /// `404 not_found`: no such lease, snapshot or version.
    #[error("{detail}")]
    NotFound {
        /// The server's explanation.
        detail: String,
    },
    /// `413 payload_too_large`: the body is over the server's limit; nothing was stored.
    #[error("{detail}")]
    PayloadTooLarge {
        /// The server's explanation.
        detail: String,
    },
    /// `401 unauthorized`: authentication is configured and the request had none that passed.
    #[error("{detail}")]
    Unauthorized {
        /// The server's explanation.
        detail: String,
    },
    /// `403 forbidden`: authenticated, but not allowed.
    #[error("{detail}")]
    Forbidden {
        /// The server's explanation.
        detail: String,
    },
    /// `503 unavailable`: the server cannot reach its database; nothing was changed, so any
    /// call may be retried.
    #[error("{detail}")]
    Unavailable {
        /// The server's explanation.
        detail: String,
    },
    /// `503 indeterminate`: the server sent the call to its database and cannot tell whether it
    /// committed (the link broke, or the deadline passed, after sending). A write may or may not
    /// have taken effect: see [`Error`] for how to find out. A read changed nothing either way.
    #[error("{detail}")]
    Indeterminate {
        /// The server's explanation.
        detail: String,
    },
    /// `422 idempotency_key_reused`: the call's `Idempotency-Key` was used before for another
    /// request. The client makes a fresh key for every call, so this means a bug (or a
    /// collision of random keys, which 122 random bits make negligible); nothing changed.
    #[error("{detail}")]
    IdempotencyKeyReused {
        /// The server's explanation.
        detail: String,
    },
    /// `429 too_many_requests`: the API key is at its limit of requests in flight, or of its
    /// rate, on the server; nothing changed. The client retries after `retry_after`.
    #[error("{detail}")]
    TooManyRequests {
        /// The server's explanation.
        detail: String,
        /// The answer's `Retry-After`, when it had one.
        retry_after: Option<std::time::Duration>,
    },
    /// `409 request_in_progress`: an earlier attempt of this call (same `Idempotency-Key`) is
    /// still running on the server; the client retries, and the retry gets that attempt's
    /// answer. Nothing changed by this attempt.
    #[error("{detail}")]
    RequestInProgress {
        /// The server's explanation.
        detail: String,
    },
    /// `410 compacted`: a watch asked to resume after a change older than the retained history,
    /// so the changes since then can no longer be told. Read the current state of the keys,
    /// then watch again without `since` (or from [`ChangeId::ORIGIN`](snapfence_types::ChangeId::ORIGIN)).
    #[error("{detail}")]
    Compacted {
        /// The server's explanation.
        detail: String,
    },
    /// The request or its answer did not make it across the network: no connection, a
    /// connection that broke, or a timeout.
    #[error("{}", transport_message(*may_have_reached))]
    Transport {
        /// `false` when the connection could not even be made, so nothing reached the server;
        /// `true` when the request may have been (partly or wholly) received.
        may_have_reached: bool,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// An answer the contract does not name: a status without a contract code (a proxy's 502,
    /// a 500 internal error, …).
    #[error("the server answered {status}: {detail}")]
    Unexpected {
        /// The HTTP status.
        status: StatusCode,
        /// The `detail` of a problem body, or the start of the body.
        detail: String,
        /// The answer's `x-request-id`, to find the server's log of it.
        request_id: Option<String>,
    },
    /// An answer that should follow the contract but does not: a body that is not the JSON of
    /// the contract, a missing header. Is the URL a snapfence server?
    #[error("{detail}")]
    Protocol {
        /// What did not fit.
        detail: String,
    },
}

fn transport_message(may_have_reached: bool) -> &'static str {
    if may_have_reached {
        "the connection failed after the request was sent, so it may or may not have taken effect"
    } else {
        "could not connect to the server, so nothing was sent"
    }
}

impl Error {
    /// The last attempt's failure as it reads for the whole call when an earlier attempt's
    /// outcome was unknown: an answer that only says this attempt changed nothing
    /// (`unavailable`, `429`, `request_in_progress`, no connection) leaves the call
    /// [`Indeterminate`](Self::Indeterminate); any other answer settles it and is kept.
    pub(crate) fn after_unknown_attempt(self, call: &dyn fmt::Display) -> Self {
        let this_attempt_only = matches!(
            self,
            Self::Unavailable { .. }
                | Self::TooManyRequests { .. }
                | Self::RequestInProgress { .. }
                | Self::Transport {
                    may_have_reached: false,
                    ..
                }
        );
        if !this_attempt_only {
            return self;
        }
        Self::Indeterminate {
            detail: format!(
                "an earlier attempt of {call} may have taken effect (its answer was lost), and \
                 the last attempt said only that it changed nothing itself ({self}); check \
                 what happened before you retry"
            ),
        }
    }

    /// How long the server asked the client to wait before it retries, if it said so.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::TooManyRequests { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether a write that failed this way may still have been applied; see [`Error`] for how
    /// to find out. Always `false` for an answer with a contract code: those changed nothing.
    pub fn is_indeterminate(&self) -> bool {
        match self {
            Self::Transport {
                may_have_reached, ..
            } => *may_have_reached,
            Self::Unexpected { status, .. } => status.is_server_error(),
            Self::Indeterminate { .. } | Self::Protocol { .. } => true,
            _ => false,
        }
    }

    /// Whether the same call may succeed later without anything else changing: the network,
    /// a 5xx, a limit of the server (429), an unreadable answer. The client retries these,
    /// writes included: they carry an Idempotency-Key, so a retry never does a change twice.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Transport { .. }
            | Self::Unavailable { .. }
            | Self::Indeterminate { .. }
            | Self::TooManyRequests { .. }
            | Self::Protocol { .. } => true,
            Self::Unexpected { status, .. } => status.is_server_error(),
            _ => false,
        }
    }

    /// The contract's `code` for an error the server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        Some(match self {
            Self::InvalidRequest { .. } => ErrorCode::InvalidRequest,
            Self::TokenRequired { .. } => ErrorCode::TokenRequired,
            Self::LeaseHeld { .. } => ErrorCode::LeaseHeld,
            Self::RecoveryRequired { .. } => ErrorCode::RecoveryRequired,
            Self::LeaseLost { .. } => ErrorCode::LeaseLost,
            Self::StaleToken { .. } => ErrorCode::StaleToken,
            Self::UnknownToken { .. } => ErrorCode::UnknownToken,
            Self::PreconditionFailed { .. } => ErrorCode::PreconditionFailed,
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Self::Unauthorized { .. } => ErrorCode::Unauthorized,
            Self::Forbidden { .. } => ErrorCode::Forbidden,
            Self::Unavailable { .. } => ErrorCode::Unavailable,
            Self::Indeterminate { .. } => ErrorCode::Indeterminate,
            Self::IdempotencyKeyReused { .. } => ErrorCode::IdempotencyKeyReused,
            Self::RequestInProgress { .. } => ErrorCode::RequestInProgress,
            Self::TooManyRequests { .. } => ErrorCode::TooManyRequests,
            Self::Compacted { .. } => ErrorCode::Compacted,
            Self::Transport { .. } | Self::Unexpected { .. } | Self::Protocol { .. } => {
                return None;
            }
        })
    }

    /// A transport failure, classified by whether anything can have reached the server: only a
    /// failure to connect proves that nothing did.
    pub(super) fn transport(source: reqwest::Error) -> Self {
        Self::Transport {
            may_have_reached: !source.is_connect(),
            source,
        }
    }

    /// Input the client refuses before sending anything.
    pub(super) fn invalid(detail: impl Into<String>) -> Self {
        Self::InvalidRequest {
            detail: detail.into(),
        }
    }

    /// The error a non-success answer stands for. `what` names the request, for answers that
    /// carry no explanation of their own (a `HEAD`, a proxy's page).
    pub(super) fn from_answer(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        what: &dyn fmt::Display,
    ) -> Self {
        let request_id = headers
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let is_problem = headers
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with(PROBLEM_JSON));
        if is_problem && !body.is_empty() {
            match serde_json::from_slice::<Problem>(body) {
                Ok(problem) => {
                    if let Some(e) = decode(problem, status, request_id.clone(), headers) {
                        return e;
                    }
                }
                Err(e) => {
                    return Self::Protocol {
                        detail: format!(
                            "the {status} answer to {what} is not a problem of the contract: {e}"
                        ),
                    };
                }
            }
        }
        let detail = format!(
            "{status} to {what}{}",
            snippet(body).map_or_else(String::new, |s| format!(": {s}"))
        );
        match status {
            StatusCode::NOT_FOUND => Self::NotFound { detail },
            StatusCode::UNAUTHORIZED => Self::Unauthorized { detail },
            StatusCode::FORBIDDEN => Self::Forbidden { detail },
            StatusCode::PAYLOAD_TOO_LARGE => Self::PayloadTooLarge { detail },
            _ => Self::Unexpected {
                status,
                detail: snippet(body).unwrap_or_else(|| format!("no explanation, to {what}")),
                request_id,
            },
        }
    }
}

/// An answer's `Retry-After` in seconds (the form the server sends; an HTTP date is ignored).
fn retry_after(headers: &HeaderMap) -> Option<std::time::Duration> {
    let seconds = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    seconds
        .trim()
        .parse()
        .ok()
        .map(std::time::Duration::from_secs)
}

/// The first line of a body that is text, for messages about answers that are not the
/// contract's.
fn snippet(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?.trim();
    let line = text.lines().next()?.trim();
    if line.is_empty() {
        return None;
    }
    Some(line.chars().take(200).collect())
}

/// The variant of a problem's code; `None` for a code without a variant of its own (one the
/// contract does not name, or a 5xx/405/408 the client judges by its status). A code whose
/// members are missing is a protocol error.
fn decode(
    problem: Problem,
    status: StatusCode,
    request_id: Option<String>,
    headers: &HeaderMap,
) -> Option<Error> {
    let name = problem.code?;
    let detail = problem
        .detail
        .or(problem.title)
        .unwrap_or_else(|| name.clone());
    let missing = |field: &str| Error::Protocol {
        detail: format!("a {name} problem without its `{field}` member: {detail}"),
    };
    let unexpected = || Error::Unexpected {
        status,
        detail: detail.clone(),
        request_id: request_id.clone(),
    };
    let Some(code) = ErrorCode::parse(&name) else {
        return Some(unexpected());
    };
    Some(match code {
        ErrorCode::InvalidRequest => Error::InvalidRequest { detail },
        ErrorCode::TokenRequired => Error::TokenRequired { detail },
        ErrorCode::LeaseHeld => match problem.holder {
            Some(holder) => Error::LeaseHeld {
                holder: Box::new(holder),
                state: problem.state,
                waiters: problem.waiters,
                detail,
            },
            None => missing("holder"),
        },
        ErrorCode::RecoveryRequired => match problem.recovery {
            Some(recovery) => Error::RecoveryRequired {
                recovery: Box::new(recovery),
                detail,
            },
            None => missing("recovery"),
        },
        ErrorCode::LeaseLost => Error::LeaseLost { detail },
        ErrorCode::StaleToken => match problem.refusal {
            Some(RefusalFields {
                presented_token,
                highest_token: Some(highest),
                audit_id,
            }) => Error::StaleToken {
                presented: presented_token,
                highest,
                audit_id,
                detail,
            },
            Some(_) => missing("highest_token"),
            None => missing("presented_token"),
        },
        ErrorCode::UnknownToken => match problem.refusal {
            Some(r) => Error::UnknownToken {
                presented: r.presented_token,
                highest: r.highest_token,
                audit_id: r.audit_id,
                detail,
            },
            None => missing("presented_token"),
        },
        ErrorCode::PreconditionFailed => Error::PreconditionFailed {
            op_index: problem.op_index,
            detail,
        },
        ErrorCode::NotFound => Error::NotFound { detail },
        ErrorCode::PayloadTooLarge => Error::PayloadTooLarge { detail },
        ErrorCode::Unauthorized => Error::Unauthorized { detail },
        ErrorCode::Forbidden => Error::Forbidden { detail },
        ErrorCode::Unavailable => Error::Unavailable { detail },
        ErrorCode::Indeterminate => Error::Indeterminate { detail },
        ErrorCode::IdempotencyKeyReused => Error::IdempotencyKeyReused { detail },
        ErrorCode::RequestInProgress => Error::RequestInProgress { detail },
        ErrorCode::TooManyRequests => Error::TooManyRequests {
            detail,
            retry_after: retry_after(headers),
        },
        ErrorCode::Compacted => Error::Compacted { detail },
        _ => unexpected(),
    })
}
