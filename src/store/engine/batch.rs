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

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sqlx::postgres::PgRow;
use sqlx::{FromRow, Row};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use super::conns::{Conns, Effect};
use super::statement::QueryAs;
use super::{Result, StoreError};
use crate::domain::Key;

/// The most requests in one batch.
pub const MAX_REQUESTS: usize = 32;
/// The most bytes of bodies in one batch: a larger body goes in a batch of its own (or, from
/// `snapshots::UPLOAD_FROM`, is uploaded on its own connection).
pub const MAX_BYTES: usize = 1024 * 1024;
/// The batches of one kind in flight at once, each on a connection of its own.
pub const IN_FLIGHT: usize = 4;
/// The least a batch in flight may take before the next one goes beside it rather than after
/// it; the bound itself is [`STALL_FACTOR`] times the kind's typical batch (see [`Pace`]).
/// Below it a kind's batches go one at a time, each as large as the requests that arrived while
/// the one before it ran (so the database runs fewer, larger statements); past it a slow
/// statement, or one waiting on a row lock, holds up no one else. Tokio's timer counts in
/// milliseconds, so this is the shortest bound there is without spinning.
pub const STALLED: std::time::Duration = std::time::Duration::from_millis(1);
/// How many typical batches' time a batch in flight may take before it counts as stalled.
pub const STALL_FACTOR: u32 = 2;

/// How long a kind's batches typically take (an exponentially weighted mean, in microseconds),
/// which sets when one counts as stalled. A fixed bound of a millisecond, below what a batch
/// and its commit take under load, made almost every batch go beside the one before it: four
/// small statements in flight instead of one large one, and a third fewer writes a second
/// (bench/README.md, "Batches that wait for the one before").
#[derive(Debug, Default)]
struct Pace(AtomicU64);

impl Pace {
    /// Counts a batch that took `took`.
    fn record(&self, took: std::time::Duration) {
        // A stalled batch counts as the bound: one lock wait of seconds would otherwise make
        // every batch after it wait that long before going beside the one in flight.
        let took = u64::try_from(took.min(self.stall_bound()).as_micros()).unwrap_or(u64::MAX);
        // Lost updates between two batches ending at once only blur the mean.
        let mean = self.0.load(Ordering::Relaxed);
        let mean = if mean == 0 {
            took
        } else {
            (mean * 7 + took) / 8
        };
        self.0.store(mean, Ordering::Relaxed);
    }

    /// How long a batch in flight may take before the next one goes beside it.
    fn stall_bound(&self) -> std::time::Duration {
        let typical = std::time::Duration::from_micros(self.0.load(Ordering::Relaxed));
        (typical * STALL_FACTOR).max(STALLED)
    }
}

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

impl<'r, R: FromRow<'r, PgRow>> FromRow<'r, PgRow> for Indexed<R> {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            i: row.try_get("i")?,
            row: R::from_row(row)?,
        })
    }
}

/// A request waiting in a batch: not sent yet, sent, or given up by its caller.
const WAITING: u8 = 0;
const SENT: u8 = 1;
const GIVEN_UP: u8 = 2;

/// A request of kind `K` on its way: the job, when its caller must have an answer, and where the
/// answer goes (`None`: the statement had no row for it).
struct Pending<K: Kind> {
    job: K::Job,
    deadline: Instant,
    state: Arc<AtomicU8>,
    /// The deadline of the batch it is sent in (the latest of its requests'), set before that
    /// batch is sent.
    sent_until: Arc<OnceLock<Instant>>,
    reply: oneshot::Sender<Result<Option<K::Row>>>,
    /// The requests of this kind not sent yet, this one among them until it leaves.
    queued: Arc<AtomicUsize>,
}

/// Moves a request out of [`WAITING`] (to [`SENT`] or [`GIVEN_UP`]) unless it left already, and
/// counts it out of the queue; whether it moved.
fn leave(state: &AtomicU8, queued: &AtomicUsize, to: u8) -> bool {
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
    fn leave(&self, to: u8) -> bool {
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
        tokio::spawn(dispatch::<K>(conns.clone(), requests));
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

/// A batch being gathered: its requests, and what they claim.
struct Open<K: Kind> {
    jobs: Vec<Pending<K>>,
    claimed: HashSet<String>,
    bytes: usize,
}

/// The requests held back from the batches so far (a claim in use, or a full batch), oldest
/// first, and what they claim: a newer request that shares a claim with one of them is held
/// back behind it, so one key's requests are sent in their order.
struct Later<K: Kind> {
    queue: VecDeque<Pending<K>>,
    claims: HashSet<String>,
}

impl<K: Kind> Later<K> {
    fn new() -> Self {
        Self {
            queue: VecDeque::new(),
            claims: HashSet::new(),
        }
    }

    fn push(&mut self, p: Pending<K>, claims: Vec<String>) {
        self.claims.extend(claims);
        self.queue.push_back(p);
    }
}

impl<K: Kind> Open<K> {
    fn new() -> Self {
        Self {
            jobs: Vec::with_capacity(MAX_REQUESTS),
            claimed: HashSet::new(),
            bytes: 0,
        }
    }

    fn full(&self) -> bool {
        self.jobs.len() >= MAX_REQUESTS || self.bytes >= MAX_BYTES
    }

    /// Takes `p` into the batch, or into `later` when it shares a claim with a request in the
    /// batch, in a batch in flight (`busy`) or held back before it, or would make the batch too
    /// large. A request whose caller gave up is dropped.
    fn offer(&mut self, p: Pending<K>, later: &mut Later<K>, busy: &Mutex<HashSet<String>>) {
        if p.state.load(Ordering::Acquire) == GIVEN_UP {
            return;
        }
        if p.reply.is_closed() {
            p.leave(GIVEN_UP);
            return;
        }
        let claims = p.job.claims();
        let bytes = K::bytes(&p.job);
        let too_large = !self.jobs.is_empty() && self.bytes + bytes > MAX_BYTES;
        let shared = {
            let busy = busy
                .lock()
                .expect("never poisoned: no code panics holding it");
            claims
                .iter()
                .any(|c| self.claimed.contains(c) || later.claims.contains(c) || busy.contains(c))
        };
        if too_large || self.full() || shared {
            later.push(p, claims);
            return;
        }
        self.claimed.extend(claims);
        self.bytes += bytes;
        self.jobs.push(p);
    }

    /// Offers every request of `later` again, oldest first.
    fn offer_all(&mut self, later: Later<K>, busy: &Mutex<HashSet<String>>) -> Later<K> {
        let mut again = Later::new();
        for p in later.queue {
            self.offer(p, &mut again, busy);
        }
        again
    }
}

/// The dispatcher of one kind: gathers batches in arrival order and runs each on a free slot.
async fn dispatch<K: Kind>(conns: Conns, mut requests: mpsc::UnboundedReceiver<Pending<K>>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    // The claims of the batches in flight, and a wake-up each time one of them ends.
    let busy = Arc::new(Mutex::new(HashSet::new()));
    let ended = Arc::new(Notify::new());
    let pace = Arc::new(Pace::default());
    let mut later = Later::<K>::new();
    let mut open = true;
    let mut last_sent = Instant::now();
    loop {
        let mut batch = Open::<K>::new();
        later = batch.offer_all(later, &busy);
        let slot = loop {
            while !batch.full() {
                match requests.try_recv() {
                    Ok(p) => batch.offer(p, &mut later, &busy),
                    Err(_) => break,
                }
            }
            if batch.jobs.is_empty() {
                // Nothing to send: wait for a request, or for a batch in flight to end and
                // free the claims the held-back requests wait on.
                if !open && later.queue.is_empty() {
                    return;
                }
                tokio::select! {
                    p = requests.recv(), if open => match p {
                        Some(p) => batch.offer(p, &mut later, &busy),
                        None => open = false,
                    },
                    () = ended.notified(), if !later.queue.is_empty() => {
                        later = batch.offer_all(later, &busy);
                    }
                }
                continue;
            }
            // A batch goes when no batch of its kind is in flight, when it is full, or when the
            // batch in flight has stalled (a slow statement, or one waiting on a lock, holds no
            // one else up for longer than twice a typical batch), on a free slot.
            let stalled = last_sent + pace.stall_bound();
            let in_flight = slots.available_permits() < IN_FLIGHT;
            if !in_flight || batch.full() || !open || Instant::now() >= stalled {
                if let Ok(slot) = slots.clone().try_acquire_owned() {
                    break slot;
                }
                tokio::select! {
                    biased;
                    slot = slots.clone().acquire_owned() => {
                        break slot.expect("the slots are never closed");
                    }
                    p = requests.recv(), if open && !batch.full() => match p {
                        Some(p) => batch.offer(p, &mut later, &busy),
                        None => open = false,
                    },
                }
                continue;
            }
            tokio::select! {
                biased;
                () = ended.notified() => {}
                () = tokio::time::sleep_until(stalled) => {}
                p = requests.recv() => match p {
                    Some(p) => batch.offer(p, &mut later, &busy),
                    None => open = false,
                },
            }
        };
        last_sent = Instant::now();
        busy.lock()
            .expect("never poisoned")
            .extend(batch.claimed.iter().cloned());
        let flight = Flight {
            claims: batch.claimed,
            busy: busy.clone(),
            ended: ended.clone(),
            slot: Some(slot),
            pace: pace.clone(),
            sent: last_sent,
        };
        tokio::spawn(run(conns.clone(), batch.jobs, flight));
    }
}

/// A batch in flight: its slot and its claims, both given back (and the dispatcher woken) when
/// it ends, however it ends.
struct Flight {
    claims: HashSet<String>,
    busy: Arc<Mutex<HashSet<String>>>,
    ended: Arc<Notify>,
    slot: Option<OwnedSemaphorePermit>,
    pace: Arc<Pace>,
    sent: Instant,
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.pace.record(self.sent.elapsed());
        if let Ok(mut busy) = self.busy.lock() {
            for c in &self.claims {
                busy.remove(c);
            }
        }
        // The slot is free before the dispatcher wakes to look at it.
        drop(self.slot.take());
        self.ended.notify_one();
    }
}

/// Runs one batch on its slot and answers each of its requests.
async fn run<K: Kind>(conns: Conns, jobs: Vec<Pending<K>>, flight: Flight) {
    let mut jobs: Vec<Pending<K>> = jobs.into_iter().filter(|p| p.leave(SENT)).collect();
    if jobs.is_empty() {
        return;
    }
    jobs.sort_by(|a, b| K::order(&a.job).cmp(K::order(&b.job)));
    let deadline = jobs.iter().map(|p| p.deadline).max().expect("not empty");
    for p in &jobs {
        let _ = p.sent_until.set(deadline);
    }
    let refs: Vec<&K::Job> = jobs.iter().map(|p| &p.job).collect();
    let answer = conns
        .fetch_batch(K::EFFECT, deadline, || K::query(&refs))
        .await;
    drop(refs);
    // The claims are given back before the answers go, so that a caller's next request for
    // the same key never waits behind its own answered one.
    drop(flight);
    match answer {
        Ok(rows) => {
            let mut slots: Vec<Option<K::Row>> = jobs.iter().map(|_| None).collect();
            for Indexed { i, row } in rows {
                if let Some(slot) = usize::try_from(i - 1).ok().and_then(|n| slots.get_mut(n)) {
                    *slot = Some(row);
                }
            }
            for (p, row) in jobs.into_iter().zip(slots) {
                let _ = p.reply.send(Ok(row));
            }
        }
        Err(e) => {
            for p in jobs {
                let _ = p.reply.send(Err(e.for_each()));
            }
        }
    }
}

/// One column of a batch's arrays: `f` of each request, in the batch's order.
pub(crate) fn column<'q, J, T>(jobs: &[&'q J], f: impl Fn(&'q J) -> T) -> Vec<T> {
    jobs.iter().map(|&j| f(j)).collect()
}
