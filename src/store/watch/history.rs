//! The history as this instance reads it: whole epochs, cached for the watchers catching up, with
//! uncached reads paced so they keep a bounded share of the database.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool, Row};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::domain::{
    AuditId, AuditOperation, ChangeData, ChangeEvent, ChangeId, ChangeKind, ChangeReason, ETag,
    FencingToken, Key, Owner, RecoveryReason, RefusalReason, Version,
};
use crate::store::{Bounded, Result};

/// Changes one read takes (whole epochs, at most [`EPOCHS`]).
const PAGE: i64 = 4000;
const EPOCHS: i64 = 32;
/// Changes cached (~250 bytes each), least recently used out first; a larger epoch is kept alone.
const CACHED: usize = 16_384;

pub(super) struct Epoch {
    pub first_id: i64,
    pub last_id: i64,
    pub changes: Vec<Arc<ChangeEvent>>,
}

pub(super) struct Read {
    pub epochs: Vec<Arc<Epoch>>,
    pub complete: bool,
}

impl Read {
    /// The epochs of `rows`, in `sql/read.sql` order, with the changes after `after`. Each
    /// epoch comes whole, so that a transaction's changes all take the id of its first (`txn`).
    pub fn from_rows(rows: impl IntoIterator<Item = ReadRow>, after: i64) -> Self {
        let mut read = Read {
            epochs: Vec::new(),
            complete: true,
        };
        let mut epoch: Option<(Epoch, Vec<ChangeRow>)> = None;
        for row in rows {
            if epoch.as_ref().is_none_or(|(e, _)| e.last_id != row.last_id) {
                read.epochs
                    .extend(epoch.take().map(|e| Arc::new(numbered(e, after))));
                epoch = Some((
                    Epoch {
                        first_id: row.first_id,
                        last_id: row.last_id,
                        changes: Vec::new(),
                    },
                    Vec::new(),
                ));
            }
            read.complete = row.newest.is_none_or(|newest| row.last_id >= newest);
            if let (Some((_, changes)), Some(change)) = (epoch.as_mut(), row.change) {
                changes.push(change);
            }
        }
        read.epochs
            .extend(epoch.map(|e| Arc::new(numbered(e, after))));
        read
    }
}

/// An epoch with its changes after `after` as events, each of a transaction with the id of the
/// transaction's first change. A transaction's changes share its xid and fence; one batch commits
/// several transactions in one xid, never two of one fence.
fn numbered((mut epoch, rows): (Epoch, Vec<ChangeRow>), after: i64) -> Epoch {
    fn txn(r: &ChangeRow) -> (&str, Option<&str>) {
        (r.xid.as_str(), r.fencing_key.as_deref())
    }
    let mut firsts: HashMap<(&str, Option<&str>), i64> = HashMap::new();
    for row in rows.iter().filter(|r| r.txn_size.is_some()) {
        let first = firsts.entry(txn(row)).or_insert(row.id);
        *first = (*first).min(row.id);
    }
    let txns: Vec<Option<i64>> = rows
        .iter()
        .map(|r| r.txn_size.and(firsts.get(&txn(r)).copied()))
        .collect();
    epoch.changes = rows
        .into_iter()
        .zip(txns)
        .filter(|(row, _)| row.id > after)
        .map(|(row, txn)| Arc::new(row.into_event(txn)))
        .collect();
    epoch
}

pub(super) struct History {
    pool: PgPool,
    cache: Mutex<Cache>,
    /// At most a third of a connection: each read is followed by twice its time idle.
    lane: Semaphore,
}

impl History {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            cache: Mutex::new(Cache::default()),
            lane: Semaphore::new(1),
        }
    }

    /// The whole epochs after `after`, for the reader (uncached).
    pub async fn read(&self, after: i64) -> Result<Read> {
        let rows: Vec<ReadRow> = sqlx::query_as(include_str!("sql/read.sql"))
            .bind(after)
            .bind(PAGE)
            .bind(EPOCHS)
            .fetch_all(&self.pool)
            .bounded(&self.pool)
            .await?;
        Ok(Read::from_rows(rows, after))
    }

    /// Cached epochs after `after`, else the next from the database; empty when none is newer.
    pub async fn catch_up(&self, after: i64) -> Result<Vec<Arc<Epoch>>> {
        let cached = self.cached_from(after);
        if !cached.is_empty() {
            return Ok(cached);
        }
        let _lane = self.lane.acquire().await.expect("never closed");
        let cached = self.cached_from(after);
        if !cached.is_empty() {
            return Ok(cached);
        }
        let started = Instant::now();
        let read = self.read(after).await?;
        {
            // The first epoch was read only after `after`; the cache holds whole epochs.
            let mut cache = self.cache.lock().expect("never poisoned");
            for epoch in read.epochs.iter().filter(|e| e.first_id > after) {
                cache.put(epoch.clone());
            }
        }
        if !read.complete {
            tokio::time::sleep(started.elapsed() * 2).await;
        }
        Ok(read.epochs)
    }

    fn cached_from(&self, after: i64) -> Vec<Arc<Epoch>> {
        let mut cache = self.cache.lock().expect("never poisoned");
        let mut epochs = Vec::new();
        let (mut next, mut changes) = (after + 1, 0);
        while changes < PAGE as usize
            && let Some(epoch) = cache.get(next)
        {
            changes += epoch.changes.len();
            next = epoch.last_id + 1;
            epochs.push(epoch);
        }
        epochs
    }
}

#[derive(Default)]
struct Cache {
    epochs: BTreeMap<i64, (Arc<Epoch>, u64)>,
    changes: usize,
    clock: u64,
}

impl Cache {
    fn get(&mut self, id: i64) -> Option<Arc<Epoch>> {
        self.clock += 1;
        let (_, (epoch, used)) = self.epochs.range_mut(..=id).next_back()?;
        if epoch.last_id < id {
            return None;
        }
        *used = self.clock;
        Some(epoch.clone())
    }

    fn put(&mut self, epoch: Arc<Epoch>) {
        self.clock += 1;
        let size = epoch.changes.len();
        if let Some((old, _)) = self.epochs.insert(epoch.first_id, (epoch, self.clock)) {
            self.changes -= old.changes.len();
        }
        self.changes += size;
        while self.changes > CACHED && self.epochs.len() > 1 {
            let oldest = self
                .epochs
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(first, _)| *first)
                .expect("not empty");
            let (gone, _) = self.epochs.remove(&oldest).expect("present");
            self.changes -= gone.changes.len();
        }
    }
}

pub(super) struct ReadRow {
    first_id: i64,
    last_id: i64,
    newest: Option<i64>,
    change: Option<ChangeRow>,
}

impl<'r> FromRow<'r, PgRow> for ReadRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        let id: Option<i64> = row.try_get("id")?;
        Ok(Self {
            first_id: row.try_get("first_id")?,
            last_id: row.try_get("last_id")?,
            newest: row.try_get("newest")?,
            change: id.map(|_| ChangeRow::from_row(row)).transpose()?,
        })
    }
}

#[derive(FromRow)]
struct ChangeRow {
    id: i64,
    kind: String,
    key: String,
    token: i64,
    at: DateTime<Utc>,
    owner: Option<String>,
    expires_at: Option<DateTime<Utc>>,
    version: Option<i64>,
    etag: Option<String>,
    reason: Option<String>,
    audit_id: Option<i64>,
    operation: Option<String>,
    highest_token: Option<i64>,
    record_token: Option<i64>,
    fencing_key: Option<String>,
    txn_size: Option<i32>,
    xid: String,
}

impl ChangeRow {
    fn into_event(self, txn: Option<i64>) -> ChangeEvent {
        let refused = self.kind == "write.refused";
        let owner = self
            .owner
            .map(|o| Owner::parse(o).expect("stored owners are valid"));
        let token = |t: i64| FencingToken::new(t).expect("stored tokens are valid");
        let reason = self.reason.map(|r| {
            RefusalReason::parse(&r)
                .map(ChangeReason::Refusal)
                .or_else(|| RecoveryReason::parse(&r).map(ChangeReason::Recovery))
                .expect("stored reasons are valid")
        });
        let operation = self.operation.map(|o| match o.as_str() {
            "put" => AuditOperation::Put,
            "txn" => AuditOperation::Txn,
            _ => AuditOperation::Delete,
        });
        ChangeEvent {
            id: ChangeId::from_stored(self.id),
            event: ChangeKind::parse(&self.kind).expect("the table's CHECK names the kinds"),
            data: ChangeData {
                key: Key::parse(self.key).expect("stored keys are valid"),
                token: token(self.token),
                at: self.at,
                owner: owner.clone().filter(|_| !refused),
                holder: owner.filter(|_| refused),
                expires_at: self.expires_at,
                version: self.version.map(Version::from_stored),
                etag: self.etag.map(ETag::from_stored),
                reason,
                audit_id: self.audit_id.map(AuditId),
                operation,
                highest_token: self.highest_token.map(token),
                record_token: self.record_token.map(token),
                fencing_key: self
                    .fencing_key
                    .map(|k| Key::parse(k).expect("stored keys are valid")),
                txn: txn.map(ChangeId::from_stored),
                txn_size: self.txn_size.map(|n| n.unsigned_abs()),
            },
        }
    }
}
