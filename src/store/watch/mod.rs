//! Watch (contract v1.1): the changing statements write `change_log` rows in their own transaction;
//! one instance, the relay (`relay.rs`), numbers them in epochs; every instance reads each epoch
//! once (`reader.rs`) and hands it to its watchers, which catch up from the tables first
//! (`history.rs`): each change after the start once, in id order.

mod history;
mod reader;
mod relay;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{FromRow, PgPool};
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;

use super::{Bounded, Engine, Result, Tasks};
use crate::domain::{ChangeEvent, ChangeId, KeyPrefix};
use history::{Epoch, History};

const CHANNEL: &str = "snapfence_changes";
const READ_EVERY: Duration = Duration::from_secs(1);
const LIVE_BUFFER: usize = 4096;

/// The relay's statements over a set of leases, for the test that their generic plans read by key.
#[doc(hidden)]
pub fn relay_statements() -> [(&'static str, &'static str); 2] {
    [("expire", relay::EXPIRE), ("pending", relay::PENDING)]
}

/// The relay's turn, for the test that a connection plans it once.
#[doc(hidden)]
pub fn relay_turn() -> &'static str {
    relay::TURN
}

/// The history and this instance's watchers. Cheap to clone; its tasks stop with the last clone.
#[derive(Debug, Clone)]
pub struct Changes {
    inner: Arc<Inner>,
    _tasks: Arc<Tasks>,
}

struct Inner {
    pool: PgPool,
    /// The instance's id, the relay role's holder name: a dead holder's role is taken at once.
    instance: Arc<AtomicI32>,
    retention: Duration,
    live: broadcast::Sender<Arc<ChangeEvent>>,
    fresh: Notify,
    stopping: watch::Sender<bool>,
    history: History,
    /// The newest epoch's last id the reader has begun to hand on: a subscriber that read up to it
    /// has caught up.
    handed: AtomicI64,
    relayed: Mutex<VecDeque<Arc<Epoch>>>,
    turning: AtomicBool,
    told: AtomicI64,
    missed: AtomicBool,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("instance", &self.instance.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Changes an instance's watches are behind, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLag {
    /// Numbered by the relay (as its notification said) but not yet read and handed on here.
    pub read: u64,
    /// Handed on, but not yet taken from the live buffer by the slowest live stream.
    pub stream: u64,
}

/// Where a watch starts.
#[derive(Debug)]
pub enum Opened {
    /// Every change after the starting id.
    Watching(Watch),
    /// The starting id is older than the retained history.
    Compacted {
        /// The highest id pruned.
        horizon: ChangeId,
    },
    /// The starting id names no change yet; a watch from it would skip changes unseen.
    Future {
        /// The newest id given.
        newest: ChangeId,
    },
}

impl Changes {
    /// Starts the relay (taking the role if free) and the reader; needs a Tokio runtime.
    pub fn start(db: &impl AsRef<Engine>, retention: Duration) -> Self {
        let db: &Engine = db.as_ref();
        let inner = Arc::new(Inner {
            pool: (**db).clone(),
            instance: db.hub().instance(),
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
        db.hub()
            .subscribe(Arc::new(reader::Told(Arc::downgrade(&inner))));
        let tasks = vec![
            tokio::spawn(relay::relay(Arc::downgrade(&inner))),
            tokio::spawn(reader::fan_out(Arc::downgrade(&inner))),
        ];
        Self {
            inner,
            _tasks: Arc::new(Tasks(tasks)),
        }
    }

    /// Ends every watch, now and from now on: for shutdown.
    pub fn stop(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// How many watches this instance serves, for the metrics.
    pub fn watching(&self) -> usize {
        self.inner.live.receiver_count()
    }

    /// How far this instance's watches are behind the changes numbered so far.
    pub fn lag(&self) -> WatchLag {
        let handed = self.inner.handed.load(Ordering::Acquire);
        let told = self.inner.told.load(Ordering::Acquire);
        WatchLag {
            // Before the first read `handed` is unset (`i64::MAX`): nothing is behind yet.
            read: u64::try_from(told.saturating_sub(handed)).unwrap_or(0),
            stream: self.inner.live.len() as u64,
        }
    }

    /// A watch of `prefix` after `since` (or from now); `since` 0 is the oldest kept.
    pub async fn watch(&self, prefix: &KeyPrefix, since: Option<ChangeId>) -> Result<Opened> {
        // Subscribe before reading: a change the read misses committed after it and comes live.
        let live = self.inner.live.subscribe();
        let pool = &self.inner.pool;
        let Some(since) = since else {
            let from = Opening::read(pool).await?.start(pool).await?;
            return Ok(self.opened(prefix, live, from));
        };
        let top = Top::read(pool).await?;
        let from = match since.get() {
            // Every id a client was sent comes from an epoch, so none is above the newest epoch's.
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

/// One watcher's changes: each change of its keys after its starting id, once, in id order.
pub struct Watch {
    inner: Arc<Inner>,
    live: broadcast::Receiver<Arc<ChangeEvent>>,
    stopping: watch::Receiver<bool>,
    prefix: String,
    last: i64,
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
    /// Where a client that resumes now would resume.
    pub fn position(&self) -> ChangeId {
        ChangeId::from_stored(self.last)
    }

    /// The next change; `None` at shutdown, `Err` when the database cannot be read.
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
                    // The reader is starting and will hand on soon.
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
                    Err(broadcast::error::RecvError::Lagged(_)) => self.caught_up = false,
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
                _ = self.stopping.changed() => return None,
            }
        }
    }
}

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

/// How long a watch without `since` waits for the relay to number earlier changes.
const OPENING_WAIT: Duration = Duration::from_secs(1);
const OPENING_POLL: Duration = Duration::from_millis(5);

/// Where a watch without `since` starts: after every change committed before it opened, like etcd's
/// revision. The newest id is not enough, since an answered change may not be numbered yet.
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

    /// The id to start after: the newest given, or the last of the first epoch holding every
    /// unnumbered change seen.
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
