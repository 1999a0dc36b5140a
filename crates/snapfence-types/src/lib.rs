//! The vocabulary of snapfence's HTTP contract (`docs/api.md`), shared by the server and every
//! client: validated values (keys, tokens, owners, TTLs, metadata, page sizes and cursors), the
//! records the service hands out (leases, recovery records, snapshot metadata, audit rows), every
//! JSON request and answer body, the watch's events, the error codes ([`ErrorCode`]) and the header names
//! ([`headers`]).
//!
//! Every bound the contract states is checked here, on construction, so that an unchecked string
//! or an out-of-range number never reaches the database nor leaves a client. Nothing here knows
//! HTTP servers or SQL: the crate builds on any platform.

mod audit;
mod error;
pub mod headers;
mod lease;
mod snapshot;
mod txn;
mod values;
mod watch;
mod wire;

pub use audit::{AuditId, AuditOperation, Recovery, RefusalReason, Rejection};
pub use error::{ErrorCode, Problem, RefusalFields};
pub use lease::{KeyStatus, Lease, LeaseState, RecoveryReason, RecoveryRecord, Waiter};
pub use snapshot::{ETag, EntityTagCondition, ListOrder, SnapshotMeta};
pub use txn::{DEFAULT_CONTENT_TYPE, TxnAnswer, TxnBody, TxnOp, TxnOpBody, TxnOpResult};
pub use values::{
    Cursor, FencingToken, IdempotencyKey, Key, KeyPrefix, MAX_IDEMPOTENCY_KEY_LEN, MAX_KEY_BYTES,
    MAX_METADATA_BYTES, MAX_OWNER_BYTES, Metadata, Owner, PageLimit, TtlBounds, TtlMs, Version,
    json_integer, json_integer_opt, well_escaped,
};
pub use watch::{ChangeData, ChangeEvent, ChangeId, ChangeKind, ChangeReason};
pub use wire::{AcquireRequest, Grant, Health, Holder, MAX_WAIT_MS, Page, RenewRequest};

/// Times in JSON: RFC 3339 in UTC with milliseconds, e.g. `2026-12-02T13:05:00.123Z`.
pub mod rfc3339_millis {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Serializes a time the way the contract writes times.
    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    /// Reads a time in any RFC 3339 form, so that a client also understands a server that
    /// writes more or fewer fractional digits.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(d)
    }
}

/// A value that breaks one of the contract's input rules. The message is the `detail` a client
/// sees, so it names the field, the rule and the value's problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidInput(pub String);

impl InvalidInput {
    /// An error with the given message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}
