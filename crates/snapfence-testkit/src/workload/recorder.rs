//! The record of a run: every operation as it completed, and the figures of the attempts that
//! settled them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::checker::{Answer, Micros, Op, Outcome};

/// Every operation of a run, appended as each completes, and the figures of its attempts.
#[derive(Default)]
pub struct Recorder {
    pub(super) ops: Mutex<Vec<Op>>,
    pub(super) next_id: AtomicU64,
    pub(super) changing_calls: AtomicUsize,
    pub(super) unknown_attempts: AtomicUsize,
    pub(super) replays: AtomicUsize,
    pub(super) txn_unknown_attempts: AtomicUsize,
    pub(super) txn_replays: AtomicUsize,
    pub(super) timed_out_attempts: AtomicUsize,
    pub(super) slowest_attempt_us: AtomicU64,
    stopped: AtomicBool,
    /// Transaction attempts sent and not yet answered, by the service they were sent to.
    txns_in_flight: Mutex<HashMap<String, usize>>,
}

/// What the attempts of a run's changing calls came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Changing calls (acquire, renew, release, put, transaction), each with its own
    /// Idempotency-Key.
    pub changing_calls: usize,
    /// Attempts whose outcome was unknown, each sent again with its call's key.
    pub unknown_attempts: usize,
    /// Answers the service replayed from a key's record (`Idempotent-Replayed: true`).
    pub replays: usize,
    /// Of the attempts with an unknown outcome, those of transactions.
    pub txn_unknown_attempts: usize,
    /// Of the replayed answers, those of transactions.
    pub txn_replays: usize,
    /// Attempts of any call that the client gave up on (its timeout) without an answer.
    pub timed_out_attempts: usize,
    /// The longest any one attempt waited for its answer (or its failure).
    pub slowest_attempt: Duration,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} changing calls, {} attempts with an unknown outcome sent again (with their call's \
             Idempotency-Key, if it has one; {} of them transactions), {} answers replayed ({} of \
             transactions); slowest attempt {} ms, {} attempts timed out",
            self.changing_calls,
            self.unknown_attempts,
            self.txn_unknown_attempts,
            self.replays,
            self.txn_replays,
            self.slowest_attempt.as_millis(),
            self.timed_out_attempts
        )
    }
}

impl Recorder {
    /// The figures of the attempts so far.
    pub fn figures(&self) -> Figures {
        Figures {
            changing_calls: self.changing_calls.load(Ordering::Relaxed),
            unknown_attempts: self.unknown_attempts.load(Ordering::Relaxed),
            replays: self.replays.load(Ordering::Relaxed),
            txn_unknown_attempts: self.txn_unknown_attempts.load(Ordering::Relaxed),
            txn_replays: self.txn_replays.load(Ordering::Relaxed),
            timed_out_attempts: self.timed_out_attempts.load(Ordering::Relaxed),
            slowest_attempt: Duration::from_micros(self.slowest_attempt_us.load(Ordering::Relaxed)),
        }
    }

    /// The history so far.
    pub fn history(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// Tells the clients to start no new operation, before the plan's duration is up: for a
    /// scenario that runs until its faults are over rather than for a fixed time.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Whether some transaction was sent to the service at `endpoint` and not answered yet: a
    /// fault done to that service now lands in the middle of it.
    pub fn txn_in_flight(&self, endpoint: &str) -> bool {
        self.txns_in_flight
            .lock()
            .unwrap()
            .get(endpoint)
            .is_some_and(|n| *n > 0)
    }

    /// Counts a transaction attempt to `endpoint` as sent (`+1`) or answered (`-1`).
    pub(super) fn txn_sent(&self, endpoint: &str, delta: isize) {
        let mut in_flight = self.txns_in_flight.lock().unwrap();
        let n = in_flight.entry(endpoint.to_owned()).or_default();
        *n = n.saturating_add_signed(delta);
    }

    /// When the first write acknowledged after `at` was acknowledged: the end of an outage that
    /// began at `at`, as the clients saw it. Only writes sent at or after `at` count, so that a
    /// write that merely finished late does not close the window.
    pub fn first_write_after(&self, at: Micros) -> Option<Micros> {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.invoked >= at && matches!(o.outcome, Outcome::Ok(Answer::Written { .. })))
            .map(|o| o.completed)
            .min()
    }

    /// The longest stretch of `[from, to]` in which no write was acknowledged: an outage as the
    /// clients felt it, wherever in that span it fell (a leader cut off from its consensus
    /// store keeps accepting writes for a while after the fault, then none until a successor
    /// does).
    pub fn longest_without_writes(&self, from: Micros, to: Micros) -> Duration {
        let mut acknowledged: Vec<Micros> = self
            .ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Ok(Answer::Written { .. })))
            .map(|o| o.completed)
            .filter(|at| (from..=to).contains(at))
            .collect();
        acknowledged.sort_unstable();
        let bounds = std::iter::once(from)
            .chain(acknowledged)
            .chain(std::iter::once(to));
        let longest = bounds
            .clone()
            .zip(bounds.skip(1))
            .map(|(a, b)| b - a)
            .max()
            .unwrap_or_default();
        Duration::from_micros(longest.max(0) as u64)
    }

    /// The largest token granted so far.
    pub fn highest_token(&self) -> Option<i64> {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .filter_map(|o| match o.outcome {
                Outcome::Ok(Answer::Granted { token }) => Some(token),
                _ => None,
            })
            .max()
    }
}
