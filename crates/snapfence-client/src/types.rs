//! What the client's calls take and give that is not a JSON body of the contract (those are in
//! `snapfence-types`): list filters and pages asked for, write options, snapshot heads read from
//! headers, and the outcome of a write.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Serialize;

use snapfence_types::{
    Cursor, ETag, EntityTagCondition, FencingToken, Key, KeyPrefix, LeaseState, ListOrder,
    Metadata, PageLimit, Version, rfc3339_millis,
};

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

/// Which snapshot keys `GET /v1/snapshots` lists, and in which order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SnapshotFilter {
    /// Only keys starting with this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<KeyPrefix>,
    /// Byte order of the keys (the default) or its reverse (v1.3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<ListOrder>,
    /// Only keys after this one in the order asked for (v1.3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_after: Option<String>,
    /// Each item's `metadata` too (v1.3).
    #[serde(
        rename = "include",
        skip_serializing_if = "std::ops::Not::not",
        serialize_with = "include_metadata"
    )]
    pub with_metadata: bool,
    /// The page.
    #[serde(flatten)]
    pub page: PageRequest,
}

fn include_metadata<S: serde::Serializer>(_: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("metadata")
}

/// Which rows an audit log lists. `R` is the log's reason: [`RefusalReason`](snapfence_types::RefusalReason) for rejections,
/// [`RecoveryReason`](snapfence_types::RecoveryReason) for recoveries.
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
    /// The lease that fences the write, when it is not the key's own: a key whose namespace
    /// holds it (v1.3 `Fencing-Key`).
    pub fence: Option<Key>,
    /// Stored with the version and served back (v1.3 `Snapshot-Metadata`).
    pub metadata: Option<Metadata>,
}

/// An accepted write: the new version's metadata, and whether it created the snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Written {
    /// The version written.
    #[serde(flatten)]
    pub meta: snapfence_types::SnapshotMeta,
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
    /// The lease that fenced the write (v1.3 `Fencing-Key`); `None` from older servers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_key: Option<Key>,
    /// The version's metadata (v1.3 `Snapshot-Metadata`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
}

/// A snapshot as read: its head and its bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// What its headers say.
    pub head: SnapshotHead,
    /// The body as stored.
    pub body: Bytes,
}
