//! Taking places in the keys' queues: the waiters that arrive together on an instance, as one
//! statement (`../sql/wait_enqueue.sql`), in arrival order.

use crate::domain::Key;
use crate::store::engine::batch::{Indexed, Job, Kind, column};
use crate::store::engine::conns::Effect;
use crate::store::engine::statement::QueryAs;

/// A waiter taking its place in its key's queue, in a batch of [`EnqueueBatch`].
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

/// A place claims nothing: places of one key share a batch, each a row of its own.
impl Job for Enqueue {
    fn key(&self) -> &Key {
        &self.key
    }
}

/// The statement that queues waiters, one place each (`sql/wait_enqueue.sql`).
pub(crate) const ENQUEUE: &str = include_str!("../sql/wait_enqueue.sql");

/// A waiter's place: its id in `lease_waiters`; none when its Idempotency-Key holds a place
/// already.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Queued {
    pub id: Option<i64>,
}

/// The places taken by waiters that arrive together, as one statement
/// (`sql/wait_enqueue.sql`). Places of one key may share a batch: each is a row of its own, in
/// the batch's order.
#[derive(Debug)]
pub(super) struct EnqueueBatch;

impl Kind for EnqueueBatch {
    type Job = Enqueue;
    type Row = Queued;
    const EFFECT: Effect = Effect::Changes;

    /// Arrival order: the batch's order is the queue's.
    fn order(_job: &Enqueue) -> &str {
        ""
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
