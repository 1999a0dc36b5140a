//! Watch events (contract v1.1, "Watch"): what `GET /v1/watch` streams as server-sent events,
//! one per change to a key, each named by a change id that grows over the whole service.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    AuditId, AuditOperation, ETag, FencingToken, InvalidInput, Key, Owner, RecoveryReason,
    RefusalReason, Version, rfc3339_millis,
};

/// The id of a change: strictly increasing over the whole service, in the order the changes
/// committed. A watch resumed after one delivers every later change once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ChangeId(i64);

impl ChangeId {
    /// The id before every change: a watch `since` it starts at the oldest retained change.
    pub const ORIGIN: ChangeId = ChangeId(0);

    /// Checks an id as a client sends it (`since`, `Last-Event-ID`): a decimal integer, 0 or
    /// more.
    pub fn parse(raw: &str) -> Result<Self, InvalidInput> {
        match raw.parse::<i64>() {
            Ok(id) if id >= 0 && raw.bytes().all(|b| b.is_ascii_digit()) => Ok(Self(id)),
            _ => Err(InvalidInput::new(format!(
                "change id {raw:?} is not a decimal integer of 0 or more; send the `id` of the \
                 last event you received, or 0 for the oldest retained change"
            ))),
        }
    }

    /// An id read back from the database.
    pub fn from_stored(id: i64) -> Self {
        Self(id)
    }

    /// The number.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for ChangeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Declares [`ChangeKind`] from one table of names.
macro_rules! kinds {
    ($($variant:ident = $name:literal, $meaning:literal;)*) => {
        /// What happened to a key: the SSE `event:` field.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[non_exhaustive]
        pub enum ChangeKind {
            $(
                #[doc = $meaning]
                #[serde(rename = $name)]
                $variant,
            )*
        }

        impl ChangeKind {
            /// Every kind, in the contract's order.
            pub const ALL: &'static [ChangeKind] = &[$(ChangeKind::$variant),*];

            /// The contract's name, e.g. `snapshot.written`.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                }
            }

            /// The kind of a name; `None` for one this version does not know (a newer
            /// server's), which a client may skip.
            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(Self::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

kinds! {
    LeaseGranted = "lease.granted", "A lease was granted; `owner` and `expires_at` are the grant's.";
    LeaseReleased = "lease.released", "The holder released its lease.";
    LeaseAbandoned = "lease.abandoned", "The holder abandoned its lease (a recovery record is left).";
    LeaseExpired = "lease.expired", "The lease expired by the database clock; `at` is its expiry.";
    LeaseRecoveryRequired = "lease.recovery_required", "The holder marked its lease: its end leaves a recovery record.";
    LeaseReconciled = "lease.reconciled", "A grant replaced a recovery record; `record_token` and `reason` are the record's.";
    SnapshotWritten = "snapshot.written", "A fenced write was stored as `version` with `etag`.";
    SnapshotDeleted = "snapshot.deleted", "A fenced delete removed the snapshot that was `version` with `etag`.";
    WriteRefused = "write.refused", "A fenced write or delete was refused; `audit_id` is its audit row.";
}

impl fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why: a refusal's reason (`write.refused`), or a replaced recovery record's
/// (`lease.reconciled`). The two sets of names do not meet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChangeReason {
    /// Why a fenced write was refused.
    Refusal(RefusalReason),
    /// Why the replaced recovery record was left.
    Recovery(RecoveryReason),
}

/// An event's `data:` object. Bodies are never sent; the members a kind does not have are left
/// out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeData {
    /// The key that changed.
    pub key: Key,
    /// The lease's token (for `write.refused`, the token the writer presented).
    pub token: FencingToken,
    /// When it happened, by the database clock.
    #[serde(with = "rfc3339_millis")]
    pub at: DateTime<Utc>,
    /// The owner of the lease the event is about (`lease.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// `write.refused`: who held the fence's newest lease when the write was refused (not the
    /// refused writer), as the audit row's `holder`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Owner>,
    /// `lease.granted`: when the new lease expires unless renewed.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "rfc3339_millis_opt"
    )]
    pub expires_at: Option<DateTime<Utc>>,
    /// `snapshot.*`: the version written or deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<Version>,
    /// `snapshot.*`: that version's entity tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<ETag>,
    /// `write.refused` and `lease.reconciled`: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ChangeReason>,
    /// `write.refused`: the refusal's row in the audit log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_id: Option<AuditId>,
    /// `write.refused`: what was refused, `put` or `delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<AuditOperation>,
    /// `write.refused`: the key's newest token then (absent for a key never leased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_token: Option<FencingToken>,
    /// `lease.reconciled`: the token of the lease that left the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_token: Option<FencingToken>,
    /// `snapshot.*` and `write.refused` (v1.3): the lease that fenced the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_key: Option<Key>,
    /// `snapshot.*` of a transaction (v1.3): the id of its first change, shared by all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<ChangeId>,
    /// `snapshot.*` of a transaction (v1.3): how many changes it made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn_size: Option<u32>,
}

/// One change as a watch delivers it: the SSE `id:`, `event:` and `data:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChangeEvent {
    /// Its change id.
    pub id: ChangeId,
    /// What happened.
    pub event: ChangeKind,
    /// The details.
    pub data: ChangeData,
}

/// [`rfc3339_millis`] for an optional time.
mod rfc3339_millis_opt {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => super::rfc3339_millis::serialize(t, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        Option::<DateTime<Utc>>::deserialize(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name() {
        for &kind in ChangeKind::ALL {
            assert_eq!(ChangeKind::parse(kind.as_str()), Some(kind));
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
        assert_eq!(ChangeKind::parse("lease.renewed"), None);
    }

    #[test]
    fn a_change_id_is_a_decimal_integer_of_zero_or_more() {
        assert_eq!(ChangeId::parse("0").unwrap(), ChangeId::ORIGIN);
        assert_eq!(ChangeId::parse("42").unwrap().get(), 42);
        for bad in ["", "-1", "+1", "1.0", "x", "99999999999999999999", " 1"] {
            assert!(ChangeId::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_refusal_event_reads_back_with_its_members() {
        let json = serde_json::json!({
            "key": "jobs/a", "token": 7, "at": "2026-12-04T18:00:00.000Z",
            "reason": "stale_token", "audit_id": 3, "operation": "put", "highest_token": 9
        });
        let data: ChangeData = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(
            data.reason,
            Some(ChangeReason::Refusal(RefusalReason::StaleToken))
        );
        assert_eq!(serde_json::to_value(&data).unwrap(), json);
        let reconciled: ChangeData = serde_json::from_value(serde_json::json!({
            "key": "jobs/a", "token": 8, "at": "2026-12-04T18:00:00.000Z", "reason": "expired"
        }))
        .unwrap();
        assert_eq!(
            reconciled.reason,
            Some(ChangeReason::Recovery(RecoveryReason::Expired))
        );
    }
}
