//! The queue's background tasks: listening (holding the liveness lock), the heartbeat, and the
//! sweep.

use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::time::Instant;

use super::{CHANNEL, Inner, SWEEP_EVERY};
use crate::store::{Bounded, Result, listening_pool};

const RELISTEN_AFTER: Duration = Duration::from_millis(250);

pub(super) async fn listen(inner: std::sync::Weak<Inner>) {
    let Some(pool) = inner.upgrade().map(|i| i.pool.clone()) else {
        return;
    };
    let own = listening_pool(&pool);
    loop {
        let failure = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(CHANNEL).await?;
            let Some(i) = inner.upgrade() else {
                return Ok(());
            };
            let mut instance = i.instance.load(Ordering::Relaxed);
            if instance == 0 {
                instance = sqlx::query_scalar(include_str!("../sql/wait_instance_id.sql"))
                    .fetch_one(&mut listener)
                    .await?;
                i.instance.store(instance, Ordering::Relaxed);
            }
            let bound = i64::try_from(i.stall_bound.as_millis()).unwrap_or(i64::MAX);
            drop(i);
            sqlx::query(include_str!("../sql/wait_instance.sql"))
                .bind(instance)
                .execute(&mut listener)
                .await?;
            // A first heartbeat, so an instance frozen early is not judged by its lock alone.
            sqlx::query(include_str!("../sql/wait_heartbeat.sql"))
                .bind(instance)
                .bind(bound)
                .execute(&mut listener)
                .await?;
            match inner.upgrade() {
                Some(i) => {
                    i.listening.send_replace(true);
                    i.wake_all();
                }
                None => return Ok(()),
            }
            while let Some(n) = listener.try_recv().await? {
                match inner.upgrade() {
                    Some(i) => i.wake(n.payload()),
                    None => return Ok(()),
                }
            }
            Ok::<(), sqlx::Error>(())
        }
        .await;
        let Some(i) = inner.upgrade() else {
            return;
        };
        i.listening.send_replace(false);
        if let Err(e) = failure {
            tracing::warn!(error = %e, "cannot hear waiters' wake-ups; taking no waiters until this recovers");
        }
        drop(i);
        tokio::time::sleep(RELISTEN_AFTER).await;
    }
}

const HEARTBEAT_EVERY: Duration = Duration::from_millis(250);

pub(super) async fn heartbeat(inner: std::sync::Weak<Inner>) {
    let every = inner
        .upgrade()
        .map_or(HEARTBEAT_EVERY, |i| HEARTBEAT_EVERY.min(i.stall_bound / 4));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(i) = inner.upgrade() else {
            return;
        };
        let instance = i.instance.load(Ordering::Relaxed);
        if instance == 0 {
            continue;
        }
        let bound = i64::try_from(i.stall_bound.as_millis()).unwrap_or(i64::MAX);
        let said = sqlx::query(include_str!("../sql/wait_heartbeat.sql"))
            .bind(instance)
            .bind(bound)
            .execute(&i.pool)
            .bounded(&i.pool)
            .await;
        if let Err(e) = said {
            tracing::debug!(error = %e, "could not say this instance is alive to the waiters' queues");
        }
    }
}

/// Twice a second while there are waiters, deletes rows no one waits in.
pub(super) async fn sweep(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(i) = inner.upgrade() else {
            return;
        };
        let held = i.held();
        let stale = i
            .stale_until
            .lock()
            .expect("never poisoned")
            .is_some_and(|until| Instant::now() < until);
        if held.is_empty() && !stale {
            continue;
        }
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
