//! Group commit: the hot calls of one kind (acquires, renewals, endings, fenced writes, checks
//! before a body, reads) that arrive together on an instance are sent as one statement over
//! arrays, in one transaction, and each is answered only once that statement has committed,
//! with its own row of the answer.
//!
//! Why: a request's own statement costs PostgreSQL a round trip, an executor start-up and a
//! commit, most of its work for a one-row change; sixteen rows in one statement cost about as
//! much as two or three single ones (`../shared/PERF.md`, and `bench/README.md` here).
//!
//! How a batch forms: a dispatcher task per kind takes requests in arrival order into an open
//! batch, and sends it at once when no batch of its kind is in flight. With one client none ever
//! is, so a request is never held back. Under load the requests that arrive while a batch is in
//! flight gather, up to [`MAX_REQUESTS`] (or [`MAX_BYTES`] of bodies), and go when it ends, when
//! they fill the batch, or when it has stalled (run for twice its kind's typical batch, at least
//! [`STALLED`]); then on one of [`IN_FLIGHT`] slots. So a request waits at most for one short
//! statement of its kind (or until that one stalls), and a batch is as large as the load makes
//! it. A batch never holds two requests for one key or one Idempotency-Key: the second waits
//! for the next batch, in its order, so every request in a batch is decided on its own (the SQL
//! files say why that is race-free) and a refusal of one changes nothing for another. Each
//! batch's rows are sent in key order, the order every batched statement locks its rows in, so
//! that two batches never wait on each other in a cycle.
//!
//! Failures: a batch the database rolled back whole for a reason that a second run does not
//! meet (another statement's record for an Idempotency-Key, a deadlock, a serialization failure)
//! is run again within its deadline; any other failure answers every request of the batch for
//! itself, `unavailable` when nothing was sent and `indeterminate` when a change was sent and its
//! answer was lost. A request whose own deadline passes first answers 503 by itself: certain if
//! its batch had not been sent yet (it is then left out of it), uncertain if the batch may run
//! on past it. A batch bounded by that deadline too ends with it, and its answer is taken: the
//! statement's, when it came in time (a process frozen past the deadline thaws with both).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::conns::{Conns, Effect};
use super::statement::QueryAs;
use super::{Result, StoreError};
use crate::domain::Key;

mod dispatch;

/// The most requests in one batch.
pub const MAX_REQUESTS: usize = 32;
/// The most bytes of bodies in one batch: a larger body goes in a batch of its own (or, from
/// `snapshots::UPLOAD_FROM`, is uploaded on its own connection).
pub const MAX_BYTES: usize = 1024 * 1024;
/// The batches of one kind in flight at once, each on a connection of its own.
pub const IN_FLIGHT: usize = 4;
/// The least a batch in flight may take before the next one goes beside it rather than after
/// it; the bound itself is [`STALL_FACTOR`] times the kind's typical batch (`dispatch::Pace`).
/// Below it a kind's batches go one at a time, each as large as the requests that arrived while
/// the one before it ran (so the database runs fewer, larger statements); past it a slow
/// statement, or one waiting on a row lock, holds up no one else. Tokio's timer counts in
/// milliseconds, so this is the shortest bound there is without spinning.
pub const STALLED: std::time::Duration = std::time::Duration::from_millis(1);
/// How many typical batches' time a batch in flight may take before it counts as stalled.
pub const STALL_FACTOR: u32 = 2;

/// One request of a batch, as the batch sees it.
pub(crate) trait Job {
    /// The key the request is for.
    fn key(&self) -> &Key;
    /// What no other request of its batch may share (opaque to the batch): for a change, its
    /// key, whose row its statement locks, and its Idempotency-Key. A read claims nothing.
    fn claims(&self) -> Vec<String> {
        Vec::new()
    }
}

/// One kind of batched statement: its requests, its rows, and how a batch is bound.
pub(crate) trait Kind: Send + Sync + 'static {
    /// One request.
    type Job: Job + Send + Sync + 'static;
    /// One row of the statement's answer, for the request at its position.
    type Row: Send + Unpin + for<'r> FromRow<'r, PgRow> + 'static;
    /// Whether the statement changes something (which decides what a lost answer means).
    const EFFECT: Effect;
    /// The order a batch's requests are sent in: their keys, the order rows are locked in.
    fn order(job: &Self::Job) -> &str {
        job.key().as_str()
    }
    /// The bytes of bodies the request carries.
    fn bytes(_job: &Self::Job) -> usize {
        0
    }
    /// The statement over `jobs`, the request at index `n` bound at position `n + 1`.
    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>>;
}

/// A row of a batched statement's answer with the position (`i`, from 1) of its request.
#[derive(Debug)]
pub(crate) struct Indexed<R> {
    i: i64,
    pub(crate) row: R,
}

impl<R> Indexed<R> {
    /// The request's position in its statement, from 1.
    pub(crate) fn position(&self) -> i64 {
        self.i
    }
}

impl<'r, R: FromRow<'r, PgRow>> FromRow<'r, PgRow> for Indexed<R> {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            i: row.try_get("i")?,
            row: R::from_row(row)?,
        })
    }
}

/// A request waiting in a batch: not sent yet, sent, or given up by its caller.
pub(super) const WAITING: u8 = 0;
pub(super) const SENT: u8 = 1;
pub(super) const GIVEN_UP: u8 = 2;

/// A request of kind `K` on its way: the job, when its caller must have an answer, and where the
/// answer goes (`None`: the statement had no row for it).
struct Pending<K: Kind> {
    pub(super) job: K::Job,
    pub(super) deadline: Instant,
    pub(super) state: Arc<AtomicU8>,
    /// The deadline of the batch it is sent in (the latest of its requests'), set before that
    /// batch is sent.
    pub(super) sent_until: Arc<OnceLock<Instant>>,
    pub(super) reply: oneshot::Sender<Result<Option<K::Row>>>,
    /// The requests of this kind not sent yet, this one among them until it leaves.
    pub(super) queued: Arc<AtomicUsize>,
}

/// Moves a request out of [`WAITING`] (to [`SENT`] or [`GIVEN_UP`]) unless it left already, and
/// counts it out of the queue; whether it moved.
pub(super) fn leave(state: &AtomicU8, queued: &AtomicUsize, to: u8) -> bool {
    let left = state
        .compare_exchange(WAITING, to, Ordering::AcqRel, Ordering::Acquire)
        .is_ok();
    if left {
        queued.fetch_sub(1, Ordering::Relaxed);
    }
    left
}

impl<K: Kind> Pending<K> {
    /// Moves this request to `to` ([`leave`]); a request whose caller is gone gives up.
    pub(super) fn leave(&self, to: u8) -> bool {
        let to = if self.reply.is_closed() { GIVEN_UP } else { to };
        leave(&self.state, &self.queued, to) && to == SENT
    }
}

/// The queue of one kind's dispatcher.
pub(crate) struct Batcher<K: Kind> {
    queue: mpsc::UnboundedSender<Pending<K>>,
    conns: Conns,
    queued: Arc<AtomicUsize>,
}

impl<K: Kind> std::fmt::Debug for Batcher<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl<K: Kind> Batcher<K> {
    /// Starts the dispatcher of kind `K` on `conns`; it ends when the batcher is dropped. Must be
    /// called within a Tokio runtime.
    pub(crate) fn start(conns: Conns) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        tokio::spawn(dispatch::dispatch::<K>(conns.clone(), requests));
        Self {
            queue,
            conns,
            queued: Arc::default(),
        }
    }

    /// How many requests wait in this kind's batches to be sent, for the metrics.
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// [`submit`](Self::submit) for a change, whose statement answers a row for every request:
    /// none is a bug of ours, said loudly.
    pub(crate) async fn answer(&self, job: K::Job) -> Result<K::Row> {
        self.submit(job).await?.ok_or_else(|| {
            StoreError::Internal(sqlx::Error::Protocol(
                "a batched statement answered no row for a request".into(),
            ))
        })
    }

    /// Sends `job` in the next batch of its kind and waits for its row, by the request's deadline.
    pub(crate) async fn submit(&self, job: K::Job) -> Result<Option<K::Row>> {
        let deadline = self.conns.deadline();
        let state = Arc::new(AtomicU8::new(WAITING));
        let sent_until = Arc::new(OnceLock::new());
        let (reply, mut answer) = oneshot::channel();
        let pending = Pending {
            job,
            deadline,
            state: state.clone(),
            sent_until: sent_until.clone(),
            reply,
            queued: self.queued.clone(),
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(unsent) = self.queue.send(pending) {
            leave(&state, &self.queued, GIVEN_UP);
            drop(unsent);
            return Err(StoreError::Unavailable(sqlx::Error::PoolClosed));
        }
        let answered = match tokio::time::timeout_at(deadline, &mut answer).await {
            Ok(answered) => answered,
            Err(_) => {
                let unsent = leave(&state, &self.queued, GIVEN_UP);
                let bounded_here = sent_until.get().is_some_and(|&until| until <= deadline);
                if unsent || !bounded_here {
                    let e = self.conns.timed_out();
                    return Err(if unsent || K::EFFECT == Effect::Reads {
                        e
                    } else {
                        e.after_sending()
                    });
                }
                // The batch is bounded by this deadline too, so it ends with it (and its last
                // look, `super::timeout_at`): with the statement's answer if that came in time,
                // else with the same 503. When this process was not running as the deadline
                // passed (frozen by SIGSTOP), both fire together, and answering here first would
                // call `indeterminate` an answer that is there to be read.
                answer.await
            }
        };
        answered.unwrap_or(Err(StoreError::Internal(sqlx::Error::WorkerCrashed)))
    }
}

/// One column of a batch's arrays: `f` of each request, in the batch's order.
pub(crate) fn column<'q, J, T>(jobs: &[&'q J], f: impl Fn(&'q J) -> T) -> Vec<T> {
    jobs.iter().map(|&j| f(j)).collect()
}
