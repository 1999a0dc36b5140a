//! Watch (contract v1.1, "Watch"): the history of changes, numbered in one order for the whole
//! service, and this instance's share of delivering it.
//!
//! Three parts, each written up where it lives:
//! - The changing statements write what they did into `change_log` themselves, in their own
//!   transaction, once (`migrations/20261205000000_change_log.sql`): nothing is moved or
//!   renumbered afterwards, and a renewal writes nothing.
//! - One instance on the database is the relay (`relay.rs`): it gives the committed changes
//!   their ids by recording an epoch, a snapshot, every few milliseconds while changes come;
//!   it reports expiries; it drops the history older than the retention; and it notifies
//!   `snapfence_changes` at each epoch.
//! - Every instance reads each new epoch once (`reader.rs`), on that notification (or every
//!   second, should one be missed while its listening connection was down), and hands its
//!   changes to its watchers; the relay's own instance reads none: its turn returns the epoch's
//!   changes, which it hands on as they are. A watcher first catches up from the tables
//!   (through the epochs the instance's watchers share, `history.rs`), then follows the live
//!   changes, and catches up again if it fell behind: it sees every change after its starting
//!   id once, in id order ([`Watch`]).

mod history;
mod reader;
mod relay;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{FromRow, PgPool};
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;

use super::{Bounded, Db, Result, Tasks};
use crate::domain::{ChangeEvent, ChangeId, KeyPrefix};
use history::{Epoch, History};

/// The channel the relay notifies at each epoch.
const CHANNEL: &str = "snapfence_changes";
/// The longest an instance goes without reading new changes from the database, whatever it was
/// told or handed (a notification is lost while its listening connection is down).
const READ_EVERY: Duration = Duration::from_secs(1);
/// The pause before listening again after the listening connection failed.
const RELISTEN_AFTER: Duration = Duration::from_millis(250);
/// How many changes this instance's watchers may fall behind the newest before each catches
/// up from the table instead.
const LIVE_BUFFER: usize = 4096;

/// The relay's statements over a set of leases, by name: for the test that their generic plans,
/// made while the tables are empty, read those leases by key alone. They run on ordinary
/// connections, which keep a generic plan once it looks no costlier than planning each call.
#[doc(hidden)]
pub fn relay_statements() -> [(&'static str, &'static str); 2] {
    [("expire", relay::EXPIRE), ("pending", relay::PENDING)]
}

/// The relay's turn ($1 the holder's name, $2 whether it holds the role, $3 the role's length
/// in milliseconds): for the test that a connection plans it once, not at every turn.
#[doc(hidden)]
pub fn relay_turn() -> &'static str {
    relay::TURN
}

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
    /// The history as this instance reads it, and the epochs its watchers caught up through.
    history: History,
    /// The last id of the newest epoch the reader has begun to hand on (set before it does):
    /// a watcher subscribed to `live` receives every change above it, so one that has read
    /// the history up to it has caught up.
    handed: AtomicI64,
    /// The epochs this instance's relay made, in order, for the reader to hand on without
    /// reading them back (`relay.rs`): in one instance, the reader reads nothing.
    relayed: Mutex<VecDeque<Arc<Epoch>>>,
    /// Whether this instance's relay has a turn in flight, whose epoch comes through
    /// `relayed`: the reader does not read it meanwhile.
    turning: AtomicBool,
    /// The newest last id notified on [`CHANNEL`].
    told: AtomicI64,
    /// Set when notifications may have been missed (listening again): the reader reads.
    missed: AtomicBool,
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
            history: History::new((**db).clone()),
            handed: AtomicI64::new(i64::MAX),
            relayed: Mutex::new(VecDeque::new()),
            turning: AtomicBool::new(false),
            told: AtomicI64::new(0),
            missed: AtomicBool::new(true),
        });
        let tasks = vec![
            tokio::spawn(relay::relay(Arc::downgrade(&inner))),
            tokio::spawn(reader::listen(Arc::downgrade(&inner))),
            tokio::spawn(reader::fan_out(Arc::downgrade(&inner))),
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
        let pool = &self.inner.pool;
        let Some(since) = since else {
            let from = Opening::read(pool).await?.start(pool).await?;
            return Ok(self.opened(prefix, live, from));
        };
        let top = Top::read(pool).await?;
        let from = match since.get() {
            // The newest id is read from the epochs, which every instance's ids come from: an id
            // a client was sent is never above it. (A change committed but not yet numbered has
            // no id yet, so nothing can name it.)
            since if since > top.top => {
                return Ok(Opened::Future {
                    newest: ChangeId::from_stored(top.top),
                });
            }
            0 => top.pruned_through,
            since if since < top.pruned_through => {
                return Ok(Opened::Compacted {
                    horizon: ChangeId::from_stored(top.pruned_through),
                });
            }
            since => since,
        };
        Ok(self.opened(prefix, live, from))
    }

    /// The watch of `prefix` after id `from`, following `live`.
    fn opened(
        &self,
        prefix: &KeyPrefix,
        live: broadcast::Receiver<Arc<ChangeEvent>>,
        from: i64,
    ) -> Opened {
        Opened::Watching(Watch {
            inner: self.inner.clone(),
            live,
            stopping: self.inner.stopping.subscribe(),
            prefix: prefix.as_str().to_owned(),
            last: from,
            caught_up: false,
            backlog: VecDeque::new(),
        })
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
                if self.last >= self.inner.handed.load(Ordering::Acquire) {
                    self.caught_up = true;
                    continue;
                }
                let epochs = tokio::select! {
                    read = self.inner.history.catch_up(self.last) => match read {
                        Ok(epochs) => epochs,
                        Err(e) => return Some(Err(e)),
                    },
                    _ = self.stopping.changed() => return None,
                };
                if epochs.is_empty() {
                    // Read to the newest epoch, but this instance's reader has not begun to
                    // hand on changes: it is starting, and soon will.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                for epoch in epochs {
                    let after = self.last;
                    self.backlog.extend(
                        epoch
                            .changes
                            .iter()
                            .filter(|c| {
                                c.id.get() > after && c.data.key.as_str().starts_with(&self.prefix)
                            })
                            .cloned(),
                    );
                    self.last = self.last.max(epoch.last_id);
                }
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

/// How long a watch without `since` waits for the relay to number the changes committed before
/// it opened. Past it (no relay: one died and the role has not passed yet), it starts after the
/// newest id given, and may deliver some of them.
const OPENING_WAIT: Duration = Duration::from_secs(1);
/// How often it looks for the relay's epoch meanwhile (the relay turns every 10 to 50 ms).
const OPENING_POLL: Duration = Duration::from_millis(5);

/// Where a watch without `since` starts (`sql/opening.sql`): after every change committed before
/// it opened, as etcd's watch starts at the store's revision. The newest id given is not
/// enough: a change answered to its client may not have its id yet (the relay numbers it within
/// a turn), and would be delivered.
#[derive(FromRow)]
struct Opening {
    snap: String,
    top: i64,
    pending: bool,
}

impl Opening {
    async fn read(pool: &PgPool) -> Result<Self> {
        sqlx::query_as(include_str!("sql/opening.sql"))
            .fetch_one(pool)
            .bounded(pool)
            .await
    }

    /// The id to start after: the newest given when the opening snapshot saw no change without
    /// an id, else the last of the first epoch that holds them all (`sql/covering.sql`). That
    /// epoch may also hold changes committed while the watch was opening, before its answer:
    /// they are left out with it, as concurrent with the opening.
    async fn start(self, pool: &PgPool) -> Result<i64> {
        if !self.pending {
            return Ok(self.top);
        }
        let until = Instant::now() + OPENING_WAIT;
        loop {
            let covering: Option<i64> = sqlx::query_scalar(include_str!("sql/covering.sql"))
                .bind(&self.snap)
                .bind(self.top)
                .fetch_one(pool)
                .bounded(pool)
                .await?;
            if let Some(id) = covering {
                return Ok(id);
            }
            if Instant::now() >= until {
                tracing::warn!(
                    "no relay numbered the changes committed before a watch opened within {OPENING_WAIT:?}: it starts after the newest id and may deliver some of them"
                );
                return Ok(self.top);
            }
            tokio::time::sleep(OPENING_POLL).await;
        }
    }
}
