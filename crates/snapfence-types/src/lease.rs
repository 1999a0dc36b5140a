//! Leases, the state of a key, and recovery records.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{FencingToken, Key, Metadata, Owner, TtlMs, rfc3339_millis};

/// A lease as granted: its holder, its token and its time window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The key the lease is on.
    pub key: Key,
    /// Who holds it.
    pub owner: Owner,
    /// Its fencing token, unique across the service.
    pub token: FencingToken,
    /// When it was granted (database clock).
    #[serde(with = "rfc3339_millis")]
    pub acquired_at: DateTime<Utc>,
    /// When it expires unless renewed (database clock).
    #[serde(with = "rfc3339_millis")]
    pub expires_at: DateTime<Utc>,
    /// The TTL of the grant or the last renewal.
    pub ttl_ms: TtlMs,
    /// What the holder attached to it.
    pub metadata: Option<Metadata>,
    /// Whether an expiry (rather than a release) leaves a recovery record.
    pub crash_recovery: bool,
    /// Whether require-recovery has marked the lease, so its end leaves a recovery record.
    pub recovery_required: bool,
}

/// Why a recovery record was left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryReason {
    /// The holder abandoned the lease.
    Abandoned,
    /// A `crash_recovery` lease expired instead of being released.
    Expired,
    /// The holder marked cleanup incomplete, then released or let the lease expire.
    RecoveryRequired,
}

impl RecoveryReason {
    /// The name the contract and the database use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Abandoned => "abandoned",
            Self::Expired => "expired",
            Self::RecoveryRequired => "recovery_required",
        }
    }

    /// Parses the name the database stores.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "abandoned" => Some(Self::Abandoned),
            "expired" => Some(Self::Expired),
            "recovery_required" => Some(Self::RecoveryRequired),
            _ => None,
        }
    }
}

/// What a crashed or abandoned holder left behind: it blocks the next grant until a caller
/// acquires with `reconciled: true`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryRecord {
    /// The holder that left it.
    pub owner: Owner,
    /// That holder's token.
    pub token: FencingToken,
    /// When that lease was granted.
    #[serde(with = "rfc3339_millis")]
    pub acquired_at: DateTime<Utc>,
    /// When that lease ended: its release or abandon time, or its expiry.
    #[serde(with = "rfc3339_millis")]
    pub ended_at: DateTime<Utc>,
    /// Why the record exists.
    pub reason: RecoveryReason,
    /// That lease's metadata.
    pub metadata: Option<Metadata>,
}

/// The state of a key, derived from its newest lease and the database clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseState {
    /// A live lease holds the key.
    Held,
    /// The newest lease expired and left no recovery record: the key is free.
    Expired,
    /// The newest lease was released and left no recovery record: the key is free.
    Released,
    /// A recovery record blocks the next grant until it is reconciled.
    RecoveryPending,
}

impl LeaseState {
    /// The name the contract and the database use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Expired => "expired",
            Self::Released => "released",
            Self::RecoveryPending => "recovery_pending",
        }
    }

    /// Parses the name the database function `lease_state` returns.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "held" => Some(Self::Held),
            "expired" => Some(Self::Expired),
            "released" => Some(Self::Released),
            "recovery_pending" => Some(Self::RecoveryPending),
            _ => None,
        }
    }
}

/// Everything `GET /v1/leases/{key}` tells about a key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyStatus {
    /// The key.
    pub key: Key,
    /// Its state now.
    pub state: LeaseState,
    /// Its newest lease, also when expired or released.
    pub lease: Lease,
    /// The retained recovery record, if any.
    pub recovery: Option<RecoveryRecord>,
    /// The key's newest token (the newest lease's token), the one fenced writes must present.
    pub newest_token: FencingToken,
    /// How many waiting acquires (`wait_ms`) of instances that answer are in the key's queue:
    /// those an acquire defers to, so one without `wait_ms` is granted exactly when the key is
    /// free (no recovery record in its way) and this is 0. Beyond the contract; 0 from a server
    /// that does not say.
    #[serde(default)]
    pub waiters: i64,
}

/// One waiting acquire in a key's queue (`GET /v1/leases/{key}/waiters`, beyond the contract).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiter {
    /// Its place in the queue, from 1 (the next to be granted).
    pub position: i64,
    /// The `owner` it asked for; `None` for one queued by a server that did not keep it.
    pub owner: Option<String>,
    /// When it took its place (database clock).
    #[serde(with = "rfc3339_millis")]
    pub since: DateTime<Utc>,
}
