//! What a keeper knows of its lease (the newest answer, when it ends at the latest, whether
//! and why it is lost) and the renewal loop that keeps it.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

#[cfg(doc)]
use crate::LeaseKeeper;
use crate::retry::jittered;
use crate::{Client, Error, RetryPolicy};
use snapfence_types::Lease;

/// Why a [`LeaseKeeper`] declared its lease lost.
///
/// The keeper reports a loss as [`Error::LeaseLost`] ([`check`](LeaseKeeper::check),
/// [`fenced`](LeaseKeeper::fenced)), the variant of the server's `lease_lost`: one `match` arm
/// covers both, and [`LeaseKeeper::lost_reason`] tells them apart. `From<LostReason>` makes
/// that error.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum LostReason {
    /// A renewal answered `lease_lost`: the lease expired, was released, or was superseded.
    LeaseLost,
    /// Renewals kept failing and less than the margin was left before the deadline. The lease
    /// may still be live on the server, but not for long enough to go on working.
    Lapsing {
        /// The last failure of a renewal; `None` if none had been tried yet.
        last_error: Option<Arc<Error>>,
    },
    /// A renewal was refused in a way retrying cannot change (e.g. `401 unauthorized`).
    Refused(Arc<Error>),
    /// A [`check`](LeaseKeeper::check) found less than the margin left, or the deadline past,
    /// before the renewal task had said anything: this process did not run for a while
    /// (stopped, or starved of CPU), so no renewal was confirmed in time.
    Overdue,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::LeaseLost => f.write_str(
                "the server answered lease_lost: the lease expired, was released or was superseded",
            ),
            Self::Lapsing { last_error: None } => {
                f.write_str("the lease is about to lapse before it could be renewed")
            }
            Self::Lapsing {
                last_error: Some(e),
            } => write!(
                f,
                "renewals kept failing and the lease is about to lapse (last failure: {e})"
            ),
            Self::Refused(e) => write!(f, "a renewal was refused: {e}"),
            Self::Overdue => f.write_str(
                "the lease's deadline came within the margin before a renewal was confirmed (was this process stopped or starved?)",
            ),
        }
    }
}

impl From<LostReason> for Error {
    fn from(reason: LostReason) -> Self {
        Error::LeaseLost {
            detail: format!(
                "the lease keeper stopped the work: {reason}. Stop working on the key; acquire it again to go on"
            ),
        }
    }
}

/// The keeper's view of its lease: the newest answer, and when it ends at the latest.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) lease: Lease,
    /// When the request that last proved the lease live (a renewal, or an acquire that did not
    /// wait) was sent. The server measured the TTL from a later moment, when it received it,
    /// so `sent + ttl` is never after the server's expiry, whatever the clocks say.
    pub(super) sent: Instant,
}

impl Held {
    pub(super) fn deadline(&self) -> Instant {
        self.sent + self.lease.ttl_ms.duration()
    }
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) held: Mutex<Held>,
    pub(super) reason: OnceLock<LostReason>,
    pub(super) lost: CancellationToken,
    /// How long before the deadline the lease counts as lost.
    pub(super) margin: Duration,
}

impl Shared {
    pub(super) fn held(&self) -> Held {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn declare_lost(&self, reason: LostReason) {
        // The renewal task and a check may both find the lapse; the first one's reason stays.
        if self.reason.set(reason).is_ok() {
            let reason = self.reason.get().expect("just set");
            tracing::warn!(key = %self.held().lease.key, %reason, "lease lost");
        }
        self.lost.cancel();
    }

    /// Why the lease is lost, if it is: as the renewal task declared, or as the monotonic
    /// clock says now. The clock is read here, not left to the renewal task, because a process
    /// that was stopped (SIGSTOP, a starved machine) past its deadline may run its own code
    /// before the task's timer fires: that code must not take the lease for live.
    pub(super) fn verdict(&self) -> Option<LostReason> {
        if let Some(reason) = self.reason.get() {
            return Some(reason.clone());
        }
        if Instant::now() + self.margin >= self.held().deadline() {
            self.declare_lost(LostReason::Overdue);
        }
        self.reason.get().cloned()
    }
}

/// The renewal loop: renew every `every` from the last success; after a failure retry with
/// backoff; declare the lease lost on `lease_lost`, on a refusal, or `margin` before the
/// deadline. A renewal in flight never delays the lapse: it is raced against it.
pub(super) async fn keep(
    client: Client,
    shared: Arc<Shared>,
    stop: CancellationToken,
    margin: Duration,
    every: Duration,
) {
    let backoff = RetryPolicy {
        max_attempts: u32::MAX,
        initial_backoff: Duration::from_millis(50),
        max_backoff: every / 2,
    };
    let mut failures = 0;
    let mut last_error: Option<Arc<Error>> = None;
    let mut next = shared.held().sent + jittered(every);
    loop {
        let held = shared.held();
        let lapse = held.deadline() - margin;
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until(lapse) => {
                shared.declare_lost(LostReason::Lapsing { last_error });
                return;
            }
            () = sleep_until(next) => {}
        }
        let sent = Instant::now();
        let answer = tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until(lapse) => {
                shared.declare_lost(LostReason::Lapsing { last_error });
                return;
            }
            answer = client.renew(&held.lease.key, held.lease.token, None) => answer,
        };
        match answer {
            Ok(lease) => {
                *shared.held.lock().unwrap_or_else(PoisonError::into_inner) = Held { lease, sent };
                failures = 0;
                last_error = None;
                next = sent + jittered(every);
            }
            Err(Error::LeaseLost { .. }) => {
                shared.declare_lost(LostReason::LeaseLost);
                return;
            }
            Err(e) if e.is_transient() => {
                failures += 1;
                tracing::debug!(key = %held.lease.key, failures, error = %e, "renewal failed; retrying");
                last_error = Some(Arc::new(e));
                next = Instant::now() + backoff.backoff(failures);
            }
            Err(e) => {
                shared.declare_lost(LostReason::Refused(Arc::new(e)));
                return;
            }
        }
    }
}
