//! The `snapshot_versions` table and the snapshot head on `leases`: fenced writes and deletes,
//! and reads.
//!
//! The fencing rule is checked against the key's lease row while holding its row lock, by the
//! same statement that writes (or refuses and audits). Grants take the same lock, so a write and
//! a grant on one key, from any instances, are ordered: a write that commits before a grant was
//! made with the then-newest token, and a write after it sees the new token and is refused.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgPool};

use crate::domain::RefusalReason;

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
    /// The content type to store.
    pub content_type: String,
}

/// The first part of every fenced statement: `cur` locks the key's lease row and yields its
/// newest version, `verdict` applies the fencing rule and then `If-Match`, and `refused` writes
/// the audit row of a refusal. Parameters: `$1` key, `$2` token, `$3` whether `If-Match` was
/// sent, `$4` its strong tags (NULL for `*`), `$5..$7` request id, remote address, principal.
/// `$stale_below` is what a lower token is stale against: always `cur.token`, the key's newest
/// granted token, except in the negative control (`fencing_broken`, builds with the `fault-controls` feature only).
macro_rules! fenced_ctes {
    ($operation:literal) => {
        fenced_ctes!($operation, "cur.token")
    };
    ($operation:literal, $stale_below:literal) => {
        concat!(
            "WITH cur AS (
                SELECT key, token, owner, end_reason, snapshot_version, snapshot_etag
                FROM leases WHERE key = $1 FOR NO KEY UPDATE),
            verdict AS (
                SELECT CASE
                    WHEN cur.key IS NULL OR $2 > cur.token THEN 'unknown_token'
                    WHEN $2 < ",
            $stale_below,
            " OR cur.end_reason IS NOT NULL THEN 'stale_token'
                    WHEN $3 AND (cur.snapshot_etag IS NULL
                                 OR NOT ($4::text[] IS NULL OR cur.snapshot_etag = ANY($4::text[])))
                        THEN 'precondition_failed'
                    ELSE 'accepted'
                END AS outcome,
                cur.token AS highest_token, cur.owner AS holder,
                cur.snapshot_etag IS NULL AS created, cur.snapshot_version
                FROM (VALUES (1)) AS one LEFT JOIN cur ON true),
            refused AS (
                INSERT INTO rejections (key, reason, presented_token, highest_token, holder,
                    operation, request_id, remote_addr, principal)
                SELECT $1, verdict.outcome, $2, verdict.highest_token, verdict.holder, '",
            $operation,
            "', $5, $6, $7
                FROM verdict WHERE verdict.outcome IN ('stale_token', 'unknown_token')
                RETURNING id),"
        )
    };
}

/// The fenced write statement, with the bound a lower token is stale against (see
/// [`fenced_ctes`]) and where the body comes from (`$11`, or the upload table).
macro_rules! put_statement {
    ($stale_below:literal) => {
        put_statement!($stale_below, "$11")
    };
    ($stale_below:literal, $body:literal) => {
        concat!(
            fenced_ctes!("put", $stale_below),
            "
    head AS (
        UPDATE leases SET snapshot_version = leases.snapshot_version + 1, snapshot_etag = $8
        FROM verdict WHERE leases.key = $1 AND verdict.outcome = 'accepted'
        RETURNING leases.snapshot_version AS version),
    stored AS (
        INSERT INTO snapshot_versions (key, version, token, etag, size, content_type, updated_at, body)
        SELECT $1, head.version, $2, $8, $9, $10, now(), ",
            $body,
            " FROM head
        RETURNING version, updated_at),
    pruned AS (
        DELETE FROM snapshot_versions v USING head
        WHERE v.key = $1 AND v.version <= head.version - $12)
    SELECT verdict.outcome, verdict.highest_token, verdict.created, refused.id AS audit_id,
        stored.version, stored.updated_at
    FROM verdict LEFT JOIN refused ON true LEFT JOIN stored ON true"
        )
    };
}
/// The fenced write. After the shared checks, `head` bumps the key's version counter and sets
/// its ETag on the locked row (re-read under the lock, so the version is gapless however many
/// writers race), `stored` inserts the body, and `pruned` drops the version that falls out of
/// the retention window. Extra parameters: `$8` ETag, `$9` size, `$10` content type, `$11`
/// body, `$12` versions to keep.
pub(crate) const PUT: &str = put_statement!("cur.token");

/// The negative control of the fault tests, compiled only with the `fault-controls` feature: [`PUT`] with the
/// classic fencing bug of checking a token against the highest token *written* to the key
/// instead of its newest *granted* one, which lets a superseded holder write until its successor
/// first writes. The history checker must find that; see `tests/faults`.
#[cfg(feature = "fault-controls")]
const PUT_CHECKED_AGAINST_WRITTEN_TOKENS: &str =
    put_statement!("coalesce((SELECT max(w.token) FROM snapshot_versions w WHERE w.key = $1), 0)");

/// [`PUT`] for a body uploaded beforehand into the connection's upload table (see
/// [`Db::fetch_one_uploading`]) rather than bound as `$11` (bound NULL, unused). Identical
/// otherwise: the same checks, locks and audit.
const PUT_UPLOADED: &str =
    put_statement!("cur.token", "(SELECT body FROM pg_temp.snapfence_upload)");

/// The negative control for uploaded bodies.
#[cfg(feature = "fault-controls")]
const PUT_UPLOADED_CHECKED_AGAINST_WRITTEN_TOKENS: &str = put_statement!(
    "coalesce((SELECT max(w.token) FROM snapshot_versions w WHERE w.key = $1), 0)",
    "(SELECT body FROM pg_temp.snapfence_upload)"
);

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
        return if uploaded {
            PUT_UPLOADED_CHECKED_AGAINST_WRITTEN_TOKENS
        } else {
            PUT_CHECKED_AGAINST_WRITTEN_TOKENS
        };
    }
    if uploaded { PUT_UPLOADED } else { PUT }
}

/// The fenced delete's first statement: after the shared checks, `head` marks the key as having
/// no current snapshot. Its versions are removed by a second statement in the same transaction
/// (see [`delete`]).
const DELETE_HEAD: &str = concat!(
    fenced_ctes!("delete"),
    "
    head AS (
        UPDATE leases SET snapshot_etag = NULL
        FROM verdict WHERE leases.key = $1 AND verdict.outcome = 'accepted')
    SELECT verdict.outcome, verdict.highest_token, verdict.created, refused.id AS audit_id,
        NULL::bigint AS version, NULL::timestamptz AS updated_at
    FROM verdict LEFT JOIN refused ON true"
);

#[derive(Debug, FromRow)]
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
) -> Result<WriteOutcome<Written>> {
    let etag = ETag::of(&req.body);
    let (has_if_match, tags) = if_match_params(req.if_match.as_ref());
    let upload = req.body.len() >= UPLOAD_FROM;
    let statement = || {
        sqlx::query_as(put_statement(upload))
            .bind(req.key.as_str())
            .bind(req.token.get())
            .bind(has_if_match)
            .bind(tags.clone())
            .bind(ctx.request_id.as_deref())
            .bind(ctx.remote_addr.as_deref())
            .bind(ctx.principal.as_deref())
            .bind(etag.as_str())
            .bind(req.body.len() as i64)
            .bind(req.content_type.as_str())
            .bind((!upload).then_some(req.body.as_ref()))
            .bind(keep_versions)
    };
    let row: FencedRow = if upload {
        db.fetch_one_uploading(&req.body, statement()).await?
    } else {
        db.fetch_one(statement).await?
    };
    Ok(row.outcome(req.token, |r| Written {
        created: r.created.unwrap_or(true),
        meta: SnapshotMeta {
            key: Some(req.key.clone()),
            version: Version::from_stored(r.version.expect("an accepted write has a version")),
            token: req.token,
            etag,
            size: req.body.len() as i64,
            content_type: req.content_type.clone(),
            updated_at: r.updated_at.expect("an accepted write has a time"),
        },
    }))
}

/// A fenced delete: one short transaction. The first statement (`DELETE_HEAD`) checks,
/// clears the head or refuses and audits, under the key's row lock. The second removes the
/// key's versions; it runs with a snapshot taken after the lock was granted, so it sees every
/// version committed before, and no writer can add one until this commits.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key, token = %token))]
pub async fn delete(
    pool: &PgPool,
    key: &Key,
    token: FencingToken,
    if_match: Option<&EntityTagCondition>,
    ctx: &RequestContext,
) -> Result<WriteOutcome<()>> {
    let (has_if_match, tags) = if_match_params(if_match);
    let mut tx = pool.begin().bounded(pool).await?;
    let row: FencedRow = sqlx::query_as(DELETE_HEAD)
        .bind(key.as_str())
        .bind(token.get())
        .bind(has_if_match)
        .bind(tags)
        .bind(ctx.request_id.as_deref())
        .bind(ctx.remote_addr.as_deref())
        .bind(ctx.principal.as_deref())
        .fetch_one(&mut *tx)
        .bounded(pool)
        .await?;
    let outcome = row.outcome(token, |_| ());
    if matches!(outcome, WriteOutcome::Accepted(())) {
        sqlx::query("DELETE FROM snapshot_versions WHERE key = $1")
            .bind(key.as_str())
            .execute(&mut *tx)
            .bounded(pool)
            .await?;
    }
    tx.commit().bounded(pool).await?;
    Ok(outcome)
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
pub(crate) const GET: &str =
    "SELECT v.version, v.token, v.etag, v.size, v.content_type, v.updated_at,
        CASE WHEN $4 THEN v.body END AS body
    FROM leases l JOIN snapshot_versions v ON v.key = l.key
    WHERE l.key = $1 AND l.snapshot_etag IS NOT NULL AND v.version > l.snapshot_version - $2
      AND v.version = coalesce($3, l.snapshot_version)";

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
        .fetch_optional(|| {
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
    const VERSIONS: &str = "SELECT l.snapshot_etag IS NOT NULL AS has_snapshot,
            v.version, v.token, v.etag, v.size, v.content_type, v.updated_at
        FROM leases l LEFT JOIN LATERAL (
            SELECT * FROM snapshot_versions sv
            WHERE sv.key = l.key AND l.snapshot_etag IS NOT NULL
              AND sv.version > l.snapshot_version - $2
              AND sv.version < coalesce($3, 9223372036854775807)
            ORDER BY sv.version DESC LIMIT $4) v ON true
        WHERE l.key = $1";
    let rows: Vec<ListedRow> = sqlx::query_as(VERSIONS)
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
