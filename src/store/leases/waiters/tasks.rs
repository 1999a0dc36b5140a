//! The queue's following of the database: its subscription (saying the instance is alive), and
//! the sweep.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt};
use sqlx::postgres::PgListener;

use super::{CHANNEL, Inner, SWEEP_EVERY};

const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);
use crate::store::engine::listen::Subscriber;
use crate::store::{Bounded, Result};

/// The queue's subscription to [`CHANNEL`]: once the connection listens it takes the instance's
/// liveness lock on it and wakes every first waiter; each notification wakes its key's first.
pub(super) struct Wakeups(pub(super) Weak<Inner>);

impl Subscriber for Wakeups {
    fn channel(&self) -> &'static str {
        CHANNEL
    }

    fn gone(&self) -> bool {
        self.0.strong_count() == 0
    }

    fn listening<'a>(&'a self, conn: &'a mut PgListener) -> BoxFuture<'a, sqlx::Result<()>> {
        async move {
            // A first heartbeat, so an instance frozen early is not judged by its lock alone.
            self.tick(conn).await?;
            if let Some(i) = self.0.upgrade() {
                i.listening.send_replace(true);
                i.wake_all();
            }
            Ok(())
        }
        .boxed()
    }

    fn heard<'a>(
        &'a self,
        payload: &'a str,
        _: &'a mut PgListener,
    ) -> BoxFuture<'a, sqlx::Result<()>> {
        if let Some(i) = self.0.upgrade() {
            i.wake(payload);
        }
        async { Ok(()) }.boxed()
    }

    /// Says the instance is alive four times per stall bound, on the listening connection, so a
    /// busy pool never makes a live instance look frozen.
    fn every(&self) -> Option<Duration> {
        let bound = self.0.upgrade()?.stall_bound;
        Some(HEARTBEAT_EVERY.min(bound / 4))
    }

    fn tick<'a>(&'a self, conn: &'a mut PgListener) -> BoxFuture<'a, sqlx::Result<()>> {
        async move {
            let Some(i) = self.0.upgrade() else {
                return Ok(());
            };
            let instance = i.instance.load(Ordering::Relaxed);
            let bound = i64::try_from(i.stall_bound.as_millis()).unwrap_or(i64::MAX);
            drop(i);
            sqlx::query(include_str!("../sql/wait_heartbeat.sql"))
                .bind(instance)
                .bind(bound)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }
        .boxed()
    }

    fn lost(&self, error: Option<&sqlx::Error>) {
        if let Some(i) = self.0.upgrade() {
            i.listening.send_replace(false);
        }
        if let Some(e) = error {
            tracing::warn!(error = %e, "cannot hear waiters' wake-ups; taking no waiters until this recovers");
        }
    }
}

/// Twice a second, whether or not this instance has waiters, deletes rows no one waits in.
pub(super) async fn sweep(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(i) = inner.upgrade() else {
            return;
        };
        let held = i.held();
        let swept: Result<Vec<i64>> = sqlx::query_scalar(include_str!("../sql/wait_sweep.sql"))
            .bind(i.instance.load(Ordering::Relaxed))
            .bind(&held)
            .fetch_all(&i.pool)
            .bounded(&i.pool)
            .await;
        match swept {
            Ok(gone) => i.passed_over(gone),
            Err(e) => tracing::debug!(error = %e, "could not sweep the waiters' queues"),
        }
    }
}
