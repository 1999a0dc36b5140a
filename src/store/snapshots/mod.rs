//! Snapshots. The fencing rules (`sql/fenced.sql`) are checked under the lease row's lock, which
//! grants take too, so writes and grants are ordered.

mod batches;
pub mod list;
pub mod txn;

pub use batches::Batches;
pub(crate) use batches::{FENCED, GET};
use batches::{FencedJob, GetJob, Op, Write, fenced};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::{FromRow, PgPool};

use super::engine::batch::Indexed;
use super::idempotency::{self, Gated, GatedRow};
use super::{Bounded, RequestContext, Result};
use crate::domain::{
    AuditOperation, Cursor, ETag, EntityTagCondition, FencingToken, Key, Metadata, Page, PageLimit,
    RefusalReason, SnapshotMeta, Version,
};

/// A refused fenced write, already on record in the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// The token the writer presented.
    pub presented: FencingToken,
    /// The fence's newest token (or the key's highest written), `None` for a fence never leased.
    pub highest: Option<FencingToken>,
    /// The id of the audit row.
    pub audit_id: i64,
    /// The lease that fenced the write.
    pub fence: Key,
}

/// How a fenced write or delete ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome<T> {
    /// The token was the key's newest and the change is made.
    Accepted(T),
    /// The token was not acceptable; the refusal is recorded and nothing else changed.
    Refused(Refusal),
    /// The token was acceptable but a precondition (`If-Match`) did not hold; nothing changed.
    PreconditionFailed,
}

/// An accepted write: the new version, and whether it created the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The stored version's metadata.
    pub meta: SnapshotMeta,
    /// Whether the key had no current snapshot before this write.
    pub created: bool,
}

/// A fenced write.
#[derive(Debug, Clone)]
pub struct PutRequest {
    /// The key.
    pub key: Key,
    /// The lease that fences it: the key itself, or a key whose namespace holds it.
    pub fence: Key,
    /// The token presented in `Fencing-Token`.
    pub token: FencingToken,
    /// The `If-Match` condition, if any.
    pub if_match: Option<EntityTagCondition>,
    /// The body, read whole (and bounded) by the HTTP layer.
    pub body: Bytes,
    /// The body's entity tag ([`ETag::of`] it).
    pub etag: ETag,
    /// The content type to store.
    pub content_type: String,
    /// The version's Snapshot-Metadata.
    pub metadata: Option<Metadata>,
}

/// Bodies this large are uploaded in chunks rather than bound, so the service holds each once.
pub const UPLOAD_FROM: usize = 512 * 1024;

/// Whether the fault tests' negative control is on (`fault-controls` builds only).
#[cfg(feature = "fault-controls")]
pub fn fencing_broken() -> bool {
    static BROKEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BROKEN.get_or_init(|| {
        std::env::var("SNAPFENCE_BREAK_FENCING").is_ok_and(|v| v == "written-token")
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct FencedRow {
    outcome: String,
    highest_token: Option<i64>,
    created: Option<bool>,
    audit_id: Option<i64>,
    version: Option<i64>,
    updated_at: Option<DateTime<Utc>>,
    #[serde(default = "settled")]
    settled: bool,
}

fn settled() -> bool {
    true
}

impl FencedRow {
    fn outcome<T>(
        self,
        token: FencingToken,
        fence: &Key,
        accepted: impl FnOnce(Self) -> T,
    ) -> WriteOutcome<T> {
        match self.outcome.as_str() {
            "accepted" => WriteOutcome::Accepted(accepted(self)),
            "precondition_failed" => WriteOutcome::PreconditionFailed,
            reason => WriteOutcome::Refused(Refusal {
                reason: RefusalReason::parse(reason).expect("fenced verdicts"),
                presented: token,
                highest: self
                    .highest_token
                    .map(|t| FencingToken::new(t).expect("stored tokens are positive")),
                audit_id: self.audit_id.expect("a refusal has its audit row"),
                fence: fence.clone(),
            }),
        }
    }
}

/// A fenced write: one batched statement checks, writes or refuses and audits under the key's row
/// lock. A body of [`UPLOAD_FROM`] or more is uploaded first, taking no lock.
#[tracing::instrument(level = "debug", skip_all, fields(key = %req.key, token = %req.token, size = req.body.len()))]
pub async fn put(
    db: &impl AsRef<Batches>,
    req: &PutRequest,
    keep_versions: i64,
    ctx: &RequestContext,
) -> Result<Gated<WriteOutcome<Written>>> {
    let etag = &req.etag;
    let uploaded = req.body.len() >= UPLOAD_FROM;
    let job = || FencedJob {
        key: req.key.clone(),
        fence: req.fence.clone(),
        token: req.token,
        if_match: req.if_match.clone(),
        if_none_match: false,
        operation: AuditOperation::Put,
        op: Op::Put,
        write: Some(Write {
            body: req.body.clone(),
            etag: etag.clone(),
            content_type: req.content_type.clone(),
            uploaded,
            keep_versions,
            metadata: req.metadata.clone(),
        }),
        ctx: ctx.clone(),
        opens_group: true,
    };
    let gated = loop {
        let gated = idempotency::gated(ctx, || async {
            if uploaded {
                let job = job();
                let row = db
                    .as_ref()
                    .conns
                    .fetch_one_uploading(&req.body, || FencedJob::put(&[&job]))
                    .await?;
                Ok(row.row)
            } else {
                db.as_ref().put.answer(job()).await
            }
        })
        .await?;
        match gated {
            Gated::Ran(FencedRow { settled: false, .. }) => continue,
            gated => break gated,
        }
    };
    Ok(gated.map(|row: FencedRow| {
        row.outcome(req.token, &req.fence, |r| Written {
            created: r.created.unwrap_or(true),
            meta: SnapshotMeta {
                key: Some(req.key.clone()),
                version: Version::from_stored(r.version.expect("an accepted write has a version")),
                token: req.token,
                etag: etag.clone(),
                size: req.body.len() as i64,
                content_type: req.content_type.clone(),
                updated_at: r.updated_at.expect("an accepted write has a time"),
                fencing_key: Some(req.fence.clone()),
                metadata: req.metadata.clone(),
            },
        })
    }))
}

fn bodiless(
    target: &Fenced<'_>,
    if_match: Option<&EntityTagCondition>,
    op: Op,
    ctx: &RequestContext,
) -> FencedJob {
    FencedJob {
        key: target.key.clone(),
        fence: target.fence.clone(),
        token: target.token,
        if_match: if_match.cloned(),
        if_none_match: false,
        operation: match op {
            Op::Put => AuditOperation::Put,
            _ => AuditOperation::Delete,
        },
        op,
        write: None,
        ctx: ctx.clone(),
        opens_group: true,
    }
}

/// What a fenced call writes, under which lease, with which token.
#[derive(Debug, Clone, Copy)]
pub struct Fenced<'a> {
    /// The key written.
    pub key: &'a Key,
    /// The lease that fences it: the key itself, or a key whose namespace holds it.
    pub fence: &'a Key,
    /// The token presented.
    pub token: FencingToken,
}

/// The fencing rule before the body is read; `Some` is the refusal, already audited.
#[tracing::instrument(level = "debug", skip_all, fields(key = %target.key, token = %target.token))]
pub async fn precheck(
    db: &impl AsRef<Batches>,
    target: Fenced<'_>,
    ctx: &RequestContext,
) -> Result<Gated<Option<Refusal>>> {
    let gated = idempotency::gated(ctx, || {
        let job = bodiless(&target, None, Op::Put, ctx);
        db.as_ref().precheck.answer(job)
    })
    .await?;
    Ok(gated.map(
        |row: FencedRow| match row.outcome(target.token, target.fence, |_| ()) {
            WriteOutcome::Refused(refusal) => Some(refusal),
            WriteOutcome::Accepted(()) | WriteOutcome::PreconditionFailed => None,
        },
    ))
}

/// A fenced delete in one transaction: the batched check under the row lock, then the versions'
/// removal, whose snapshot follows that lock.
#[tracing::instrument(level = "debug", skip_all, fields(key = %target.key, token = %target.token))]
pub async fn delete(
    pool: &PgPool,
    target: Fenced<'_>,
    if_match: Option<&EntityTagCondition>,
    ctx: &RequestContext,
) -> Result<Gated<WriteOutcome<()>>> {
    let job = bodiless(&target, if_match, Op::Delete, ctx);
    idempotency::gated(ctx, || async {
        let mut tx = pool.begin().bounded(pool).await?;
        let row = fenced()
            .delete_head
            .query::<Indexed<GatedRow<FencedRow>>>(&[&job])
            .fetch_one(&mut *tx)
            .bounded(pool)
            .await?
            .row;
        if row.ran()?.is_some_and(|r| r.outcome == "accepted") {
            sqlx::query(include_str!("sql/delete_versions.sql"))
                .bind([target.key.as_str()])
                .execute(&mut *tx)
                .bounded(pool)
                .await?;
        }
        tx.commit().bounded_change(pool).await?;
        Ok(row)
    })
    .await
    .map(|gated| gated.map(|row| row.outcome(target.token, target.fence, |_| ())))
}

/// A stored snapshot version with its body.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its metadata.
    pub meta: SnapshotMeta,
    /// Its bytes, exactly as written; `None` when they were not read ([`Read`]).
    pub body: Option<Bytes>,
}

/// What a read takes of a snapshot version besides its head.
#[derive(Debug, Clone, Copy)]
pub enum Read<'a> {
    /// The head only (a `HEAD`).
    Head,
    /// The bytes too, unless the ETag weakly matches this `If-None-Match` (then `304`).
    Body(Option<&'a EntityTagCondition>),
}

#[derive(Debug, FromRow)]
pub(super) struct VersionRow {
    version: i64,
    token: i64,
    etag: String,
    size: i64,
    content_type: String,
    updated_at: DateTime<Utc>,
    fencing_key: String,
    metadata: Option<sqlx::types::Json<serde_json::Value>>,
}

impl VersionRow {
    pub(super) fn into_meta(self, key: Option<&Key>) -> SnapshotMeta {
        SnapshotMeta {
            key: key.cloned(),
            version: Version::from_stored(self.version),
            token: FencingToken::new(self.token).expect("stored tokens are positive"),
            etag: ETag::from_stored(self.etag),
            size: self.size,
            content_type: self.content_type,
            updated_at: self.updated_at,
            fencing_key: Some(Key::parse(self.fencing_key).expect("stored keys are valid")),
            metadata: self.metadata.map(|m| Metadata::from_stored(m.0)),
        }
    }
}

#[derive(Debug, FromRow)]
pub(crate) struct BodyRow {
    #[sqlx(flatten)]
    meta: VersionRow,
    body: Option<Vec<u8>>,
}

#[derive(Debug, FromRow)]
struct ListedRow {
    has_snapshot: bool,
    #[sqlx(flatten)]
    version: ListedVersion,
}

#[derive(Debug, FromRow)]
struct ListedVersion {
    version: Option<i64>,
    token: Option<i64>,
    etag: Option<String>,
    size: Option<i64>,
    content_type: Option<String>,
    updated_at: Option<DateTime<Utc>>,
    fencing_key: Option<String>,
    metadata: Option<sqlx::types::Json<serde_json::Value>>,
}

impl ListedVersion {
    fn into_row(self) -> Option<VersionRow> {
        Some(VersionRow {
            version: self.version?,
            token: self.token?,
            etag: self.etag?,
            size: self.size?,
            content_type: self.content_type?,
            updated_at: self.updated_at?,
            fencing_key: self.fencing_key?,
            metadata: self.metadata,
        })
    }
}

/// Reads the current or a retained version, head and body from one committed state.
pub async fn get(
    db: &impl AsRef<Batches>,
    key: &Key,
    version: Option<Version>,
    keep_versions: i64,
    read: Read<'_>,
) -> Result<Option<Snapshot>> {
    let job = GetJob {
        key: key.clone(),
        version,
        keep_versions,
        with_body: matches!(read, Read::Body(_)),
        unless: match read {
            Read::Body(Some(condition)) => Some(serde_json::json!(condition.weak_tags())),
            Read::Body(None) | Read::Head => None,
        },
    };
    let row = db.as_ref().get.submit(job).await?;
    Ok(row.map(|r| Snapshot {
        meta: r.meta.into_meta(None),
        body: r.body.map(Bytes::from),
    }))
}

/// The retained versions newest first below the cursor; `None` without a current snapshot.
pub async fn versions(
    pool: &PgPool,
    key: &Key,
    keep_versions: i64,
    limit: PageLimit,
    before: Option<i64>,
) -> Result<Option<Page<SnapshotMeta>>> {
    let rows: Vec<ListedRow> = sqlx::query_as(include_str!("sql/versions.sql"))
        .bind(key.as_str())
        .bind(keep_versions)
        .bind(before)
        .bind(limit.get() + 1)
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    if !rows.first().is_some_and(|r| r.has_snapshot) {
        return Ok(None);
    }
    let items = rows
        .into_iter()
        .filter_map(|r| r.version.into_row())
        .map(|r| r.into_meta(None))
        .collect();
    Ok(Some(Page::from_rows(items, limit, |m: &SnapshotMeta| {
        Cursor::after_id(m.version.get())
    })))
}
