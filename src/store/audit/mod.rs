//! The audit log: `rejections` (refused fenced writes) and `recoveries` (recovery records), written
//! by the statements that decide them.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgPool};

use super::{Bounded, Result};
use crate::domain::{
    AuditId, AuditOperation, Cursor, FencingToken, Key, Metadata, Owner, Page, PageLimit, Recovery,
    RecoveryReason, RecoveryRecord, RefusalReason, Rejection,
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
    /// Both logs.
    pub const ALL: [Log; 2] = [Log::Rejections, Log::Recoveries];

    /// The log's name, as the metrics label it: its table's.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rejections => "rejections",
            Self::Recoveries => "recoveries",
        }
    }

    /// The statement of a page of the log (for the plan tests).
    #[doc(hidden)]
    pub fn page(self) -> &'static str {
        match self {
            Self::Rejections => include_str!("sql/rejections_page.sql"),
            Self::Recoveries => include_str!("sql/recoveries_page.sql"),
        }
    }

    fn prune(self) -> &'static str {
        match self {
            Self::Rejections => include_str!("sql/rejections_prune.sql"),
            Self::Recoveries => include_str!("sql/recoveries_prune.sql"),
        }
    }
}

/// Each audit log's (name, estimated rows, bytes with indexes), from the catalogue.
pub async fn sizes(pool: &PgPool) -> Result<Vec<(Log, i64, i64)>> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(include_str!("sql/sizes.sql"))
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    Ok(Log::ALL
        .into_iter()
        .map(|log| {
            let (rows, bytes) = rows
                .iter()
                .find(|(t, ..)| t == log.name())
                .map_or((0, 0), |r| (r.1, r.2));
            (log, rows, bytes)
        })
        .collect())
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

#[derive(Debug, FromRow)]
struct RejectionRow {
    id: i64,
    at: DateTime<Utc>,
    key: String,
    reason: String,
    presented_token: i64,
    highest_token: Option<i64>,
    holder: Option<String>,
    operation: String,
    request_id: Option<String>,
    remote_addr: Option<String>,
    principal: Option<String>,
    fencing_key: Option<String>,
}

impl RejectionRow {
    fn into_rejection(self) -> Rejection {
        let fencing_key = self.fencing_key.unwrap_or_else(|| self.key.clone());
        Rejection {
            id: AuditId(self.id),
            at: self.at,
            key: Key::parse(self.key).expect("stored keys are valid"),
            reason: RefusalReason::parse(&self.reason).expect("the table's check constraint"),
            presented_token: FencingToken::new(self.presented_token)
                .expect("stored tokens are positive"),
            highest_token: self
                .highest_token
                .map(|t| FencingToken::new(t).expect("stored tokens are positive")),
            holder: self
                .holder
                .map(|h| Owner::parse(h).expect("stored owners are valid")),
            operation: match self.operation.as_str() {
                "delete" => AuditOperation::Delete,
                "txn" => AuditOperation::Txn,
                _ => AuditOperation::Put,
            },
            request_id: self.request_id,
            remote_addr: self.remote_addr,
            principal: self.principal,
            fencing_key: Some(Key::parse(fencing_key).expect("stored keys are valid")),
        }
    }
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
    operation: String,
    presented_token: Option<i64>,
}

impl RecoveryRow {
    fn into_recovery(self) -> Recovery {
        let reason = RecoveryReason::parse(&self.reason).expect("the table's check constraint");
        let reconciled_by = Owner::parse(self.reconciled_by).expect("stored owners are valid");
        Recovery {
            id: AuditId(self.id),
            at: self.at,
            key: Key::parse(self.key).expect("stored keys are valid"),
            reason,
            presented_token: self
                .presented_token
                .map(|t| FencingToken::new(t).expect("stored tokens are positive")),
            highest_token: FencingToken::new(self.new_token).expect("stored tokens are positive"),
            holder: reconciled_by.clone(),
            operation: match self.operation.as_str() {
                "reconciling" => AuditOperation::Reconciling,
                "reconciled" => AuditOperation::Reconciled,
                _ => AuditOperation::Reconcile,
            },
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
            reconciled_by,
        }
    }
}

/// A page of `log`'s rows, newest first. Not a prepared statement: PostgreSQL plans each call with
/// its values, so the filters not given drop out and a key's page reads the key's index.
async fn page<R>(pool: &PgPool, log: Log, q: &AuditQuery) -> Result<Vec<R>>
where
    R: for<'r> FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(log.page())
        .persistent(false)
        .bind(q.key.as_ref().map(|k| k.as_str()))
        .bind(q.reason)
        .bind(q.since)
        .bind(q.until)
        .bind(q.before_id)
        .bind(q.limit.get() + 1)
        .fetch_all(pool)
        .bounded(pool)
        .await
}

/// A page of refused writes, newest first.
pub async fn rejections(pool: &PgPool, q: &AuditQuery) -> Result<Page<Rejection>> {
    let rows: Vec<RejectionRow> = page(pool, Log::Rejections, q).await?;
    let items = rows.into_iter().map(RejectionRow::into_rejection).collect();
    Ok(Page::from_rows(items, q.limit, |r: &Rejection| {
        Cursor::after_id(r.id.0)
    }))
}

/// A page of replaced recovery records, newest first.
pub async fn recoveries(pool: &PgPool, q: &AuditQuery) -> Result<Page<Recovery>> {
    let rows: Vec<RecoveryRow> = page(pool, Log::Recoveries, q).await?;
    let items = rows.into_iter().map(RecoveryRow::into_recovery).collect();
    Ok(Page::from_rows(items, q.limit, |r: &Recovery| {
        Cursor::after_id(r.id.0)
    }))
}

/// Deletes up to `batch` rows older than `retention` (SKIP LOCKED, so writes never wait); how many.
pub async fn prune(pool: &PgPool, log: Log, retention: Duration, batch: i64) -> Result<u64> {
    super::engine::delete_batch(pool, log.prune(), retention, batch).await
}
