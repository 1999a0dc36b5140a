//! The `snapshot_versions` table and the snapshot head on `leases`: fenced writes and deletes,
//! and reads.
//!
//! The fencing rule is checked against the key's lease row while holding its row lock, by the
//! same statement that writes (or refuses and audits). Grants take the same lock, so a write and
//! a grant on one key, from any instances, are ordered: a write that commits before a grant was
//! made with the then-newest token, and a write after it sees the new token and is refused.

use std::sync::LazyLock;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::{FromRow, PgPool};

use crate::domain::{AuditOperation, RefusalReason};

use super::db::Effect;
use super::idempotency::{self, Gated, GatedRow, bind_gate};
use super::{Bounded, Db, RequestContext, Result};
use crate::domain::Page;
use crate::domain::{
    Cursor, ETag, EntityTagCondition, FencingToken, Key, PageLimit, SnapshotMeta, Version,
};

/// A refused fenced write, already on record in the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Why.
    pub reason: RefusalReason,
    /// The token the writer presented.
    pub presented: FencingToken,
    /// The key's newest token, or `None` for a key that never had a lease.
    pub highest: Option<FencingToken>,
    /// The id of the audit row.
    pub audit_id: i64,
}

/// How a fenced write or delete ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome<T> {
    /// The token was the key's newest and the change is made.
    Accepted(T),
    /// The token was not acceptable; the refusal is recorded and nothing else changed.
    Refused(Refusal),
    /// The token was acceptable but `If-Match` did not match; nothing changed.
    PreconditionFailed,
}

/// An accepted write: the new version, and whether it created the snapshot (no current
/// snapshot existed before it).
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
}

/// The fenced write: the fencing rule and the refusal's audit row (`sql/fenced.sql`), then the
/// write (`sql/put.sql`), as one statement. What each part locks and why the whole is race-free
/// is written beside it in those files. `bench/compare.sh` runs the same two files, joined the
/// same way.
const PUT: &str = concat!(
    include_str!("sql/gate.sql"),
    include_str!("sql/fenced.sql"),
    include_str!("sql/put.sql"),
    include_str!("sql/remember.sql")
);

/// In [`PUT`], the body: the bound parameter that [`PUT_UPLOADED`] replaces.
const BOUND_BODY: &str = "$15 FROM head";

/// [`PUT`] for a body uploaded beforehand into the connection's upload table (see
/// [`Db::fetch_one_uploading`]) rather than bound as `$15` (bound NULL, unused). Identical
/// otherwise: the same checks, locks and audit.
static PUT_UPLOADED: LazyLock<String> = LazyLock::new(|| {
    replace_once(
        PUT,
        BOUND_BODY,
        "(SELECT body FROM pg_temp.snapfence_upload) FROM head",
    )
});

/// `statement` with its one `part` replaced; panics (in every test that writes) if `part` is
/// not there exactly once, so an edit of the SQL files cannot silently skip a replacement.
fn replace_once(statement: &str, part: &str, by: &str) -> String {
    assert_eq!(
        statement.matches(part).count(),
        1,
        "{part:?} appears exactly once in the statement"
    );
    statement.replacen(part, by, 1)
}

/// In `sql/fenced.sql`, what a lower token is stale against: the key's newest granted token.
#[cfg(feature = "fault-controls")]
const STALE_BELOW_NEWEST_GRANT: &str = "$6 < cur.token OR";

/// The negative control of the fault tests, compiled only with the `fault-controls` feature:
/// `statement` with the classic fencing bug of checking a token against the highest token
/// *written* to the key instead of its newest *granted* one, which lets a superseded holder write
/// until its successor first writes. The history checker must find that; see `tests/faults`.
#[cfg(feature = "fault-controls")]
fn checked_against_written_tokens(statement: &str) -> String {
    replace_once(
        statement,
        STALE_BELOW_NEWEST_GRANT,
        "$6 < coalesce((SELECT max(w.token) FROM snapshot_versions w WHERE w.key = $5), 0) OR",
    )
}

/// Bodies of this size and more are uploaded before the fenced write instead of being bound
/// to it. A bound body is copied twice on its way out (into the statement's arguments and into
/// the connection's send buffer); an uploaded one streams from the request's buffer in small
/// chunks, so the service holds each body about once, whatever its size and however many
/// arrive at once. Below this size the extra round trips cost more than the copies.
pub const UPLOAD_FROM: usize = 512 * 1024;

/// Whether the negative control is on: a build with the `fault-controls` feature (which only
/// the tests' builds have, through `snapfence-testkit`) run with
/// `SNAPFENCE_BREAK_FENCING=written-token`. Every other build has no such switch.
#[cfg(feature = "fault-controls")]
pub fn fencing_broken() -> bool {
    static BROKEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BROKEN.get_or_init(|| {
        std::env::var("SNAPFENCE_BREAK_FENCING").is_ok_and(|v| v == "written-token")
    })
}

/// The fenced write statement this process runs, for a bound or an uploaded body.
fn put_statement(uploaded: bool) -> &'static str {
    #[cfg(feature = "fault-controls")]
    if fencing_broken() {
        static BROKEN: LazyLock<[String; 2]> = LazyLock::new(|| {
            [
                checked_against_written_tokens(PUT),
                checked_against_written_tokens(&PUT_UPLOADED),
            ]
        });
        return &BROKEN[usize::from(uploaded)];
    }
    if uploaded { &PUT_UPLOADED } else { PUT }
}

/// The fenced write's check before its body is read: `sql/fenced.sql`, then
/// `sql/precheck.sql`, between the gate and the record.
const PRECHECK: &str = concat!(
    include_str!("sql/gate.sql"),
    include_str!("sql/fenced.sql"),
    include_str!("sql/precheck.sql"),
    include_str!("sql/remember.sql")
);

/// The check before a body is read that this process runs (broken as the write is, under the
/// negative control, so that the control is not caught early instead).
fn precheck_statement() -> &'static str {
    #[cfg(feature = "fault-controls")]
    if fencing_broken() {
        static BROKEN: LazyLock<String> =
            LazyLock::new(|| checked_against_written_tokens(PRECHECK));
        return &BROKEN;
    }
    PRECHECK
}

/// The fenced delete's first statement: `sql/fenced.sql`, then `sql/delete_head.sql`. Its
/// versions are removed by a second statement in the same transaction (see [`delete`]).
const DELETE_HEAD: &str = concat!(
    include_str!("sql/gate.sql"),
    include_str!("sql/fenced.sql"),
    include_str!("sql/delete_head.sql"),
    include_str!("sql/remember.sql")
);

/// What a fenced statement did (`result` in `sql/put.sql` and `sql/delete_head.sql`).
#[derive(Debug, Deserialize)]
struct FencedRow {
    outcome: String,
    highest_token: Option<i64>,
    created: Option<bool>,
    audit_id: Option<i64>,
    version: Option<i64>,
    updated_at: Option<DateTime<Utc>>,
}

impl FencedRow {
    /// Splits the shared part of a fenced statement's answer into an outcome; `accepted` maps the
    /// row of an accepted change.
    fn outcome<T>(self, token: FencingToken, accepted: impl FnOnce(Self) -> T) -> WriteOutcome<T> {
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
            }),
        }
    }
}

/// The `If-Match` parameters of a fenced statement: whether it was sent, and its strong tags
/// (`None` for `*`).
fn if_match_params(c: Option<&EntityTagCondition>) -> (bool, Option<Vec<String>>) {
    (c.is_some(), c.and_then(EntityTagCondition::strong_tags))
}

/// A fenced write: one statement (`PUT`). It checks, writes or refuses, and audits, all
/// under the key's row lock, and commits before the caller answers. A body of [`UPLOAD_FROM`]
/// bytes or more is uploaded first, in the same short transaction (`PUT_UPLOADED`); the
/// upload takes no lock, so the key's row is locked only by the statement, as for any write.
#[tracing::instrument(level = "debug", skip_all, fields(key = %req.key, token = %req.token, size = req.body.len()))]
pub async fn put(
    db: &Db,
    req: &PutRequest,
    keep_versions: i64,
    ctx: &RequestContext,
) -> Result<Gated<WriteOutcome<Written>>> {
    let etag = &req.etag;
    let (has_if_match, tags) = if_match_params(req.if_match.as_ref());
    let upload = req.body.len() >= UPLOAD_FROM;
    let statement = || {
        bind_gate(sqlx::query_as(put_statement(upload)), ctx)
            .bind(req.key.as_str())
            .bind(req.token.get())
            .bind(has_if_match)
            .bind(tags.clone())
            .bind(ctx.request_id.as_deref())
            .bind(ctx.remote_addr.as_deref())
            .bind(AuditOperation::Put.as_str())
            .bind(etag.as_str())
            .bind(req.body.len() as i64)
            .bind(req.content_type.as_str())
            .bind((!upload).then_some(req.body.as_ref()))
            .bind(keep_versions)
    };
    let gated = idempotency::gated(ctx, || async {
        if upload {
            db.fetch_one_uploading(&req.body, statement).await
        } else {
            db.fetch_one(Effect::Changes, statement).await
        }
    })
    .await?;
    Ok(gated.map(|row: FencedRow| {
        row.outcome(req.token, |r| Written {
            created: r.created.unwrap_or(true),
            meta: SnapshotMeta {
                key: Some(req.key.clone()),
                version: Version::from_stored(r.version.expect("an accepted write has a version")),
                token: req.token,
                etag: etag.clone(),
                size: req.body.len() as i64,
                content_type: req.content_type.clone(),
                updated_at: r.updated_at.expect("an accepted write has a time"),
            },
        })
    }))
}

/// The fencing rule for a write whose body has not been read: one statement
/// (`sql/precheck.sql`) that refuses a stale or unknown token at once, with its audit row (and
/// its Idempotency-Key's record), and otherwise changes nothing; the write's own statement
/// checks again once the body is in. `Some` is the refusal.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key, token = %token))]
pub async fn precheck(
    db: &Db,
    key: &Key,
    token: FencingToken,
    ctx: &RequestContext,
) -> Result<Gated<Option<Refusal>>> {
    let gated = idempotency::gated(ctx, || {
        db.fetch_one(Effect::Changes, || {
            bind_gate(sqlx::query_as(precheck_statement()), ctx)
                .bind(key.as_str())
                .bind(token.get())
                .bind(false)
                .bind(None::<Vec<String>>)
                .bind(ctx.request_id.as_deref())
                .bind(ctx.remote_addr.as_deref())
                .bind(AuditOperation::Put.as_str())
        })
    })
    .await?;
    Ok(
        gated.map(|row: FencedRow| match row.outcome(token, |_| ()) {
            WriteOutcome::Refused(refusal) => Some(refusal),
            WriteOutcome::Accepted(()) | WriteOutcome::PreconditionFailed => None,
        }),
    )
}

/// A fenced delete: one short transaction. The first statement (`DELETE_HEAD`) checks,
/// clears the head or refuses and audits, under the key's row lock, and records the answer
/// under the Idempotency-Key. The second removes the key's versions; it runs with a snapshot
/// taken after the lock was granted, so it sees every version committed before, and no writer
/// can add one until this commits.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key, token = %token))]
pub async fn delete(
    pool: &PgPool,
    key: &Key,
    token: FencingToken,
    if_match: Option<&EntityTagCondition>,
    ctx: &RequestContext,
) -> Result<Gated<WriteOutcome<()>>> {
    let (has_if_match, tags) = if_match_params(if_match);
    idempotency::gated(ctx, || async {
        let mut tx = pool.begin().bounded(pool).await?;
        let row: GatedRow<FencedRow> = bind_gate(sqlx::query_as(DELETE_HEAD), ctx)
            .bind(key.as_str())
            .bind(token.get())
            .bind(has_if_match)
            .bind(tags.clone())
            .bind(ctx.request_id.as_deref())
            .bind(ctx.remote_addr.as_deref())
            .bind(AuditOperation::Delete.as_str())
            .fetch_one(&mut *tx)
            .bounded(pool)
            .await?;
        if row.ran()?.is_some_and(|r| r.outcome == "accepted") {
            sqlx::query(include_str!("sql/delete_versions.sql"))
                .bind(key.as_str())
                .execute(&mut *tx)
                .bounded(pool)
                .await?;
        }
        tx.commit().bounded_change(pool).await?;
        Ok(row)
    })
    .await
    .map(|gated| gated.map(|row| row.outcome(token, |_| ())))
}

/// A stored snapshot version with its body.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its metadata.
    pub meta: SnapshotMeta,
    /// Its bytes, exactly as written (empty when read without them).
    pub body: Bytes,
}

#[derive(Debug, FromRow)]
struct VersionRow {
    version: i64,
    token: i64,
    etag: String,
    size: i64,
    content_type: String,
    updated_at: DateTime<Utc>,
}

impl VersionRow {
    fn into_meta(self, key: Option<&Key>) -> SnapshotMeta {
        SnapshotMeta {
            key: key.cloned(),
            version: Version::from_stored(self.version),
            token: FencingToken::new(self.token).expect("stored tokens are positive"),
            etag: ETag::from_stored(self.etag),
            size: self.size,
            content_type: self.content_type,
            updated_at: self.updated_at,
        }
    }
}

#[derive(Debug, FromRow)]
struct BodyRow {
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

/// A version row of a list, all NULL when the page is empty.
#[derive(Debug, FromRow)]
struct ListedVersion {
    version: Option<i64>,
    token: Option<i64>,
    etag: Option<String>,
    size: Option<i64>,
    content_type: Option<String>,
    updated_at: Option<DateTime<Utc>>,
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
        })
    }
}

/// The snapshot read statement ([`get`]).
const GET: &str = include_str!("sql/get.sql");

/// Reads the current snapshot (`version` = `None`) or one retained version: only versions of a
/// key that has a current snapshot, within the retention window, so a version that a later write
/// pruned, or that a delete removed, is gone even if its row lingers. One statement, so the head
/// and the body it points at are from one committed state. Without `with_body` (a `HEAD`) the
/// body is not even read from storage, and the answer's body is empty.
pub async fn get(
    db: &Db,
    key: &Key,
    version: Option<Version>,
    keep_versions: i64,
    with_body: bool,
) -> Result<Option<Snapshot>> {
    let row: Option<BodyRow> = db
        .fetch_optional(Effect::Reads, || {
            sqlx::query_as(GET)
                .bind(key.as_str())
                .bind(keep_versions)
                .bind(version.map(Version::get))
                .bind(with_body)
        })
        .await?;
    Ok(row.map(|r| Snapshot {
        meta: r.meta.into_meta(None),
        body: r.body.map(Bytes::from).unwrap_or_default(),
    }))
}

/// Lists the retained versions (by the same rule as [`get`]), newest first, below the cursor's
/// version; `None` when the key has no current snapshot. One statement: the lateral join reads
/// the versions of the head row it joins, from one committed state.
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
