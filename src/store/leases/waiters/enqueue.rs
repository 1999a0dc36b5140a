//! Taking places in the keys' queues, a batch of arrivals as one statement, in arrival order.

use crate::domain::Key;
use crate::store::Bounded;
use crate::store::engine::batch::{Indexed, Job, Kind, column};
use crate::store::engine::conns::{Conns, Effect};
use crate::store::engine::statement::QueryAs;

#[derive(Debug)]
pub(super) struct Enqueue {
    pub key: Key,
    pub instance: i32,
    /// The request's principal ('' without authentication) and Idempotency-Key, if it sent one.
    pub principal: String,
    pub idem: Option<String>,
    /// Who asks, as the key's queue shows it.
    pub owner: String,
}

impl Job for Enqueue {
    fn key(&self) -> &Key {
        &self.key
    }
}

pub(crate) const ENQUEUE: &str = include_str!("../sql/wait_enqueue.sql");

#[derive(Debug, sqlx::FromRow)]
pub(super) struct Queued {
    pub id: Option<i64>,
}

/// One row per place, so places of one key share a batch.
#[derive(Debug)]
pub(super) struct EnqueueBatch;

impl Kind for EnqueueBatch {
    const NAME: &'static str = "wait_enqueue";
    type Job = Enqueue;
    type Row = Queued;
    const EFFECT: Effect = Effect::Changes;

    fn order(_job: &Enqueue) -> &str {
        ""
    }

    /// A place taken for a request that went away meanwhile leaves the queue at once, so no key
    /// waits for a waiter no one is behind.
    fn unanswered(conns: &Conns, row: Queued) {
        let Some(id) = row.id else {
            return;
        };
        let pool = conns.pool().clone();
        tokio::spawn(async move {
            let left = sqlx::query(super::LEAVE)
                .bind(vec![id])
                .execute(&pool)
                .bounded(&pool)
                .await;
            if let Err(e) = left {
                tracing::warn!(error = %e, waiter = id, "could not take out the place of a waiter that went away; the sweep will");
            }
        });
    }

    fn query<'q>(jobs: &[&'q Enqueue]) -> QueryAs<'q, Indexed<Queued>> {
        sqlx::query_as(ENQUEUE)
            .bind(column(jobs, |j| j.key.as_str()))
            .bind(jobs.first().map_or(0, |j| j.instance))
            .bind(column(jobs, |j| j.principal.as_str()))
            .bind(column(jobs, |j| j.idem.as_deref()))
            .bind(column(jobs, |j| j.owner.as_str()))
    }
}
