//! The reader: every instance hears of each new epoch on [`CHANNEL`] (`listen`) and hands its
//! changes to its watchers (`fan_out`), from its own relay's turns as they were made, or read from
//! the database when another instance relays, a turn's outcome was lost, or a notification may
//! have been missed.

use std::sync::Weak;
use std::sync::atomic::Ordering;

use sqlx::postgres::PgListener;
use tokio::time::Instant;

use super::history::Epoch;
use super::{CHANNEL, Inner, READ_EVERY, RELISTEN_AFTER, Top};
use crate::store::{StoreError, listening_pool};

/// Listens on [`CHANNEL`] on a connection of its own and wakes the reader at each notification
/// (noting the epoch's last id it names), and once each time it listens again, telling it to
/// read (a notification may have come while it did not).
pub(super) async fn listen(inner: Weak<Inner>) {
    let Some(own) = inner.upgrade().map(|i| listening_pool(&i.pool)) else {
        return;
    };
    loop {
        let failure = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(CHANNEL).await?;
            let mut told: Option<i64> = None;
            loop {
                match inner.upgrade() {
                    Some(i) => {
                        if let Some(id) = told {
                            i.told.fetch_max(id, Ordering::AcqRel);
                        } else {
                            i.missed.store(true, Ordering::Release);
                        }
                        i.fresh.notify_one();
                    }
                    None => return Ok(()),
                }
                // `None`: the connection was lost, and notifications with it.
                match listener.try_recv().await? {
                    // A payload that is not an id (none is sent) makes the reader read.
                    Some(note) => told = note.payload().parse().ok(),
                    None => return Ok::<(), sqlx::Error>(()),
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

/// Hands on the new changes, in id order, when woken: the epochs this instance's relay made, as
/// it made them, and others read from the database when a notification names an epoch the
/// reader does not have (another instance relays, or a turn's outcome was lost), when one may
/// have been missed, and at least every [`READ_EVERY`].
pub(super) async fn fan_out(inner: Weak<Inner>) {
    let mut last: Option<i64> = None;
    let mut read_at: Option<Instant> = None;
    loop {
        let Some(i) = inner.upgrade() else {
            return;
        };
        let read_all = async {
            let mut after = match last {
                Some(after) => after,
                None => {
                    // Nothing up to the newest id is handed on: watchers read it themselves.
                    let top = Top::read(&i.pool).await?.top;
                    i.handed.store(top, Ordering::Release);
                    top
                }
            };
            let (relayed, gap) = i.hand_on_relayed(after);
            after = relayed;
            last = Some(after);
            let read = read_at.is_none_or(|t| t.elapsed() >= READ_EVERY)
                || gap
                || i.missed.swap(false, Ordering::AcqRel)
                || (i.told.load(Ordering::Acquire) > after && !i.turning.load(Ordering::Acquire));
            if !read {
                return Ok(());
            }
            read_at = Some(Instant::now());
            loop {
                let read = i.history.read(after).await?;
                for epoch in read.epochs {
                    after = i.hand_on(&epoch, after);
                    last = Some(after);
                }
                if read.complete {
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

impl Inner {
    /// Hands `epoch`'s changes after `after` to this instance's watchers; its last id.
    fn hand_on(&self, epoch: &Epoch, after: i64) -> i64 {
        self.handed.store(epoch.last_id, Ordering::Release);
        for change in epoch.changes.iter().filter(|c| c.id.get() > after) {
            // No watcher: nothing to hand on.
            let _ = self.live.send(change.clone());
        }
        epoch.last_id
    }

    /// Hands on the epochs this instance's relay made that follow `after`; the last id handed
    /// on, and whether an epoch is missing before one of them (read from the database).
    fn hand_on_relayed(&self, mut after: i64) -> (i64, bool) {
        let relayed: Vec<_> = self
            .relayed
            .lock()
            .expect("never poisoned")
            .drain(..)
            .collect();
        for epoch in &relayed {
            if epoch.last_id <= after {
                continue;
            }
            if epoch.first_id != after + 1 {
                return (after, true);
            }
            after = self.hand_on(epoch, after);
        }
        (after, false)
    }
}
