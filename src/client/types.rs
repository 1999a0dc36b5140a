//! The requests and answers of the client that the domain does not already have: acquire
//! bodies, pages and their filters, snapshot heads, audit items.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::domain::{
    Cursor, ETag, EntityTagCondition, FencingToken, Key, KeyPrefix, Lease, LeaseState, Metadata,
    Owner, PageLimit, RecoveryReason, RecoveryRecord, Version, rfc3339_millis,
};
use crate::store::snapshots::RefusalReason;

/// What to ask for when acquiring a key. `AcquireRequest::new(owner, ttl)` asks for a plain
/// lease; the setters add the contract's options.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AcquireRequest {
    /// The would-be holder.
    pub owner: Owner,
    /// The lease's time to live; sent in whole milliseconds.
    #[serde(rename = "ttl_ms", serialize_with = "millis")]
    pub ttl: Duration,
    /// Kept with the lease and shown to anyone who finds the key held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    /// Whether an expiry (rather than a release) leaves a recovery record.
    pub crash_recovery: bool,
    /// Whether you state that what a previous holder left behind no longer conflicts, so that
    /// a retained recovery record is replaced.
    pub reconciled: bool,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl AcquireRequest {
    /// A plain lease for `owner` lasting `ttl` unless renewed.
    pub fn new(owner: Owner, ttl: Duration) -> Self {
        Self {
            owner,
            ttl,
            metadata: None,
            crash_recovery: false,
            reconciled: false,
        }
    }

    /// Attaches metadata.
    pub fn metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Asks for a recovery record if the lease expires instead of being released.
    pub fn crash_recovery(mut self, on: bool) -> Self {
        self.crash_recovery = on;
        self
    }

    /// States that a retained recovery record has been dealt with.
    pub fn reconciled(mut self, on: bool) -> Self {
        self.reconciled = on;
        self
    }
}

/// A granted lease, and the recovery record it replaced when the acquire was `reconciled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    /// The new lease.
    #[serde(flatten)]
    pub lease: Lease,
    /// The replaced record, if there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<RecoveryRecord>,
}

/// One page of a list: `{"items": [...], "next_cursor": string-or-null}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass it back as the `cursor` of the next request; `None` on the last page.
    pub next_cursor: Option<Cursor>,
}

/// The size and position of a page.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PageRequest {
    /// Items per page; the server's default (100) when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<PageLimit>,
    /// The `next_cursor` of the previous page; the first page when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Cursor>,
}

/// Which leases `GET /v1/leases` lists.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LeaseFilter {
    /// Only keys starting with this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<KeyPrefix>,
    /// Only keys in this state.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<LeaseState>,
    /// The page.
    #[serde(flatten)]
    pub page: PageRequest,
}

/// Which rows an audit log lists. `R` is the log's reason: [`RefusalReason`] for rejections,
/// [`RecoveryReason`] for recoveries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditFilter<R> {
    /// Only rows of this key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<Key>,
    /// Only rows with this reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<R>,
    /// Only rows at or after this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    /// Only rows before this time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    /// The page.
    #[serde(flatten)]
    pub page: PageRequest,
}

/// Every row, newest first, in pages of the server's default size.
impl<R> Default for AuditFilter<R> {
    fn default() -> Self {
        Self {
            key: None,
            reason: None,
            since: None,
            until: None,
            page: PageRequest::default(),
        }
    }
}

/// The options of a fenced write.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PutOptions {
    /// Stored and served back; the server stores `application/octet-stream` when `None`.
    pub content_type: Option<String>,
    /// A compare-and-set on the current snapshot's ETag.
    pub if_match: Option<EntityTagCondition>,
}

/// An accepted write: the new version's metadata, and whether it created the snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Written {
    /// The version written.
    #[serde(flatten)]
    pub meta: crate::domain::SnapshotMeta,
    /// `true` for `201 Created` (the key had no current snapshot), `false` for `200`.
    pub created: bool,
}

/// What the headers of a snapshot read say about it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotHead {
    /// The key.
    pub key: Key,
    /// The version served.
    pub version: Version,
    /// The token that wrote it.
    pub token: FencingToken,
    /// Its strong entity tag.
    pub etag: ETag,
    /// Its content type.
    pub content_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// When it was written, to the second (`Last-Modified`).
    #[serde(with = "rfc3339_millis")]
    pub last_modified: DateTime<Utc>,
}

/// A snapshot as read: its head and its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// What its headers say.
    pub head: SnapshotHead,
    /// The body as stored.
    pub body: Bytes,
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
}

impl AuditOperation {
    /// The contract's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Put => "put",
            Self::Delete => "delete",
            Self::Reconcile => "reconcile",
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
    /// `put` or `delete`.
    pub operation: AuditOperation,
    /// The refused request's `x-request-id`.
    pub request_id: Option<String>,
    /// The refused request's peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, if authentication is configured.
    pub principal: Option<String>,
}

/// One replaced recovery record, from `GET /v1/audit/recoveries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recovery {
    /// Row id; pages are ordered by it, newest first.
    pub id: AuditId,
    /// When the record was replaced (database clock).
    #[serde(with = "rfc3339_millis")]
    pub at: DateTime<Utc>,
    /// The key.
    pub key: Key,
    /// The replaced record's reason.
    pub reason: RecoveryReason,
    /// Always `None`: a reconciling acquire presents no token.
    pub presented_token: Option<FencingToken>,
    /// The reconciling grant's token.
    pub highest_token: FencingToken,
    /// The reconciling grant's owner.
    pub holder: Owner,
    /// Always [`AuditOperation::Reconcile`].
    pub operation: AuditOperation,
    /// The reconciling request's `x-request-id`.
    pub request_id: Option<String>,
    /// The reconciling request's peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, if authentication is configured.
    pub principal: Option<String>,
    /// The record that was replaced.
    pub recovery: RecoveryRecord,
    /// Who stated that the leftovers were reconciled.
    pub reconciled_by: Owner,
}

/// The answer of `/healthz` and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok` or `ready`.
    pub status: String,
}
