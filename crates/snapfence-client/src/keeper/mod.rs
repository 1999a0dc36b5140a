//! [`LeaseKeeper`]: holds a lease while work runs, renewing it in the background, and says
//! when the work must stop: through [`LeaseKeeper::lost`], and at every
//! [`check`](LeaseKeeper::check), which reads the monotonic clock itself.

mod state;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::state::LostReason;
use self::state::{Held, Shared, keep};
use crate::trace::{self, TraceContext};
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

/// Holds a lease and renews it in the background until it is released or lost.
///
/// The lease is lost, and the work that it guards must stop, when:
/// - a renewal answered `lease_lost`, or was refused for good; or
/// - less than the margin is left before the lease's deadline: renewals kept failing
///   (network, `503`), or this process did not run (stopped, starved). The deadline is the
///   moment the request that last proved the lease live was *sent*, plus the TTL, on the local
///   monotonic clock: never later than the server's expiry. So when the loss is seen in time,
///   the server still holds the lease for at least the margin: stop within the margin and no
///   other holder can have started.
///
/// [`lost`](Self::lost) fires when the renewal task sees the loss; [`check`](Self::check) also
/// reads the clock, so call it (or write through [`fenced`](Self::fenced), which does) before
/// each write: a process that wakes after its deadline learns it there, before sending. A write
/// already sent is never cut off: [`fenced`](Self::fenced) returns its answer, accepted or
/// refused, so stopping the work never hides whether the write landed.
///
/// A grant that waited in the key's queue is dated by a renewal sent at once, never by the
/// wait's start ([`acquire`](Self::acquire), [`adopt`](Self::adopt)).
///
/// [`release`](Self::release) releases the lease. Dropping the keeper releases it too, in the
/// background and on a best-effort basis, so prefer `release` when you want to know it worked.
/// The keeper must be started, and dropped, inside a Tokio runtime.
///
/// The renewals, and the release on drop, carry the trace context that was current when the
/// keeper started ([`trace`](crate::trace)); [`release`](Self::release) and the calls of
/// [`fenced`](Self::fenced) carry the one current where they are awaited.
///
/// ```no_run
/// use std::time::Duration;
///
/// use snapfence_client::{AcquireRequest, Client, Error, KeeperOptions, LeaseKeeper, PutOptions};
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
/// let put = PutOptions::default();
/// for step in 0..10 {
///     let state = format!("step {step}");
///     // Checks the lease first and sends nothing once it is lost; a write sent runs to its
///     // answer.
///     match keeper
///         .fenced(|token| client.put_snapshot(&key, token, state, &put))
///         .await
///     {
///         Ok(_) => {}
///         // The keeper's loss, or the server's lease_lost: stop working on the key.
///         Err(Error::LeaseLost { detail }) => return Err(detail.into()),
///         Err(e) => return Err(e.into()),
///     }
///     tokio::select! {
///         () = lost.cancelled() => break,
///         () = tokio::time::sleep(Duration::from_secs(5)) => {}
///     }
/// }
/// keeper.release().await?;
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
    /// The trace context current when the keeper started: its own requests' (renewals, the
    /// release on drop).
    trace: Option<TraceContext>,
}

impl LeaseKeeper {
    /// Acquires `key` and keeps the lease. The options are checked against the requested TTL
    /// before anything is sent.
    ///
    /// With a wait ([`AcquireRequest::wait`]) the server granted the lease at some moment of
    /// the wait, which the client cannot know, so the lease is renewed at once
    /// ([`adopt`](Self::adopt)) and dated from that renewal: a long wait does not make the
    /// lease look about to lapse. [`Error::LeaseLost`] if it ended before that renewal.
    pub async fn acquire(
        client: &Client,
        key: &Key,
        request: &AcquireRequest,
        options: KeeperOptions,
    ) -> Result<Self> {
        options.resolve(request.ttl())?;
        let sent = Instant::now();
        let grant = client.acquire(key, request).await?;
        if request.wait_ms.unwrap_or(0) <= 0 {
            return Self::start(client, grant.lease, sent, options);
        }
        let lease = grant.lease;
        match Self::adopt(client, lease.clone(), options).await {
            Ok(keeper) => Ok(keeper),
            Err(e) => {
                if !matches!(e, Error::LeaseLost { .. }) {
                    // The lease may still be live and nobody keeps it: free the key.
                    let _ = client.release(&lease.key, lease.token).await;
                }
                Err(e)
            }
        }
    }

    /// Keeps a lease acquired elsewhere; `sent` is when the request that last proved it live
    /// (an acquire that did not wait, or a renewal) was sent. For a lease whose moment is not
    /// known (a grant that waited in the queue, a lease handed over by another process), use
    /// [`adopt`](Self::adopt).
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
            margin,
        });
        let stop = CancellationToken::new();
        // The keeper retries on its own schedule, against the deadline.
        let renewer = client.with_retry(RetryPolicy::none());
        // A spawned task has no task-local value of its own: the renewals are the caller's.
        let trace = TraceContext::current();
        let renewals = keep(renewer, shared.clone(), stop.clone(), margin, every);
        let task = tokio::spawn(trace::scope(trace.clone(), renewals));
        Ok(Self {
            client: client.clone(),
            shared,
            stop,
            task: Some(task),
            trace,
        })
    }

    /// Keeps a lease granted at a moment this process does not know: a grant that waited in
    /// the key's queue, or a lease another process acquired. Renews it at once (with the
    /// client's retries) and dates it from that renewal's send time, the earliest moment the
    /// server can have measured the TTL from. [`Error::LeaseLost`] when the lease has already
    /// ended.
    pub async fn adopt(client: &Client, lease: Lease, options: KeeperOptions) -> Result<Self> {
        options.resolve(lease.ttl_ms.duration())?;
        let sent = Instant::now();
        let renewed = client.renew(&lease.key, lease.token, None).await?;
        Self::start(client, renewed, sent, options)
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

    /// The latest the lease can end unless renewed again: the send time of the request that
    /// last proved it live plus the TTL, on the local monotonic clock.
    pub fn deadline(&self) -> Instant {
        self.shared.held().deadline()
    }

    /// A token cancelled when the renewal task finds the lease lost (see [`LeaseKeeper`]);
    /// await `lost().cancelled()`. It is a child token: cancelling it does not affect the
    /// keeper. It never fires because of a release. Before a write, call
    /// [`check`](Self::check), which also reads the clock.
    pub fn lost(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }

    /// `Ok` while the work may go on; [`Error::LeaseLost`] once the lease is lost, as the
    /// renewal task found or as the monotonic clock says now (less than the margin left before
    /// the deadline). Cheap: it sends nothing.
    pub fn check(&self) -> Result<()> {
        match self.shared.verdict() {
            None => Ok(()),
            Some(reason) => Err(reason.into()),
        }
    }

    /// Runs one fenced write with the lease's token once [`check`](Self::check) passes, and
    /// returns its outcome; sends nothing, and answers [`Error::LeaseLost`], when the lease is
    /// lost. The write is not raced against the loss: once sent it runs to its answer (accepted,
    /// or refused by the server's fence), so that the caller always learns what became of it.
    pub async fn fenced<T, F, Fut>(&self, write: F) -> Result<T>
    where
        F: FnOnce(FencingToken) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.check()?;
        write(self.token()).await
    }

    /// Why the lease was lost, once it is (the clock is read, as by [`check`](Self::check)).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared.verdict()
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
        let release = async move {
            let _ = task.await;
            if let Err(e) = client.release(&lease.key, lease.token).await {
                tracing::warn!(key = %lease.key, error = %e, "releasing a dropped keeper's lease failed");
            }
        };
        runtime.spawn(trace::scope(self.trace.take(), release));
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
