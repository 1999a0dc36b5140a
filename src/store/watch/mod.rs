//! Watch (contract v1.1, "Watch"): the history of changes, numbered in one order for the whole
//! service, and this instance's share of delivering it.
//!
//! Three parts, each written up where it lives:
//! - The changing statements write what they did into `change_log`, from triggers, in their
//!   own transaction, once (`migrations/20261205000000_change_log.sql`): nothing is moved or
//!   renumbered afterwards, and a renewal writes nothing.
//! - One instance on the database is the relay (`relay.rs`): it gives the committed changes
//!   their ids by recording an epoch, a snapshot, every few milliseconds while changes come;
//!   it reports expiries; it drops the history older than the retention; and it notifies
//!   `snapfence_changes` at each epoch.
//! - Every instance reads each new epoch once, on that notification (or every second, should
//!   one be missed while its listening connection was down), and hands its changes to its
//!   watchers (`fan_out`). A watcher first catches up from the tables, then follows the live
//!   changes, and catches up again if it fell behind: it sees every change after its starting
//!   id once, in id order ([`Watch`]).

mod relay;

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{FromRow, PgPool, Row};
use tokio::sync::{Notify, Semaphore, broadcast, watch};

use super::{Bounded, Db, Result, StoreError, Tasks};
use crate::domain::{
    AuditId, AuditOperation, ChangeData, ChangeEvent, ChangeId, ChangeKind, ChangeReason, ETag,
    FencingToken, Key, KeyPrefix, Owner, RecoveryReason, RefusalReason, Version,
};

/// The channel the relay notifies at each epoch.
const CHANNEL: &str = "snapfence_changes";
/// How often each instance reads new changes although no notification came.
const READ_EVERY: Duration = Duration::from_secs(1);
/// The pause before listening again after the listening connection failed.
const RELISTEN_AFTER: Duration = Duration::from_millis(250);
/// How many changes one read takes: the epochs that begin within this many of its first change
/// (at least one, read whole), and at most [`EPOCHS`] of them.
const PAGE: i64 = 4000;
const EPOCHS: i64 = 32;
/// How many changes this instance's watchers may fall behind the newest before each catches
/// up from the table instead.
const LIVE_BUFFER: usize = 4096;

/// The history of changes and this instance's watchers. Cheap to clone; its tasks stop when
/// the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Changes {
    inner: Arc<Inner>,
    _tasks: Arc<Tasks>,
}

/// What the relay, the reader and the watchers of this instance share.
struct Inner {
    pool: PgPool,
    /// This instance's name as the relay's holder: unique per process.
    name: String,
    /// How long changes are kept.
    retention: Duration,
    /// Every new change, in id order, as this instance read it.
    live: broadcast::Sender<Arc<ChangeEvent>>,
    /// Woken by each notification of new changes.
    fresh: Notify,
    /// Set when the instance shuts down: every watch ends.
    stopping: watch::Sender<bool>,
    /// The catch-up reads that may run at once ([`catch_up_reads`]): a watcher behind the live
    /// changes waits here for its turn, so that however many catch up, they hold a bounded share
    /// of the pool that the relay, the reader of new changes and the other requests use.
    catch_up: Semaphore,
}

/// How many catch-up reads one instance runs at once: an eighth of its pool, at least one (two
/// with the default pool of 16), each lane busy a third of the time at most (a read's turn is
/// held twice as long again as it took, while more history remains). The hot statements run on connections of
/// their own (`store::db`), so these never take theirs; the bound keeps the rest of the pool
/// (the relay, each instance's reader of new changes, the audit log, the keys) and the
/// database's CPU for everything else.
fn catch_up_reads(pool: &PgPool) -> usize {
    (pool.options().get_max_connections() as usize / 8).max(1)
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Where a watch starts.
#[derive(Debug)]
pub enum Opened {
    /// The watch: every change after its starting id.
    Watching(Watch),
    /// The starting id is older than the retained history, which now starts after `horizon`.
    Compacted {
        /// The highest id pruned.
        horizon: ChangeId,
    },
    /// The starting id is above every id given so far (`newest`): it names no change, and a
    /// watch from it would skip the changes up to it unseen.
    Future {
        /// The newest id given.
        newest: ChangeId,
    },
}

impl Changes {
    /// Starts this instance's relay (taking the role when no one holds it) and its reader of new
    /// changes, keeping `retention` of history. Must be called within a Tokio runtime.
    pub fn start(db: &Db, retention: Duration) -> Self {
        let inner = Arc::new(Inner {
            pool: (**db).clone(),
            name: uuid::Uuid::new_v4().to_string(),
            retention,
            live: broadcast::Sender::new(LIVE_BUFFER),
            fresh: Notify::new(),
            stopping: watch::Sender::new(false),
            catch_up: Semaphore::new(catch_up_reads(db)),
        });
        let tasks = vec![
            tokio::spawn(relay::relay(Arc::downgrade(&inner))),
            tokio::spawn(listen(Arc::downgrade(&inner))),
            tokio::spawn(fan_out(Arc::downgrade(&inner))),
        ];
        Self {
            inner,
            _tasks: Arc::new(Tasks(tasks)),
        }
    }

    /// Ends every watch of this instance, now and from now on: called when the instance shuts
    /// down, which waits for the requests in flight, and a watch would never end by itself.
    pub fn stop(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// How many watches this instance serves, for the metrics.
    pub fn watching(&self) -> usize {
        self.inner.live.receiver_count()
    }

    /// A watch of the keys under `prefix`, from the change after `since` (or from now), unless
    /// `since` is older than the retained history or above the newest id given. `since` 0 is
    /// the oldest change kept, whatever was pruned.
    pub async fn watch(&self, prefix: &KeyPrefix, since: Option<ChangeId>) -> Result<Opened> {
        // Following before reading: a change that the read misses is one that committed after
        // it, and the reader hands it to this watch.
        let live = self.inner.live.subscribe();
        let top = Top::read(&self.inner.pool).await?;
        let from = match since {
            // The newest id is read from the epochs, which every instance's ids come from: an id
            // a client was sent is never above it. (A change committed but not yet numbered has
            // no id yet, so nothing can name it.)
            Some(since) if since.get() > top.top => {
                return Ok(Opened::Future {
                    newest: ChangeId::from_stored(top.top),
                });
            }
            Some(since) if since.get() == 0 => top.pruned_through,
            Some(since) if since.get() < top.pruned_through => {
                return Ok(Opened::Compacted {
                    horizon: ChangeId::from_stored(top.pruned_through),
                });
            }
            Some(since) => since.get(),
            None => top.top,
        };
        Ok(Opened::Watching(Watch {
            inner: self.inner.clone(),
            live,
            stopping: self.inner.stopping.subscribe(),
            prefix: prefix.as_str().to_owned(),
            last: from,
            caught_up: false,
            backlog: VecDeque::new(),
        }))
    }
}

/// One watcher's changes: every change of its keys after its starting id, once each, in id
/// order.
pub struct Watch {
    inner: Arc<Inner>,
    live: broadcast::Receiver<Arc<ChangeEvent>>,
    stopping: watch::Receiver<bool>,
    prefix: String,
    /// The id of the last change this watch passed (delivered, or not of its keys).
    last: i64,
    /// Whether the table has been read up to the live changes.
    caught_up: bool,
    backlog: VecDeque<Arc<ChangeEvent>>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("prefix", &self.prefix)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl Watch {
    /// The change id this watch has passed: where a client that resumes now would resume.
    pub fn position(&self) -> ChangeId {
        ChangeId::from_stored(self.last)
    }

    /// The next change; `None` once the instance shuts down, `Err` when the database cannot be
    /// read (the watcher then resumes from its last change).
    pub async fn next(&mut self) -> Option<Result<Arc<ChangeEvent>>> {
        loop {
            if *self.stopping.borrow() {
                return None;
            }
            if let Some(change) = self.backlog.pop_front() {
                return Some(Ok(change));
            }
            if !self.caught_up {
                let page = {
                    let _turn = tokio::select! {
                        turn = self.inner.catch_up.acquire() => turn.expect("never closed"),
                        _ = self.stopping.changed() => return None,
                    };
                    let started = tokio::time::Instant::now();
                    let page = read(&self.inner.pool, self.last, &self.prefix).await;
                    // Paced: the turn is held twice as long again as the read took, so that
                    // catching up keeps each of its lanes busy a third of the time at most, and
                    // the database has the rest for the writes.
                    if page.as_ref().is_ok_and(|p| !p.complete) {
                        tokio::time::sleep(started.elapsed() * 2).await;
                    }
                    page
                };
                let page = match page {
                    Ok(page) => page,
                    Err(e) => return Some(Err(e)),
                };
                self.caught_up = page.complete;
                self.last = page.through.unwrap_or(self.last);
                self.backlog.extend(page.changes);
                continue;
            }
            tokio::select! {
                received = self.live.recv() => match received {
                    Ok(change) if change.id.get() > self.last => {
                        self.last = change.id.get();
                        if change.data.key.as_str().starts_with(&self.prefix) {
                            return Some(Ok(change));
                        }
                    }
                    Ok(_) => {}
                    // Fell behind the buffer: the changes it missed are in the table.
                    Err(broadcast::error::RecvError::Lagged(_)) => self.caught_up = false,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                _ = self.stopping.changed() => return None,
            }
        }
    }
}

/// Where the history stands (`sql/top.sql`).
#[derive(FromRow)]
struct Top {
    top: i64,
    pruned_through: i64,
}

impl Top {
    async fn read(pool: &PgPool) -> Result<Self> {
        sqlx::query_as(include_str!("sql/top.sql"))
            .fetch_one(pool)
            .bounded(pool)
            .await
    }
}

/// What one read of the history gave (`sql/read.sql`).
struct Page {
    /// The changes of the keys asked for, in id order.
    changes: Vec<Arc<ChangeEvent>>,
    /// The id up to which the history has been read (changes of other keys included).
    through: Option<i64>,
    /// Whether that is the newest id given so far.
    complete: bool,
}

/// The changes after `after` of keys under `prefix`, from the whole epochs that begin within
/// [`PAGE`] changes of the first (at least one), [`EPOCHS`] at most.
async fn read(pool: &PgPool, after: i64, prefix: &str) -> Result<Page> {
    let rows: Vec<ReadRow> = sqlx::query_as(include_str!("sql/read.sql"))
        .bind(after)
        .bind(prefix)
        .bind(PAGE)
        .bind(EPOCHS)
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    let mut page = Page {
        changes: Vec::new(),
        through: None,
        complete: true,
    };
    for row in rows {
        page.through = Some(row.through);
        page.complete = row.newest.is_none_or(|newest| row.through >= newest);
        if let Some(change) = row.change {
            page.changes.push(Arc::new(change.into_event()));
        }
    }
    Ok(page)
}

/// A row of `sql/read.sql`: an epoch read, and one of its changes (none when none of them is of
/// the keys asked for).
struct ReadRow {
    through: i64,
    newest: Option<i64>,
    change: Option<ChangeRow>,
}

impl<'r> FromRow<'r, PgRow> for ReadRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        let id: Option<i64> = row.try_get("id")?;
        Ok(Self {
            through: row.try_get("through")?,
            newest: row.try_get("newest")?,
            change: id.map(|_| ChangeRow::from_row(row)).transpose()?,
        })
    }
}

/// A change as read, with its id.
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
}

impl ChangeRow {
    fn into_event(self) -> ChangeEvent {
        let token = |t: i64| FencingToken::new(t).expect("stored tokens are valid");
        let reason = self.reason.map(|r| {
            RefusalReason::parse(&r)
                .map(ChangeReason::Refusal)
                .or_else(|| RecoveryReason::parse(&r).map(ChangeReason::Recovery))
                .expect("stored reasons are valid")
        });
        let operation = self.operation.map(|o| match o.as_str() {
            "put" => AuditOperation::Put,
            _ => AuditOperation::Delete,
        });
        ChangeEvent {
            id: ChangeId::from_stored(self.id),
            event: ChangeKind::parse(&self.kind).expect("the table's CHECK names the kinds"),
            data: ChangeData {
                key: Key::parse(self.key).expect("stored keys are valid"),
                token: token(self.token),
                at: self.at,
                owner: self
                    .owner
                    .map(|o| Owner::parse(o).expect("stored owners are valid")),
                expires_at: self.expires_at,
                version: self.version.map(Version::from_stored),
                etag: self.etag.map(ETag::from_stored),
                reason,
                audit_id: self.audit_id.map(AuditId),
                operation,
                highest_token: self.highest_token.map(token),
                record_token: self.record_token.map(token),
            },
        }
    }
}

/// Listens on [`CHANNEL`] on a connection of its own and wakes the reader at each notification,
/// and once each time it listens again (a notification may have come while it did not).
async fn listen(inner: Weak<Inner>) {
    let Some(own) = inner.upgrade().map(|i| super::listening_pool(&i.pool)) else {
        return;
    };
    loop {
        let failure = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(CHANNEL).await?;
            loop {
                match inner.upgrade() {
                    Some(i) => i.fresh.notify_one(),
                    None => return Ok(()),
                }
                // `None`: the connection was lost, and notifications with it.
                if listener.try_recv().await?.is_none() {
                    return Ok::<(), sqlx::Error>(());
                }
            }
        }
        .await;
        if inner.strong_count() == 0 {
            return;
        }
        if let Err(e) = failure {
            tracing::warn!(error = %e, "cannot hear of new changes; watchers get them within a second instead");
        }
        tokio::time::sleep(RELISTEN_AFTER).await;
    }
}

/// Reads the new changes, in id order, when woken (or every [`READ_EVERY`]), and hands each to
/// this instance's watchers.
async fn fan_out(inner: Weak<Inner>) {
    let mut last: Option<i64> = None;
    loop {
        let Some(i) = inner.upgrade() else {
            return;
        };
        let read_all = async {
            let mut after = match last {
                Some(after) => after,
                None => Top::read(&i.pool).await?.top,
            };
            loop {
                let page = read(&i.pool, after, "").await?;
                for change in page.changes {
                    // No watcher: nothing to hand on.
                    let _ = i.live.send(change);
                }
                after = page.through.unwrap_or(after);
                last = Some(after);
                if page.complete {
                    return Ok::<(), StoreError>(());
                }
            }
        };
        if let Err(e) = read_all.await {
            tracing::warn!(error = %e, "cannot read new changes; trying again");
        }
        // Holds the instance's state for at most READ_EVERY once the last handle is gone.
        let _ = tokio::time::timeout(READ_EVERY, i.fresh.notified()).await;
    }
}
