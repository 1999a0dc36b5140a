//! The vocabulary of the contract: validated values (keys, tokens, owners, TTLs, metadata, page
//! sizes and cursors) and the records the store hands back (leases, recovery records, snapshot
//! metadata, audit rows). Every bound that `../shared/API.md` states is checked here, on
//! construction, so that an unchecked string or an out-of-range number never reaches SQL.

mod auth;
mod lease;
mod snapshot;
mod values;

pub use auth::{KeyName, NewSecret, Presented, Principal, Scope};
pub use lease::{KeyStatus, Lease, LeaseState, RecoveryReason, RecoveryRecord};
pub use snapshot::{ETag, EntityTagCondition, SnapshotMeta};
pub use values::{
    Cursor, FencingToken, Key, KeyPrefix, Metadata, Owner, PageLimit, TtlBounds, TtlMs, Version,
    json_integer, json_integer_opt,
};

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
