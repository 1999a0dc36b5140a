//! The reader: hears of each epoch on [`CHANNEL`] and hands its changes to the watchers, from its
//! own relay's turns or from the database.

use std::sync::Weak;
use std::sync::atomic::Ordering;

use sqlx::postgres::PgListener;
use tokio::time::Instant;

use super::history::Epoch;
use super::{CHANNEL, Inner, READ_EVERY, RELISTEN_AFTER, Top};
use crate::store::{StoreError, listening_pool};

/// Listens on [`CHANNEL`] and wakes the reader at each notification and reconnect.
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
                match listener.try_recv().await? {
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

/// Hands on new changes in id order when woken.
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
                    // Watchers read everything up to the newest id themselves.
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
        let _ = tokio::time::timeout(READ_EVERY, i.fresh.notified()).await;
    }
}

impl Inner {
    fn hand_on(&self, epoch: &Epoch, after: i64) -> i64 {
        self.handed.store(epoch.last_id, Ordering::Release);
        for change in epoch.changes.iter().filter(|c| c.id.get() > after) {
            let _ = self.live.send(change.clone());
        }
        epoch.last_id
    }

    /// Hands on this relay's epochs after `after`; the last id, and whether one is missing before
    /// them.
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
