//! Watch (contract v1.1, "Watch"): the history of changes, numbered in commit order for the
//! whole service, and this instance's share of delivering it.
//!
//! Three parts, each written up where it lives:
//! - The changing statements note what they did in `change_inbox`, from triggers, in their own
//!   transaction (`migrations/20261204100000_changes.sql`): a change is noted exactly when it
//!   committed; the hot statements themselves only clear, and respect, a lease's
//!   `expiry_reported` (a renewal or release of a lease the watchers heard expire is refused).
//! - One instance on the database is the relay (the role is a lease by the database clock in
//!   `change_relay`, kept by every transaction of the relay's: `relay`). Every [`RELAY_TICK`]
//!   it moves the committed inbox rows into `changes`, numbering them after the highest id under
//!   the relay row's lock, so ids appear in increasing order to every reader; it reports expiries
//!   (it keeps the expiry time of every live lease, and marks the ones that passed by the
//!   database clock); it drops the history older than the retention; and it notifies
//!   `snapfence_changes` at each commit that numbered something.
//! - Every instance reads the new changes once, on that notification (or every second, should
//!   one be missed while its listening connection was down), and hands them to its watchers
//!   (`fan_out`). A watcher first catches up from the table, then follows the live changes,
//!   and catches up again if it fell behind: it sees every change after its starting id once,
//!   in id order ([`Watch`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;
use sqlx::{FromRow, PgPool};
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;

use super::{Bounded, Db, Result, StoreError, Tasks};
use crate::domain::{
    AuditId, AuditOperation, ChangeData, ChangeEvent, ChangeId, ChangeKind, ChangeReason, ETag,
    FencingToken, Key, KeyPrefix, Owner, RecoveryReason, RefusalReason, Version,
};

/// The channel the relay notifies at each commit that numbered changes.
const CHANNEL: &str = "snapfence_changes";
/// How often the relay looks for new changes and due expiries while there were none at its
/// last turn: the delay a watcher sees of the first change after a quiet spell, well inside
/// the contract's second for expiries.
pub const RELAY_TICK: Duration = Duration::from_millis(50);
/// How soon it looks again after a turn that numbered or marked something: under a steady
/// stream of changes, the delay a watcher sees.
const BUSY_TICK: Duration = Duration::from_millis(10);
/// How long the relay role lasts without being kept (database clock): how long the changes stop
/// when a relay dies, before another instance takes over.
const ROLE_MS: i64 = 3000;
/// How often the relay keeps its role while it has nothing else to do.
const KEEP_EVERY: Duration = Duration::from_secs(1);
/// How often an instance that is not the relay tries to take the role.
const CLAIM_EVERY: Duration = Duration::from_secs(1);
/// The most changes one relay transaction numbers; more are left for the next, at once.
const MOVE_BATCH: i64 = 5000;
/// How often the relay drops history older than the retention (or as often as the retention
/// itself, when that is shorter), and how much at a time.
const PRUNE_EVERY: Duration = Duration::from_secs(10);
const PRUNE_BATCH: i64 = 10_000;
/// How long a relay transaction may take before the relay gives it up (and rereads the
/// leases' expiry times, since it cannot tell what it committed).
const RELAY_BOUND: Duration = Duration::from_secs(5);
/// How often each instance reads new changes although no notification came.
const READ_EVERY: Duration = Duration::from_secs(1);
/// The pause before listening again after the listening connection failed.
const RELISTEN_AFTER: Duration = Duration::from_millis(250);
/// How many changes a read takes at once.
const PAGE: i64 = 500;
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
        });
        let tasks = vec![
            tokio::spawn(relay(Arc::downgrade(&inner))),
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
    /// `since` is older than the retained history.
    pub async fn watch(&self, prefix: &KeyPrefix, since: Option<ChangeId>) -> Result<Opened> {
        // Following before reading: a change that the read misses is one that committed after
        // it, and the reader hands it to this watch.
        let live = self.inner.live.subscribe();
        let top = Top::read(&self.inner.pool).await?;
        let from = match since {
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
                let page = match read(&self.inner.pool, self.last, &self.prefix).await {
                    Ok(page) => page,
                    Err(e) => return Some(Err(e)),
                };
                self.caught_up = page.len() < PAGE as usize;
                if let Some(last) = page.last() {
                    self.last = last.id.get();
                }
                self.backlog.extend(page);
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

/// Where the history stands (`sql/changes_top.sql`).
#[derive(FromRow)]
struct Top {
    top: i64,
    pruned_through: i64,
}

impl Top {
    async fn read(pool: &PgPool) -> Result<Self> {
        sqlx::query_as(include_str!("sql/changes_top.sql"))
            .fetch_one(pool)
            .bounded(pool)
            .await
    }
}

/// Up to [`PAGE`] changes after `after` of keys under `prefix` (`sql/changes_read.sql`).
async fn read(pool: &PgPool, after: i64, prefix: &str) -> Result<Vec<Arc<ChangeEvent>>> {
    let rows: Vec<ChangeRow> = sqlx::query_as(include_str!("sql/changes_read.sql"))
        .bind(after)
        .bind(prefix)
        .bind(PAGE)
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    Ok(rows.into_iter().map(|r| Arc::new(r.into_event())).collect())
}

/// A row of `changes`.
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
                let full = page.len() == PAGE as usize;
                for change in page {
                    after = change.id.get();
                    // No watcher: nothing to hand on.
                    let _ = i.live.send(change);
                }
                last = Some(after);
                if !full {
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

/// The relay's own state, while it holds the role.
struct Relay {
    /// The live leases by expiry time (database clock), soonest first.
    expiries: BinaryHeap<Reverse<(DateTime<Utc>, String, i64)>>,
    /// The database clock less this host's, at the last transaction.
    offset: chrono::TimeDelta,
    /// Whether `expiries` may have missed something (a transaction whose outcome is unknown):
    /// reread at the next transaction.
    stale: bool,
    kept: Instant,
    pruned: Instant,
}

impl Relay {
    /// Whether an expiry is due by the database clock, as this host estimates it.
    fn expiry_due(&self) -> bool {
        self.expiries
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= Utc::now() + self.offset)
    }

    /// Takes out the leases whose expiry has passed at `clock`.
    fn take_due(&mut self, clock: DateTime<Utc>) -> (Vec<String>, Vec<i64>) {
        let (mut keys, mut tokens) = (Vec::new(), Vec::new());
        while let Some(Reverse((at, _, _))) = self.expiries.peek() {
            if *at > clock {
                break;
            }
            let Reverse((_, key, token)) = self.expiries.pop().expect("peeked");
            keys.push(key);
            tokens.push(token);
        }
        (keys, tokens)
    }

    fn expect(&mut self, leases: Vec<PendingExpiry>) {
        self.expiries.extend(
            leases
                .into_iter()
                .map(|l| Reverse((l.expires_at, l.key, l.token))),
        );
    }
}

/// A lease whose expiry is still to be reported.
#[derive(FromRow)]
struct PendingExpiry {
    key: String,
    token: i64,
    expires_at: DateTime<Utc>,
}

/// A change the relay numbered (`sql/changes_move.sql`).
#[derive(FromRow)]
struct Moved {
    id: i64,
    kind: String,
    key: String,
    token: i64,
    expires_at: Option<DateTime<Utc>>,
}

/// Holds, or tries to take, the relay role, and does the relay's work while it holds it.
async fn relay(inner: Weak<Inner>) {
    let mut role: Option<Relay> = None;
    let mut last_claim: Option<Instant> = None;
    loop {
        let Some(i) = inner.upgrade() else {
            return;
        };
        let pause = if role.is_none() && last_claim.is_some_and(|t| t.elapsed() < CLAIM_EVERY) {
            CLAIM_EVERY.saturating_sub(last_claim.map_or(Duration::ZERO, |t| t.elapsed()))
        } else {
            if role.is_none() {
                last_claim = Some(Instant::now());
            }
            match tokio::time::timeout(RELAY_BOUND, relay_once(&i, &mut role)).await {
                Ok(Ok(pause)) => pause,
                failed => {
                    if let Ok(Err(e)) = failed {
                        tracing::warn!(error = %e, "the change relay's transaction failed; trying again");
                    } else {
                        tracing::warn!(
                            "the change relay's transaction took too long; trying again"
                        );
                    }
                    if let Some(r) = role.as_mut() {
                        r.stale = true;
                    }
                    RELAY_TICK
                }
            }
        };
        drop(i);
        tokio::time::sleep(pause).await;
    }
}

/// One turn of the relay: keeps (or takes) the role, reports the due expiries, numbers the new
/// changes, and now and then prunes, in one transaction; then reports the due expiries. How long
/// to pause before the next turn.
async fn relay_once(i: &Inner, role: &mut Option<Relay>) -> Result<Duration> {
    if let Some(r) = role.as_ref() {
        let idle = !r.stale
            && r.kept.elapsed() < KEEP_EVERY
            && !r.expiry_due()
            && !inbox_has_rows(&i.pool).await?;
        if idle {
            return Ok(RELAY_TICK);
        }
    }
    let mut tx = i.pool.begin().await?;
    let clock: Option<DateTime<Utc>> = sqlx::query_scalar(include_str!("sql/changes_claim.sql"))
        .bind(&i.name)
        .bind(role.is_some())
        .bind(ROLE_MS)
        .fetch_optional(&mut *tx)
        .await?;
    let Some(clock) = clock else {
        if role.take().is_some() {
            tracing::info!("this instance no longer relays changes");
        }
        return Ok(RELAY_TICK);
    };
    let relay = match role {
        Some(r) if !r.stale => r,
        _ => {
            if role.is_none() {
                tracing::info!("this instance relays changes");
            }
            let live: Vec<PendingExpiry> = sqlx::query_as(include_str!("sql/changes_live.sql"))
                .fetch_all(&mut *tx)
                .await?;
            let mut fresh = Relay {
                expiries: BinaryHeap::new(),
                offset: chrono::TimeDelta::zero(),
                stale: false,
                kept: Instant::now(),
                pruned: Instant::now() - PRUNE_EVERY,
            };
            fresh.expect(live);
            role.insert(fresh)
        }
    };
    relay.offset = clock - Utc::now();
    relay.kept = Instant::now();
    let moved: Vec<Moved> = sqlx::query_as(include_str!("sql/changes_move.sql"))
        .bind(MOVE_BATCH)
        .fetch_all(&mut *tx)
        .await?;
    if let Some(last) = moved.last() {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(last.id.to_string())
            .execute(&mut *tx)
            .await?;
    }
    let prune = relay.pruned.elapsed() >= PRUNE_EVERY.min(i.retention);
    if prune {
        let retention = i64::try_from(i.retention.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(include_str!("sql/changes_prune.sql"))
            .bind(retention)
            .bind(PRUNE_BATCH)
            .execute(&mut *tx)
            .await?;
    }
    // Until the commit is known, which grants' expiries to expect is not known either.
    relay.stale = true;
    tx.commit().await?;
    relay.stale = false;
    if prune {
        relay.pruned = Instant::now();
    }
    let full = moved.len() == MOVE_BATCH as usize;
    let numbered = !moved.is_empty();
    relay.expect(
        moved
            .into_iter()
            .filter(|m| m.kind == ChangeKind::LeaseGranted.as_str())
            .filter_map(|m| {
                Some(PendingExpiry {
                    expires_at: m.expires_at?,
                    key: m.key,
                    token: m.token,
                })
            })
            .collect(),
    );
    relay.stale = true;
    let marked = report_expiries(&i.pool, relay, clock).await?;
    relay.stale = false;
    Ok(if full {
        Duration::ZERO
    } else if numbered || marked {
        BUSY_TICK
    } else {
        RELAY_TICK
    })
}

/// Marks the leases whose expiry passed by `clock` (`sql/changes_expire.sql`), each statement
/// on its own (the marks hold their row locks for one statement, not for the numbering), and
/// keeps expecting the ones that are not over after all (renewed meanwhile, or skipped while a
/// hot statement held them). Whether it marked any (their events wait in the inbox).
async fn report_expiries(pool: &PgPool, relay: &mut Relay, clock: DateTime<Utc>) -> Result<bool> {
    let (keys, tokens) = relay.take_due(clock);
    if keys.is_empty() {
        return Ok(false);
    }
    let marked = sqlx::query(include_str!("sql/changes_expire.sql"))
        .bind(&keys)
        .bind(&tokens)
        .execute(pool)
        .bounded(pool)
        .await?
        .rows_affected();
    let pending: Vec<PendingExpiry> = sqlx::query_as(include_str!("sql/changes_pending.sql"))
        .bind(&keys)
        .bind(&tokens)
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    relay.expect(pending);
    Ok(marked > 0)
}

/// Whether any change waits in the inbox: the relay's check while it has nothing else to do.
async fn inbox_has_rows(pool: &PgPool) -> Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT FROM change_inbox)")
        .fetch_one(pool)
        .bounded(pool)
        .await
}
