//! The contract's error codes and the problem+json body (RFC 9457) that carries them.

use serde::{Deserialize, Serialize};

use super::{AuditId, FencingToken, Holder, Key, LeaseState, RecoveryRecord};

/// Declares [`ErrorCode`] from one table, so that the name, the status and the meaning of a
/// code are written once.
macro_rules! codes {
    ($($variant:ident = $name:literal, $status:literal, $meaning:literal;)*) => {
        /// Every `code` a problem of the service can carry: the contract's table, and the few
        /// codes the service adds for what the contract leaves to HTTP (405, 408, 500).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        #[non_exhaustive]
        pub enum ErrorCode {
            $(
                #[doc = $meaning]
                $variant,
            )*
        }

        impl ErrorCode {
            /// Every code, in the contract's order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The machine-readable name, as sent in `code`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The HTTP status the code is answered with.
            pub fn status(self) -> u16 {
                match self {
                    $(Self::$variant => $status,)*
                }
            }

            /// When the code is answered, in a few words.
            pub fn meaning(self) -> &'static str {
                match self {
                    $(Self::$variant => $meaning,)*
                }
            }

            /// The code of a name; `None` for a name this version does not know (a newer
            /// server's), which a client then judges by the status alone.
            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    InvalidRequest = "invalid_request", 400, "Malformed JSON, a bad key, a TTL out of bounds, a bad header value, an unknown field.";
    TokenRequired = "token_required", 428, "A fenced call without a `Fencing-Token` header.";
    LeaseHeld = "lease_held", 409, "Acquire while another lease is live, or while the free key goes to waiters queued first; the problem has `holder` and `state` (and `waiters` on a free key).";
    RecoveryRequired = "recovery_required", 409, "Acquire while a recovery record is retained; the problem has `recovery`.";
    LeaseLost = "lease_lost", 409, "Renew, release, abandon or require-recovery with a token that is not the key's live lease.";
    StaleToken = "stale_token", 409, "A fenced write with a token below the key's newest, or of a released or abandoned lease; audited.";
    UnknownToken = "unknown_token", 409, "A fenced write with a token above the key's newest, or on a key never leased; audited.";
    PreconditionFailed = "precondition_failed", 412, "`If-Match` was given and does not match the current snapshot.";
    NotFound = "not_found", 404, "No such lease, snapshot, version or endpoint.";
    MethodNotAllowed = "method_not_allowed", 405, "The path exists but does not take this method.";
    RequestTimeout = "request_timeout", 408, "The request body did not arrive within the body timeout.";
    PayloadTooLarge = "payload_too_large", 413, "The body is over the configured limit.";
    Unauthorized = "unauthorized", 401, "Authentication is configured and the request has no live key.";
    Forbidden = "forbidden", 403, "The API key may not do this, or not to this key.";
    Internal = "internal", 500, "A bug; logged with the request's `x-request-id`, never detailed.";
    Unavailable = "unavailable", 503, "The database cannot be reached and the request had no effect.";
    Indeterminate = "indeterminate", 503, "The request was sent to the database and its outcome is unknown.";
    IdempotencyKeyReused = "idempotency_key_reused", 422, "An `Idempotency-Key` seen before with a different request.";
    RequestInProgress = "request_in_progress", 409, "An `Idempotency-Key` whose first request is still running; retry after `Retry-After`.";
    TooManyRequests = "too_many_requests", 429, "A per-API-key limit (requests in flight, or rate) is reached; `Retry-After` says when to retry.";
    Compacted = "compacted", 410, "A watch resumed from a change that is no longer retained; watch again without `since` (or from 0) and reread the state.";
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A problem+json body: the members every problem has, and those that some codes add.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// `urn:snapfence:problem:<code>`.
    #[serde(rename = "type", default)]
    pub type_uri: Option<String>,
    /// The status's reason phrase.
    #[serde(default)]
    pub title: Option<String>,
    /// The HTTP status.
    #[serde(default)]
    pub status: Option<u16>,
    /// What happened and what to do next.
    #[serde(default)]
    pub detail: Option<String>,
    /// The machine-readable code; kept as text so that a code this version does not know
    /// still reads (see [`ErrorCode::parse`]).
    #[serde(default)]
    pub code: Option<String>,
    /// `lease_held`: who holds the key; on a free key that goes to waiters queued before the
    /// request (`waiters`), who held it last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// `lease_held`: the key's state as the acquire found it: `held`, or a free state while
    /// the key goes to `waiters`. Absent from a server that does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<LeaseState>,
    /// `lease_held` on a free key: how many waiting acquires of instances that answer are
    /// queued before the request, the first of whom the key goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiters: Option<i64>,
    /// `recovery_required`: the retained record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryRecord>,
    /// `stale_token` and `unknown_token`: the refusal.
    #[serde(flatten)]
    pub refusal: Option<RefusalFields>,
    /// `stale_token` and `unknown_token` (v1.3): the lease that fenced the refused write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_key: Option<Key>,
    /// `precondition_failed` of a transaction (v1.3): the op whose precondition failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_index: Option<usize>,
}

/// The members of a refused fenced write's problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusalFields {
    /// The token the writer presented.
    pub presented_token: FencingToken,
    /// The key's newest token, or null for a key that never had a lease.
    pub highest_token: Option<FencingToken>,
    /// The refusal's row in the audit log.
    pub audit_id: AuditId,
}

impl Problem {
    /// The problem of `code` with `detail`, and no members of its own yet.
    pub fn new(code: ErrorCode, title: &str, detail: String) -> Self {
        Self {
            type_uri: Some(format!("urn:snapfence:problem:{code}")),
            title: Some(title.to_owned()),
            status: Some(code.status()),
            detail: Some(detail),
            code: Some(code.as_str().to_owned()),
            holder: None,
            state: None,
            waiters: None,
            recovery: None,
            refusal: None,
            fencing_key: None,
            op_index: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_from_its_name() {
        for &code in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{code}\""));
        }
        assert_eq!(ErrorCode::parse("no_such_code"), None);
    }

    #[test]
    fn a_refusal_problem_keeps_a_null_highest_token() {
        let mut p = Problem::new(ErrorCode::UnknownToken, "Conflict", "x".into());
        p.refusal = Some(RefusalFields {
            presented_token: FencingToken::new(5).unwrap(),
            highest_token: None,
            audit_id: AuditId(1),
        });
        let v = serde_json::to_value(&p).unwrap();
        assert!(v["highest_token"].is_null() && v.get("highest_token").is_some());
        assert_eq!(serde_json::from_value::<Problem>(v).unwrap(), p);
    }
}
