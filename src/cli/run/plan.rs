//! How `run` divides a lease's TTL between renewing, SIGTERM's grace and SIGKILL's allowance.

use std::time::Duration;

/// Time allowed, beyond `--grace`, between the keeper declaring the lease lost and the server's
/// earliest possible expiry, for SIGKILL to take the group down and for the scheduler: this,
/// or a fifth of the TTL when that is shorter (see [`Plan`]).
const STOP_ALLOWANCE: Duration = Duration::from_secs(1);
/// The least time that `--ttl` must leave for renewing once `--grace` and the stop allowance are
/// reserved, for several renewal attempts: this, or a fifth of the TTL when that is shorter.
const MIN_RENEW_WINDOW: Duration = Duration::from_secs(1);
/// The longest `--grace` when none is given; below three times this, a third of the TTL.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// How often the process group is looked at while it is being stopped (less when the stop
/// allowance is short).
const POLL: Duration = Duration::from_millis(10);

/// How `run` divides a lease's TTL: from the end, the stop allowance (SIGKILL's time to take
/// the group down), before it `grace` (SIGTERM's time), and before that the time to renew in.
/// Both fixed parts shrink with a short TTL, so that every TTL a server accepts works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    /// Between SIGTERM and SIGKILL.
    pub(super) grace: Duration,
    /// After SIGKILL, until the server's earliest possible expiry.
    pub(super) allowance: Duration,
}

impl Plan {
    /// The plan for `--ttl` and `--grace` (a third of the TTL, at most [`DEFAULT_GRACE`], when
    /// none is given), or what to do when the TTL leaves no time to renew in.
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

    /// How long before the deadline the keeper declares the lease lost.
    pub(super) fn margin(&self) -> Duration {
        self.grace + self.allowance
    }

    /// The shortest TTL that leaves room for `grace`: `grace` plus 2 s, or five thirds of
    /// `grace` when the TTL's fifths are shorter than those seconds.
    fn least_ttl(grace: Duration) -> Duration {
        (grace * 5 / 3).min(grace + STOP_ALLOWANCE + MIN_RENEW_WINDOW)
    }

    /// How often a group being stopped is looked at: often enough to notice within the
    /// allowance.
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
