//! Which failed attempts are retried, and after how long.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;

use crate::Error;

/// How failed attempts are retried (which ones are: the [crate docs](crate#timeouts-and-retries)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 never retries.
    pub max_attempts: u32,
    /// The pause before the first retry; each further pause doubles, up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retries: for callers that retry on their own terms, as [`LeaseKeeper`](crate::LeaseKeeper)
    /// does against the lease's deadline.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The pause before retry `n` (1-based): the doubled backoff, of which a random half is
    /// taken off so that many clients failing together do not retry together.
    pub fn backoff(&self, n: u32) -> Duration {
        jittered(
            self.initial_backoff
                .saturating_mul(2u32.saturating_pow(n.saturating_sub(1)))
                .min(self.max_backoff),
        )
    }
}

/// Between half of `d` and `d`, at random.
pub(crate) fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// What a call does, which decides how it is sent and which failed attempts are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallKind {
    /// Reads: they change nothing, so a failed attempt may be tried again.
    Read,
    /// Changing calls: sent with one fresh `Idempotency-Key`, the same on every attempt, so that
    /// the server does the change at most once and a retry after an unknown outcome is answered
    /// with what happened.
    Change,
}

impl CallKind {
    /// Whether a failed attempt of a call of this kind may be tried again: whenever the same
    /// call may succeed later (the network, a 5xx, an unreadable answer), and for a change also
    /// while the server is still running an earlier attempt of it (`request_in_progress`).
    pub(crate) fn may_retry(self, e: &Error) -> bool {
        e.is_transient() || (self == Self::Change && matches!(e, Error::RequestInProgress { .. }))
    }
}

/// Called before each retry with the failure and the pause before the next attempt, so that
/// whoever waits can be told.
#[derive(Clone)]
pub(crate) struct OnRetry(pub(crate) Arc<RetryHook>);

/// What [`ClientBuilder::on_retry`] takes.
pub(crate) type RetryHook = dyn Fn(&Error, Duration) + Send + Sync;

impl fmt::Debug for OnRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnRetry(..)")
    }
}

#[cfg(test)]
mod tests {
    use reqwest::StatusCode;

    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
        };
        for (n, full) in [(1, 100), (2, 200), (3, 350), (8, 350)] {
            let d = policy.backoff(n);
            let full = Duration::from_millis(full);
            assert!(d >= full / 2 && d <= full, "retry {n}: {d:?}");
        }
    }

    #[test]
    fn only_failures_that_may_pass_later_are_retried() {
        let unavailable = Error::Unavailable {
            detail: String::new(),
        };
        let bad_gateway = Error::Unexpected {
            status: StatusCode::BAD_GATEWAY,
            detail: String::new(),
            request_id: None,
        };
        let lost = Error::LeaseLost {
            detail: String::new(),
        };
        let in_progress = Error::RequestInProgress {
            detail: String::new(),
        };
        for kind in [CallKind::Read, CallKind::Change] {
            assert!(kind.may_retry(&unavailable));
            assert!(kind.may_retry(&bad_gateway));
            assert!(!kind.may_retry(&lost));
        }
        assert!(CallKind::Change.may_retry(&in_progress));
        assert!(!CallKind::Read.may_retry(&in_progress));
        assert!(bad_gateway.is_indeterminate() && !unavailable.is_indeterminate());
    }
}
