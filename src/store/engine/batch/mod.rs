//! Group commit: hot calls of one kind that arrive together go as one statement over arrays, each
//! answered by its own row once committed; sixteen rows cost about two single statements. A batch
//! goes at once when none of its kind is in flight, else gathers until that one ends or stalls. It
//! never holds two requests for one key or Idempotency-Key, and sends rows in key order, the order
//! every statement locks in, so batches never wait in a cycle.

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
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
/// The most bytes of bodies in one batch; a larger body goes alone (or is uploaded).
pub const MAX_BYTES: usize = 1024 * 1024;
/// The batches of one kind in flight at once, each on its own connection (unless started with
/// fewer).
pub const IN_FLIGHT: usize = 4;
/// The least a batch in flight may take before the next goes beside it (see [`STALL_FACTOR`]):
/// below it batches grow with the load; past it a slow statement holds no one up.
pub const STALLED: std::time::Duration = std::time::Duration::from_millis(1);
/// How many typical batches' time makes a batch in flight stalled.
pub const STALL_FACTOR: u32 = 2;

pub(crate) trait Job {
    fn key(&self) -> &Key;
    /// What no other request of its batch may share (a change's key and Idempotency-Key).
    fn claims(&self) -> Vec<String> {
        Vec::new()
    }
}

pub(crate) trait Kind: Send + Sync + 'static {
    /// Its name in the metrics.
    const NAME: &'static str;
    type Job: Job + Send + Sync + 'static;
    type Row: Send + Unpin + for<'r> FromRow<'r, PgRow> + 'static;
    const EFFECT: Effect;
    /// The most requests in one of its batches; a full batch goes beside the one in flight.
    const MAX_JOBS: usize = MAX_REQUESTS;
    fn order(job: &Self::Job) -> &str {
        job.key().as_str()
    }
    fn bytes(_job: &Self::Job) -> usize {
        0
    }
    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>>;
    /// A committed answer whose request went away first (its client hung up): most kinds leave it;
    /// one whose row holds a place for the request takes it back.
    fn unanswered(_conns: &Conns, _row: Self::Row) {}
    /// Runs a batch by `deadline`: most kinds as their one statement, which commits as it answers.
    fn run<'a>(
        conns: &'a Conns,
        deadline: Instant,
        jobs: &'a [&'a Self::Job],
    ) -> impl Future<Output = Result<Vec<Indexed<Self::Row>>>> + Send + 'a {
        conns.fetch_batch(Self::EFFECT, deadline, move || Self::query(jobs))
    }
}

#[derive(Debug)]
pub(crate) struct Indexed<R> {
    i: i64,
    pub(crate) row: R,
}

impl<R> Indexed<R> {
    /// The answer of the batch's request at `position` (from 1).
    pub(crate) fn new(position: i64, row: R) -> Self {
        Self { i: position, row }
    }

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

pub(super) const WAITING: u8 = 0;
pub(super) const SENT: u8 = 1;
pub(super) const GIVEN_UP: u8 = 2;

struct Pending<K: Kind> {
    pub(super) job: K::Job,
    pub(super) deadline: Instant,
    pub(super) state: Arc<AtomicU8>,
    pub(super) sent_until: Arc<OnceLock<Instant>>,
    pub(super) reply: oneshot::Sender<Result<Option<K::Row>>>,
    pub(super) queued: Arc<AtomicUsize>,
    /// The request's span, when spans are exported.
    pub(super) origin: Option<tracing::Span>,
}

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
    pub(super) fn leave(&self, to: u8) -> bool {
        let to = if self.reply.is_closed() { GIVEN_UP } else { to };
        leave(&self.state, &self.queued, to) && to == SENT
    }
}

/// The batches of one kind sent so far and the requests they carried (their ratio is the mean
/// batch size), for the metrics.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    batches: AtomicU64,
    requests: AtomicU64,
}

impl Counts {
    pub(super) fn sent(&self, requests: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(requests as u64, Ordering::Relaxed);
    }

    /// Batches sent, and the requests they carried.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
        (load(&self.batches), load(&self.requests))
    }
}

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
    pub(crate) fn start(conns: Conns) -> Self {
        Self::start_with(conns, IN_FLIGHT)
    }

    /// A batcher with at most `in_flight` batches running at once.
    pub(crate) fn start_with(conns: Conns, in_flight: usize) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        let counts = conns.batch_counts(K::NAME);
        tokio::spawn(dispatch::dispatch::<K>(
            conns.clone(),
            requests,
            in_flight,
            counts,
        ));
        Self {
            queue,
            conns,
            queued: Arc::default(),
        }
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    pub(crate) async fn answer(&self, job: K::Job) -> Result<K::Row> {
        self.submit(job).await?.ok_or_else(|| {
            StoreError::Internal(sqlx::Error::Protocol(
                "a batched statement answered no row for a request".into(),
            ))
        })
    }

    pub(crate) async fn submit(&self, job: K::Job) -> Result<Option<K::Row>> {
        let deadline = self.conns.deadline();
        let state = Arc::new(AtomicU8::new(WAITING));
        let sent_until = Arc::new(OnceLock::new());
        let (reply, answer) = oneshot::channel();
        let mut answer = Unclaimed::<K> {
            answer,
            conns: &self.conns,
        };
        let pending = Pending {
            job,
            deadline,
            state: state.clone(),
            sent_until: sent_until.clone(),
            reply,
            queued: self.queued.clone(),
            origin: super::trace::origin(),
        };
        self.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(unsent) = self.queue.send(pending) {
            leave(&state, &self.queued, GIVEN_UP);
            drop(unsent);
            return Err(StoreError::Unavailable(sqlx::Error::PoolClosed));
        }
        let answered = match tokio::time::timeout_at(deadline, &mut answer.answer).await {
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
                // The batch shares this deadline, so it ends with the statement's answer if that
                // came in time.
                (&mut answer.answer).await
            }
        };
        answered.unwrap_or(Err(StoreError::Internal(sqlx::Error::WorkerCrashed)))
    }
}

/// A request's answer to come; one that came but was never read goes to [`Kind::unanswered`].
struct Unclaimed<'a, K: Kind> {
    answer: oneshot::Receiver<Result<Option<K::Row>>>,
    conns: &'a Conns,
}

impl<K: Kind> Drop for Unclaimed<'_, K> {
    fn drop(&mut self) {
        if let Ok(Ok(Some(row))) = self.answer.try_recv() {
            K::unanswered(self.conns, row);
        }
    }
}

pub(crate) fn column<'q, J, T>(jobs: &[&'q J], f: impl Fn(&'q J) -> T) -> Vec<T> {
    jobs.iter().map(|&j| f(j)).collect()
}
