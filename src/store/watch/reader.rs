//! The reader: hears of each epoch on [`CHANNEL`] and hands its changes to the watchers, from its
//! own relay's turns or from the database.

use std::sync::Weak;
use std::sync::atomic::Ordering;

use futures_util::future::{BoxFuture, FutureExt};
use sqlx::postgres::PgListener;
use tokio::time::Instant;

use super::history::Epoch;
use super::{CHANNEL, Inner, READ_EVERY, Top};
use crate::store::StoreError;
use crate::store::engine::listen::Subscriber;

/// The reader's subscription to [`CHANNEL`]: each notification, and each time the connection
/// listens again, wakes it.
pub(super) struct Told(pub(super) Weak<Inner>);

impl Told {
    fn wake(&self, told: Option<i64>) {
        if let Some(i) = self.0.upgrade() {
            match told {
                Some(id) => {
                    i.told.fetch_max(id, Ordering::AcqRel);
                }
                None => i.missed.store(true, Ordering::Release),
            }
            i.fresh.notify_one();
        }
    }
}

impl Subscriber for Told {
    fn channel(&self) -> &'static str {
        CHANNEL
    }

    fn gone(&self) -> bool {
        self.0.strong_count() == 0
    }

    fn listening<'a>(&'a self, _: &'a mut PgListener) -> BoxFuture<'a, sqlx::Result<()>> {
        self.wake(None);
        async { Ok(()) }.boxed()
    }

    fn heard<'a>(
        &'a self,
        payload: &'a str,
        _: &'a mut PgListener,
    ) -> BoxFuture<'a, sqlx::Result<()>> {
        self.wake(payload.parse().ok());
        async { Ok(()) }.boxed()
    }

    fn lost(&self, error: Option<&sqlx::Error>) {
        if let Some(e) = error {
            tracing::warn!(error = %e, "cannot hear of new changes; watchers get them within a second instead");
        }
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
