//! The dispatcher of one kind of batch; the rules are in the parent module's documentation.

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tracing::Instrument as _;

use super::{
    Counts, GIVEN_UP, Indexed, Job, Kind, MAX_BYTES, Pending, SENT, STALL_FACTOR, STALLED,
};
use crate::store::engine::conns::Conns;
use crate::store::engine::trace;

/// A kind's typical batch time (an exponentially weighted mean, µs), which sets the stall bound. A
/// fixed millisecond put four small statements in flight instead of one large one, a third fewer
/// writes a second.
#[derive(Debug, Default)]
struct Pace(AtomicU64);

impl Pace {
    fn record(&self, took: std::time::Duration) {
        // A stalled batch counts as the bound, so one long lock wait does not stretch the next.
        let took = u64::try_from(took.min(self.stall_bound()).as_micros()).unwrap_or(u64::MAX);
        let mean = self.0.load(Ordering::Relaxed);
        let mean = if mean == 0 {
            took
        } else {
            (mean * 7 + took) / 8
        };
        self.0.store(mean, Ordering::Relaxed);
    }

    fn stall_bound(&self) -> std::time::Duration {
        let typical = std::time::Duration::from_micros(self.0.load(Ordering::Relaxed));
        (typical * STALL_FACTOR).max(STALLED)
    }
}

struct Open<K: Kind> {
    jobs: Vec<Pending<K>>,
    claimed: HashSet<String>,
    bytes: usize,
}

/// Requests held back, oldest first, so a key's requests keep their order.
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
            jobs: Vec::with_capacity(K::MAX_JOBS),
            claimed: HashSet::new(),
            bytes: 0,
        }
    }

    fn full(&self) -> bool {
        self.jobs.len() >= K::MAX_JOBS || self.bytes >= MAX_BYTES
    }

    /// Takes `p` into the batch, or into `later` when its claim is busy or the batch full.
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

    fn offer_all(&mut self, later: Later<K>, busy: &Mutex<HashSet<String>>) -> Later<K> {
        let mut again = Later::new();
        for p in later.queue {
            self.offer(p, &mut again, busy);
        }
        again
    }
}

pub(super) async fn dispatch<K: Kind>(
    conns: Conns,
    mut requests: mpsc::UnboundedReceiver<Pending<K>>,
    in_flight: usize,
    counts: Arc<Counts>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
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
            let stalled = last_sent + pace.stall_bound();
            let running = slots.available_permits() < in_flight;
            if !running || batch.full() || !open || Instant::now() >= stalled {
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
        tokio::spawn(run(conns.clone(), batch.jobs, flight, counts.clone()));
    }
}

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
        drop(self.slot.take());
        self.ended.notify_one();
    }
}

async fn run<K: Kind>(conns: Conns, jobs: Vec<Pending<K>>, flight: Flight, counts: Arc<Counts>) {
    let mut jobs: Vec<Pending<K>> = jobs.into_iter().filter(|p| p.leave(SENT)).collect();
    if jobs.is_empty() {
        return;
    }
    counts.sent(jobs.len());
    jobs.sort_by(|a, b| K::order(&a.job).cmp(K::order(&b.job)));
    let deadline = jobs.iter().map(|p| p.deadline).max().expect("not empty");
    for p in &jobs {
        let _ = p.sent_until.set(deadline);
    }
    let refs: Vec<&K::Job> = jobs.iter().map(|p| &p.job).collect();
    let origins = jobs.iter().filter_map(|p| p.origin.as_ref());
    let span = trace::batch(K::NAME, jobs.len(), origins);
    let answer = K::run(&conns, deadline, &refs).instrument(span).await;
    drop(refs);
    // Claims go back before answers, so a caller's next request never waits behind its own.
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
                if let Err(Ok(Some(row))) = p.reply.send(Ok(row)) {
                    K::unanswered(&conns, row);
                }
            }
        }
        Err(e) => {
            for p in jobs {
                let _ = p.reply.send(Err(e.for_each()));
            }
        }
    }
}
