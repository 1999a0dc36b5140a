//! The dispatcher of one kind of batch: gathers the requests into batches in arrival order
//! (never two with one claim in a batch), sends each when no batch of its kind is in flight, when
//! it is full, or when the one in flight has stalled, and answers each request from its row.
//! The rules are in the parent module's documentation.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use super::{
    GIVEN_UP, IN_FLIGHT, Indexed, Job, Kind, MAX_BYTES, MAX_REQUESTS, Pending, SENT, STALL_FACTOR,
    STALLED,
};
use crate::store::engine::conns::Conns;

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
pub(super) async fn dispatch<K: Kind>(
    conns: Conns,
    mut requests: mpsc::UnboundedReceiver<Pending<K>>,
) {
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
