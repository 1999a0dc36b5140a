//! [`LeaseKeeper`]: holds a lease while work runs, renewing it in the background, and says
//! when the work must stop.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::retry::jittered;
use crate::{AcquireRequest, Client, Error, Result, RetryPolicy};
use snapfence_types::{FencingToken, Key, Lease};

/// How a [`LeaseKeeper`] renews, and how early it gives up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeeperOptions {
    /// Time between renewals; `None` for a third of the TTL (less when the margin leaves less
    /// than two of those before the lapse). Each pause is shortened by a random part of up to a
    /// half, so that many keepers do not renew in step.
    pub renew_every: Option<Duration>,
    /// How long before the lease's deadline the keeper declares it lost when renewals keep
    /// failing: the time the holder needs to stop. `None` for a fifth of the TTL.
    pub margin: Option<Duration>,
}

impl KeeperOptions {
    /// Sets [`margin`](Self::margin).
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// Sets [`renew_every`](Self::renew_every).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// The margin and the renewal period for a lease of `ttl`, or why they cannot work: the
    /// margin must leave time for a renewal before the lapse.
    fn resolve(self, ttl: Duration) -> Result<(Duration, Duration)> {
        let margin = self.margin.unwrap_or(ttl / 5);
        let window = ttl.checked_sub(margin).filter(|w| !w.is_zero()).ok_or_else(|| {
            Error::invalid(format!(
                "a keeper margin of {margin:?} leaves no time to renew a lease of {ttl:?}; use a longer TTL or a shorter margin"
            ))
        })?;
        let every = self.renew_every.unwrap_or((ttl / 3).min(window / 2));
        if every >= window {
            return Err(Error::invalid(format!(
                "renewing every {every:?} is too rare for a lease of {ttl:?} with a margin of {margin:?}: the lease would lapse first"
            )));
        }
        Ok((margin, every))
    }
}

/// Why a [`LeaseKeeper`] declared its lease lost.
#[derive(Debug, Clone)]
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
        }
    }
}

/// The keeper's view of its lease: the newest answer, and when it ends at the latest.
#[derive(Debug, Clone)]
struct Held {
    lease: Lease,
    /// When the newest successful renewal (or the acquire) was sent. The server measured the
    /// TTL from a later moment, when it received it, so `sent + ttl` is never after the server's
    /// expiry, whatever the clocks say.
    sent: Instant,
}

impl Held {
    fn deadline(&self) -> Instant {
        self.sent + self.lease.ttl_ms.duration()
    }
}

#[derive(Debug)]
struct Shared {
    held: Mutex<Held>,
    reason: OnceLock<LostReason>,
    lost: CancellationToken,
}

impl Shared {
    fn held(&self) -> Held {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn declare_lost(&self, reason: LostReason) {
        tracing::warn!(key = %self.held().lease.key, %reason, "lease lost");
        // Only the renewal task declares, and it stops after declaring, so this is the first.
        let _ = self.reason.set(reason);
        self.lost.cancel();
    }
}

/// Holds a lease and renews it in the background until it is released or lost.
///
/// [`lost`](Self::lost) fires when the work that the lease guards must stop:
/// - a renewal answered `lease_lost`, or was refused for good; or
/// - renewals kept failing (network, `503`) and the lease's deadline is less than the margin
///   away. The deadline is measured on the local monotonic clock from the moment the last
///   successful renewal (or the acquire) was *sent* plus the TTL, which is never later than the
///   server's expiry. So when it fires, the server still holds the lease for at least the
///   margin: stop within the margin and no other holder can have started.
///
/// [`release`](Self::release) releases the lease. Dropping the keeper releases it too, in the
/// background and on a best-effort basis, so prefer `release` when you want to know it worked.
/// The keeper must be started, and dropped, inside a Tokio runtime.
///
/// ```no_run
/// use std::time::Duration;
///
/// use snapfence_client::{AcquireRequest, Client, KeeperOptions, LeaseKeeper, PutOptions};
/// use snapfence_client::{Key, Owner};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::new("http://127.0.0.1:7878")?;
/// let key = Key::parse("reports/daily")?;
/// let request = AcquireRequest::new(Owner::parse("reporter-1")?, Duration::from_secs(15));
/// // Give up 3 s before the deadline if renewals fail: time enough to stop the work below.
/// let options = KeeperOptions::default().margin(Duration::from_secs(3));
/// let keeper = LeaseKeeper::acquire(&client, &key, &request, options).await?;
///
/// let lost = keeper.lost();
/// let work = async {
///     for step in 0..10 {
///         let state = format!("step {step}");
///         client
///             .put_snapshot(&key, keeper.token(), state, &PutOptions::default())
///             .await?;
///         tokio::time::sleep(Duration::from_secs(5)).await;
///     }
///     Ok::<_, snapfence_client::Error>(())
/// };
/// tokio::select! {
///     () = lost.cancelled() => {
///         // Stop at once: another holder may take over when the margin has passed.
///         eprintln!("stopped: {}", keeper.lost_reason().expect("lost() fired"));
///     }
///     done = work => {
///         done?;
///         keeper.release().await?;
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct LeaseKeeper {
    client: Client,
    shared: Arc<Shared>,
    /// Stops the renewal task, on release or drop.
    stop: CancellationToken,
    /// The renewal task; `None` once released.
    task: Option<JoinHandle<()>>,
}

impl LeaseKeeper {
    /// Acquires `key` and keeps the lease. The options are checked against the requested TTL
    /// before anything is sent.
    pub async fn acquire(
        client: &Client,
        key: &Key,
        request: &AcquireRequest,
        options: KeeperOptions,
    ) -> Result<Self> {
        options.resolve(request.ttl())?;
        let sent = Instant::now();
        let grant = client.acquire(key, request).await?;
        Self::start(client, grant.lease, sent, options)
    }

    /// Keeps a lease acquired elsewhere; `sent` is when its acquire (or last renewal) was sent.
    pub fn start(
        client: &Client,
        lease: Lease,
        sent: Instant,
        options: KeeperOptions,
    ) -> Result<Self> {
        let (margin, every) = options.resolve(lease.ttl_ms.duration())?;
        let shared = Arc::new(Shared {
            held: Mutex::new(Held { lease, sent }),
            reason: OnceLock::new(),
            lost: CancellationToken::new(),
        });
        let stop = CancellationToken::new();
        // The keeper retries on its own schedule, against the deadline.
        let renewer = client.with_retry(RetryPolicy::none());
        let task = tokio::spawn(keep(renewer, shared.clone(), stop.clone(), margin, every));
        Ok(Self {
            client: client.clone(),
            shared,
            stop,
            task: Some(task),
        })
    }

    /// The lease as last granted or renewed.
    pub fn lease(&self) -> Lease {
        self.shared.held().lease
    }

    /// The key.
    pub fn key(&self) -> Key {
        self.lease().key
    }

    /// The lease's fencing token, to send with every fenced write.
    pub fn token(&self) -> FencingToken {
        self.lease().token
    }

    /// The latest the lease can end unless renewed again: the send time of the last successful
    /// renewal plus the TTL, on the local monotonic clock.
    pub fn deadline(&self) -> Instant {
        self.shared.held().deadline()
    }

    /// A token cancelled when the lease is lost (see [`LeaseKeeper`]); await
    /// `lost().cancelled()`. It is a child token: cancelling it does not affect the keeper.
    /// It never fires because of a release.
    pub fn lost(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// Why the lease was lost, once [`lost`](Self::lost) has fired.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.reason.get().cloned()
    }

    /// Stops renewing and releases the lease. After a loss the release is still sent (a
    /// lapsing lease is often still live, and releasing it frees the key sooner), and then
    /// answers [`Error::LeaseLost`] if the lease had already ended.
    pub async fn release(mut self) -> Result<()> {
        self.stop_renewing().await;
        let lease = self.lease();
        self.client.release(&lease.key, lease.token).await
    }

    /// Stops renewing and waits until no renewal is in flight, so that none lands after the
    /// release.
    async fn stop_renewing(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            // The task only ends by returning; a panic in it has already been reported.
            let _ = task.await;
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else {
            return;
        };
        self.stop.cancel();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        let lease = self.lease();
        runtime.spawn(async move {
            let _ = task.await;
            if let Err(e) = client.release(&lease.key, lease.token).await {
                tracing::warn!(key = %lease.key, error = %e, "releasing a dropped keeper's lease failed");
            }
        });
    }
}

/// The renewal loop: renew every `every` from the last success; after a failure retry with
/// backoff; declare the lease lost on `lease_lost`, on a refusal, or `margin` before the
/// deadline. A renewal in flight never delays the lapse: it is raced against it.
async fn keep(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_renew_at_a_third_and_give_up_a_fifth_before_the_deadline() {
        let (margin, every) = KeeperOptions::default()
            .resolve(Duration::from_secs(15))
            .unwrap();
        assert_eq!(margin, Duration::from_secs(3));
        assert_eq!(every, Duration::from_secs(5));
    }

    #[test]
    fn a_large_margin_renews_more_often() {
        let (_, every) = KeeperOptions::default()
            .margin(Duration::from_secs(11))
            .resolve(Duration::from_secs(15))
            .unwrap();
        assert_eq!(every, Duration::from_secs(2));
    }

    #[test]
    fn a_margin_that_leaves_no_time_to_renew_is_refused() {
        let ttl = Duration::from_secs(10);
        assert!(KeeperOptions::default().margin(ttl).resolve(ttl).is_err());
        let rare = KeeperOptions::default()
            .margin(Duration::from_secs(5))
            .renew_every(Duration::from_secs(5));
        assert!(rare.resolve(ttl).is_err());
    }
}
