//! The audit log's rows, as `GET /v1/audit/rejections` and `GET /v1/audit/recoveries` list them.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{ErrorCode, FencingToken, Key, Owner, RecoveryReason, RecoveryRecord, rfc3339_millis};

/// Why a fenced write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalReason {
    /// The token is below the key's newest token, or its lease was released or abandoned.
    StaleToken,
    /// The token is above the key's newest token, or the key never had a lease.
    UnknownToken,
}

impl RefusalReason {
    /// The error code a refusal of this reason is answered with; its name is the reason's.
    pub fn code(self) -> ErrorCode {
        match self {
            Self::StaleToken => ErrorCode::StaleToken,
            Self::UnknownToken => ErrorCode::UnknownToken,
        }
    }

    /// The contract's name, also stored in the audit log.
    pub fn as_str(self) -> &'static str {
        self.code().as_str()
    }

    /// Parses the contract's name.
    pub fn parse(raw: &str) -> Option<Self> {
        match ErrorCode::parse(raw)? {
            ErrorCode::StaleToken => Some(Self::StaleToken),
            ErrorCode::UnknownToken => Some(Self::UnknownToken),
            _ => None,
        }
    }
}

/// The id of an audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct AuditId(pub i64);

impl fmt::Display for AuditId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What an audited request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOperation {
    /// A fenced write.
    Put,
    /// A fenced delete.
    Delete,
    /// An acquire with `reconciled: true` that replaced a recovery record.
    Reconcile,
    /// v1.2: an acquire with `reconciling: true` that took the key and kept the record; the row
    /// names the reconciling holder (the record stays until it confirms).
    Reconciling,
    /// v1.2: the reconciling holder confirmed (`POST /v1/leases/{key}/reconciled`) and the
    /// record moved to the audit log.
    Reconciled,
    /// v1.3: a transaction (`POST /v1/txn`), refused as a whole.
    Txn,
}

impl AuditOperation {
    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Put => "put",
            Self::Delete => "delete",
            Self::Reconcile => "reconcile",
            Self::Reconciling => "reconciling",
            Self::Reconciled => "reconciled",
            Self::Txn => "txn",
        }
    }
}

/// One refused fenced write, from `GET /v1/audit/rejections`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    /// Row id; pages are ordered by it, newest first.
    pub id: AuditId,
    /// When the write was refused (database clock).
    #[serde(with = "rfc3339_millis")]
    pub at: DateTime<Utc>,
    /// The key written to.
    pub key: Key,
    /// Why it was refused.
    pub reason: RefusalReason,
    /// The token the writer presented.
    pub presented_token: FencingToken,
    /// The key's newest token then; `None` for a key that never had a lease.
    pub highest_token: Option<FencingToken>,
    /// The owner of the key's newest lease then.
    pub holder: Option<Owner>,
    /// `put`, `delete` or `txn`.
    pub operation: AuditOperation,
    /// The refused request's `x-request-id`.
    pub request_id: Option<String>,
    /// The refused request's peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, if authentication is configured.
    pub principal: Option<String>,
    /// The lease that fenced the write (v1.3): the key itself unless a namespace's.
    #[serde(default)]
    pub fencing_key: Option<Key>,
}

/// One row of `GET /v1/audit/recoveries`: a recovery record replaced by a `reconciled` grant
/// (`reconcile`), kept by a reconciling grant (`reconciling`, v1.2), or moved to the log by that
/// holder's confirmation (`reconciled`, v1.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// Row id; pages are ordered by it, newest first.
    pub id: AuditId,
    /// When the record was replaced, kept or confirmed (database clock).
    #[serde(with = "rfc3339_millis")]
    pub at: DateTime<Utc>,
    /// The key.
    pub key: Key,
    /// The replaced record's reason.
    pub reason: RecoveryReason,
    /// The confirming holder's token for `reconciled`; `None` for the grants, which present
    /// none.
    pub presented_token: Option<FencingToken>,
    /// The reconciling grant's token.
    pub highest_token: FencingToken,
    /// The reconciling grant's owner.
    pub holder: Owner,
    /// [`AuditOperation::Reconcile`], [`AuditOperation::Reconciling`] or
    /// [`AuditOperation::Reconciled`].
    pub operation: AuditOperation,
    /// The reconciling request's `x-request-id`.
    pub request_id: Option<String>,
    /// The reconciling request's peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, if authentication is configured.
    pub principal: Option<String>,
    /// The record that was replaced, kept or confirmed.
    pub recovery: RecoveryRecord,
    /// Who stated that the leftovers were reconciled.
    pub reconciled_by: Owner,
}
