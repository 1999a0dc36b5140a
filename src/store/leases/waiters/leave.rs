//! Leaving the queues without an answer: the places of requests that went away, a burst of them
//! (a flood's clients hanging up) as one statement, so they do not take every connection.

use crate::domain::Key;
use crate::store::engine::batch::{Indexed, Job, Kind, column};
use crate::store::engine::conns::Effect;
use crate::store::engine::statement::QueryAs;

pub(crate) const LEAVE: &str = include_str!("../sql/wait_leave.sql");

#[derive(Debug)]
pub(super) struct Leave {
    pub key: Key,
    pub id: i64,
}

impl Job for Leave {
    fn key(&self) -> &Key {
        &self.key
    }
}

/// A place that was still there.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct Left {}

#[derive(Debug)]
pub(super) struct LeaveBatch;

impl Kind for LeaveBatch {
    const NAME: &'static str = "wait_leave";
    type Job = Leave;
    type Row = Left;
    const EFFECT: Effect = Effect::Changes;
    const MAX_JOBS: usize = 256;

    fn query<'q>(jobs: &[&'q Leave]) -> QueryAs<'q, Indexed<Left>> {
        sqlx::query_as(LEAVE).bind(column(jobs, |j| j.id))
    }
}
