//! How `run` divides a lease's TTL between renewing, SIGTERM's grace and SIGKILL's allowance.

use std::time::Duration;

/// Time beyond `--grace` for SIGKILL to take the group down before the server's earliest expiry.
const STOP_ALLOWANCE: Duration = Duration::from_secs(1);
/// The least time `--ttl` must leave for renewals once grace and allowance are reserved.
const MIN_RENEW_WINDOW: Duration = Duration::from_secs(1);
const DEFAULT_GRACE: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(10);

/// How `run` divides a lease's TTL: from the end, the stop allowance, `grace`, and the renewals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) grace: Duration,
    pub(super) allowance: Duration,
}

impl Plan {
    /// The plan for `--ttl` and `--grace`, or what to do when the TTL leaves no time to renew.
    pub(super) fn new(ttl: Duration, grace: Option<Duration>) -> Result<Self, String> {
        let plan = Self {
            grace: grace.unwrap_or((ttl / 3).min(DEFAULT_GRACE)),
            allowance: (ttl / 5).min(STOP_ALLOWANCE),
        };
        let renew = (ttl / 5).min(MIN_RENEW_WINDOW);
        if ttl >= plan.margin() + renew {
            return Ok(plan);
        }
        Err(format!(
            "--ttl {} is too short for --grace {}: the command must be stopped before the lease can expire, which takes --grace plus {}, and the lease needs at least {} more to be renewed in. Use --ttl {} or more{}",
            humantime::format_duration(ttl),
            humantime::format_duration(plan.grace),
            humantime::format_duration(plan.allowance),
            humantime::format_duration(renew),
            humantime::format_duration(Self::least_ttl(plan.grace)),
            if plan.grace.is_zero() {
                ""
            } else {
                ", or a shorter --grace (or none: the default fits every --ttl)"
            },
        ))
    }

    pub(super) fn margin(&self) -> Duration {
        self.grace + self.allowance
    }

    /// The shortest TTL that leaves room for `grace`.
    fn least_ttl(grace: Duration) -> Duration {
        (grace * 5 / 3).min(grace + STOP_ALLOWANCE + MIN_RENEW_WINDOW)
    }

    /// Often enough to notice within the allowance.
    pub(super) fn poll(&self) -> Duration {
        POLL.min(self.allowance / 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grace_fits_every_ttl() {
        for ms in [1, 7, 100, 999, 1_000, 2_500, 5_000, 15_000, 86_400_000] {
            let ttl = Duration::from_millis(ms);
            let plan = Plan::new(ttl, None).unwrap_or_else(|e| panic!("--ttl {ms}ms: {e}"));
            assert!(plan.grace <= DEFAULT_GRACE, "--ttl {ms}ms: {plan:?}");
        }
    }

    #[test]
    fn the_default_grace_is_a_third_of_the_ttl_up_to_five_seconds() {
        let grace = |s| Plan::new(Duration::from_secs(s), None).unwrap().grace;
        assert_eq!(grace(3), Duration::from_secs(1));
        assert_eq!(grace(15), Duration::from_secs(5));
        assert_eq!(grace(600), Duration::from_secs(5));
    }

    #[test]
    fn the_least_ttl_suggested_for_a_grace_is_accepted_and_a_shorter_one_is_not() {
        for ms in [1, 10, 300, 2_000, 3_000, 5_000, 60_000] {
            let grace = Duration::from_millis(ms);
            let least = Plan::least_ttl(grace);
            assert!(
                Plan::new(least, Some(grace)).is_ok(),
                "{grace:?}: {least:?}"
            );
            let shorter = least - Duration::from_millis(1);
            assert!(
                Plan::new(shorter, Some(grace)).is_err(),
                "{grace:?}: {shorter:?}"
            );
        }
    }
}
