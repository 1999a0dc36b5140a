//! The audit log: `rejections` (refused fenced writes, written by the fenced statements in
//! [`super::snapshots`]) and `recoveries` (recovery records replaced by a reconciling grant,
//! written by [`super::leases::acquire`]). Reads page newest first by id; retention prunes in
//! small batches.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgPool, Postgres, QueryBuilder};

use super::leases::Page;
use super::{Bounded, Result};
use crate::domain::{
    Cursor, FencingToken, Key, Metadata, Owner, PageLimit, RecoveryReason, RecoveryRecord,
    rfc3339_millis,
};

/// Which audit table a query reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Log {
    /// Refused fenced writes.
    Rejections,
    /// Replaced recovery records.
    Recoveries,
}

impl Log {
    fn table(self) -> &'static str {
        match self {
            Self::Rejections => "rejections",
            Self::Recoveries => "recoveries",
        }
    }
}

/// The filters of an audit page. `reason` was checked by the caller against the log's reasons.
#[derive(Debug, Clone)]
pub struct AuditQuery {
    /// Only rows of this key.
    pub key: Option<Key>,
    /// Only rows with this reason.
    pub reason: Option<&'static str>,
    /// Only rows at or after this time.
    pub since: Option<DateTime<Utc>>,
    /// Only rows before this time.
    pub until: Option<DateTime<Utc>>,
    /// Page size.
    pub limit: PageLimit,
    /// Only rows with an id below this (the cursor).
    pub before_id: Option<i64>,
}

/// One refused write, as the audit log shows it.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct Rejection {
    /// Row id; pages are ordered by it, newest first.
    pub id: i64,
    /// When the write was refused (database clock).
    #[serde(with = "rfc3339_millis")]
    pub at: DateTime<Utc>,
    /// The key written to.
    pub key: String,
    /// `stale_token` or `unknown_token`.
    pub reason: String,
    /// The token the writer presented.
    pub presented_token: i64,
    /// The key's newest token then, or null for a key that never had a lease.
    pub highest_token: Option<i64>,
    /// The owner of the key's newest lease then.
    pub holder: Option<String>,
    /// `put` or `delete`.
    pub operation: String,
    /// The refused request's `x-request-id`.
    pub request_id: Option<String>,
    /// The refused request's peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, null until authentication exists.
    pub principal: Option<String>,
}

/// One replaced recovery record. It has the fields of a [`Rejection`], read for a reconcile
/// (`operation` is `reconcile`, `presented_token` null since an acquire presents none,
/// `highest_token` and `holder` the new grant's token and owner), plus the replaced record and
/// who reconciled it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recovery {
    /// Row id; pages are ordered by it, newest first.
    pub id: i64,
    /// When the record was replaced (database clock).
    #[serde(with = "rfc3339_millis")]
    pub at: DateTime<Utc>,
    /// The key.
    pub key: String,
    /// The replaced record's reason.
    pub reason: RecoveryReason,
    /// Always null: a reconciling acquire presents no token.
    pub presented_token: Option<i64>,
    /// The reconciling grant's token, the key's newest token from then on.
    pub highest_token: i64,
    /// The reconciling grant's owner.
    pub holder: String,
    /// Always `reconcile`.
    pub operation: &'static str,
    /// The reconciling request's `x-request-id`.
    pub request_id: Option<String>,
    /// The reconciling request's peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, null until authentication exists.
    pub principal: Option<String>,
    /// The record that was replaced.
    pub recovery: RecoveryRecord,
    /// Who stated that the leftovers were reconciled (the new grant's owner).
    pub reconciled_by: String,
}

#[derive(Debug, FromRow)]
struct RecoveryRow {
    id: i64,
    at: DateTime<Utc>,
    key: String,
    reason: String,
    record_owner: String,
    record_token: i64,
    record_acquired_at: DateTime<Utc>,
    record_ended_at: DateTime<Utc>,
    record_metadata: Option<serde_json::Value>,
    reconciled_by: String,
    new_token: i64,
    request_id: Option<String>,
    remote_addr: Option<String>,
    principal: Option<String>,
}

impl RecoveryRow {
    fn into_recovery(self) -> Recovery {
        let reason = RecoveryReason::parse(&self.reason).expect("the table's check constraint");
        Recovery {
            id: self.id,
            at: self.at,
            key: self.key,
            reason,
            presented_token: None,
            highest_token: self.new_token,
            holder: self.reconciled_by.clone(),
            operation: "reconcile",
            request_id: self.request_id,
            remote_addr: self.remote_addr,
            principal: self.principal,
            recovery: RecoveryRecord {
                owner: Owner::parse(self.record_owner).expect("stored owners are valid"),
                token: FencingToken::new(self.record_token).expect("stored tokens are positive"),
                acquired_at: self.record_acquired_at,
                ended_at: self.record_ended_at,
                reason,
                metadata: self.record_metadata.map(Metadata::from_stored),
            },
            reconciled_by: self.reconciled_by,
        }
    }
}

/// Builds the page query with only the filters given, so that each combination is its own
/// prepared statement with a plan that uses the index of its filter: `(key, id)` or
/// `(reason, id)` for a key or reason, the primary key otherwise.
fn page_query(log: Log, q: &AuditQuery) -> QueryBuilder<'static, Postgres> {
    let mut b = QueryBuilder::new(format!("SELECT * FROM {} WHERE true", log.table()));
    if let Some(key) = &q.key {
        b.push(" AND key = ").push_bind(key.as_str().to_owned());
    }
    if let Some(reason) = q.reason {
        b.push(" AND reason = ").push_bind(reason);
    }
    if let Some(since) = q.since {
        b.push(" AND at >= ").push_bind(since);
    }
    if let Some(until) = q.until {
        b.push(" AND at < ").push_bind(until);
    }
    if let Some(before) = q.before_id {
        b.push(" AND id < ").push_bind(before);
    }
    b.push(" ORDER BY id DESC LIMIT ")
        .push_bind(q.limit.get() + 1);
    b
}

/// A page of refused writes, newest first.
pub async fn rejections(pool: &PgPool, q: &AuditQuery) -> Result<Page<Rejection>> {
    let rows: Vec<Rejection> = page_query(Log::Rejections, q)
        .build_query_as()
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    Ok(Page::from_rows(rows, q.limit, |r: &Rejection| {
        Cursor::after_id(r.id)
    }))
}

/// A page of replaced recovery records, newest first.
pub async fn recoveries(pool: &PgPool, q: &AuditQuery) -> Result<Page<Recovery>> {
    let rows: Vec<RecoveryRow> = page_query(Log::Recoveries, q)
        .build_query_as()
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    let items = rows.into_iter().map(RecoveryRow::into_recovery).collect();
    Ok(Page::from_rows(items, q.limit, |r: &Recovery| {
        Cursor::after_id(r.id)
    }))
}

/// Deletes up to `batch` rows of `log` older than `retention`, oldest first, and returns how many
/// it deleted. `SKIP LOCKED` lets several instances prune at once without waiting on each other;
/// a small batch keeps each statement short, so pruning never holds up a write.
pub async fn prune(pool: &PgPool, log: Log, retention: Duration, batch: i64) -> Result<u64> {
    let sql = format!(
        "DELETE FROM {t} WHERE id IN (
            SELECT id FROM {t} WHERE at < now() - $1 * interval '1 millisecond'
            ORDER BY at LIMIT $2 FOR UPDATE SKIP LOCKED)",
        t = log.table()
    );
    let done = sqlx::query(&sql)
        .bind(retention.as_millis() as i64)
        .bind(batch)
        .execute(pool)
        .bounded(pool)
        .await?;
    Ok(done.rows_affected())
}
