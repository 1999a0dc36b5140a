//! Waiting acquires (contract v1.1, "Waiting acquire"): a request that asks for `wait_ms` and
//! finds the key held takes a place in the key's queue (`lease_waiters`, shared by every
//! instance on the database) and sleeps in this instance, holding no database connection,
//! until it is woken; then it tries again with the acquire statement, as a waiter.
//!
//! Order: the acquire statement grants a free key only to its first live waiter
//! (`sql/acquire.sql`, `decision`; a lone request's `lease_acquire_one()` alike), so the queue's
//! order is the grant order, whichever instance each waiter is on, and an acquire that does not
//! wait cannot pass the queue.
//!
//! Wake-ups come from the database, never from a polling loop: a release or an abandon notifies
//! the key on `snapfence_waiters` at commit, and so does a waiter that leaves the queue, with the
//! key or without it (both triggers of `migrations/20261204000000_lease_waiters.sql`); this instance listens on one
//! connection of its own and wakes its first waiter of the key. An expiry needs no message: the
//! first waiter sleeps until the holder's `expires_at` by the database clock (the statement
//! that found the key held says how far off that is) and tries then. Only the first local waiter
//! of a key tries on a wake-up; each one that leaves wakes the next, so a hand-off costs one try
//! per instance with waiters of the key, not one per waiter.
//!
//! Liveness: the listening connection holds an advisory lock named by this instance's id for as
//! long as it lives, and the acquire statement skips the waiters of an instance whose lock is
//! free (a dead one). A waiter whose client goes away is dropped with its request's future,
//! which takes its row out. Twice a second, while it has waiters, an instance deletes the rows
//! of dead instances (waking their keys' next waiters) and any row of its own that no request
//! holds any more.
//!
//! While the listening connection is down, this instance's waiters look dead to the others (who
//! may then be served first), and a new waiter waits for it to be back; one that is not back
//! when its wait is over tries once. Once it listens again, each of its first waiters tries
//! once, since a release may have gone unheard.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

mod enqueue;
mod place;
mod tasks;

use super::{AcquireAnswer, AcquireBatch, AcquireJob, AcquireOutcome, NewLease};
use crate::store::engine::batch::Batcher;
use crate::store::idempotency::{self, Gated};
use crate::store::{Db, RequestContext, Result, StoreError, Tasks, restart_deadline};
pub(crate) use enqueue::ENQUEUE;
use enqueue::{Enqueue, EnqueueBatch, Queued};
use place::Place;
use tasks::{heartbeat, listen, sweep};

/// The channel the triggers notify a key on when its waiters should look again.
const CHANNEL: &str = "snapfence_waiters";
/// How often an instance with waiters drops the rows of dead instances: twice within the
/// contract's second.
const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// How old a row of this instance that none of its requests holds must be before the sweep
/// takes it out (`sql/wait_sweep.sql` says the same): past any enqueue's answer.
const STALE_AFTER: Duration = Duration::from_secs(30);

/// This instance's waiting acquires: the queues it holds places in, the connection it listens
/// on, and the dispatcher of the waiters' tries. Cheap to clone; its tasks stop when the last
/// clone is dropped.
#[derive(Debug, Clone)]
pub struct Waiters {
    inner: Arc<Inner>,
    _tasks: Arc<Tasks>,
}

/// What the waiters of an instance share.
struct Inner {
    /// The id of this instance in `lease_waiters.instance`, and of its liveness lock: drawn
    /// from the database's sequence when it first listens (unique among the instances that
    /// share the database), 0 until then.
    instance: AtomicI32,
    /// This instance's waiters by key, in queue order, each with what wakes it.
    queues: Mutex<HashMap<String, BTreeMap<i64, Arc<Notify>>>>,
    /// Whether the listening connection listens and holds the liveness lock.
    listening: watch::Sender<bool>,
    /// Set when the instance shuts down: every wait ends with its last try.
    stopping: watch::Sender<bool>,
    /// Until when this instance sweeps although it has no waiters: a row of its own may have
    /// been left behind (a leave or an enqueue that failed), and the sweep takes it out once it
    /// is old enough.
    stale_until: Mutex<Option<Instant>>,
    /// The waiters' tries, batched like every acquire.
    tries: Batcher<AcquireBatch>,
    /// The waiters' places taken in their queues, batched likewise.
    enqueues: Batcher<EnqueueBatch>,
    pool: PgPool,
    /// How long this instance may go without saying it is alive before its waiters are passed
    /// over (`--waiter-stall-bound`; `sql/wait_heartbeat.sql`).
    stall_bound: Duration,
    /// This instance's waiters whose places another instance took out while this one did not
    /// answer (it was frozen): each makes one last try.
    passed_over: Mutex<HashSet<i64>>,
    /// The (principal, Idempotency-Key) of this instance's waiters that sent one, for
    /// [`Waiters::holds`].
    keyed: Mutex<HashMap<(String, String), usize>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters")
            .field("instance", &self.instance.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Waiters {
    /// Starts listening for wake-ups on `db`'s database under a fresh instance id. Must be
    /// called within a Tokio runtime.
    pub fn start(db: &Db, stall_bound: Duration) -> Self {
        let pool: PgPool = (**db).clone();
        let inner = Arc::new(Inner {
            instance: AtomicI32::new(0),
            queues: Mutex::default(),
            listening: watch::Sender::new(false),
            stopping: watch::Sender::new(false),
            stale_until: Mutex::new(None),
            tries: Batcher::start(db.conns().clone()),
            enqueues: Batcher::start(db.conns().clone()),
            pool,
            stall_bound,
            passed_over: Mutex::default(),
            keyed: Mutex::default(),
        });
        let tasks = vec![
            tokio::spawn(listen(Arc::downgrade(&inner))),
            tokio::spawn(sweep(Arc::downgrade(&inner))),
            tokio::spawn(heartbeat(Arc::downgrade(&inner))),
        ];
        Self {
            inner,
            _tasks: Arc::new(Tasks(tasks)),
        }
    }

    /// Ends every wait of this instance (each makes its last try and answers), and every wait
    /// that starts from now on at once: called when the instance shuts down, which waits for
    /// the requests in flight.
    pub fn stop(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// Whether a waiter of this instance holds the Idempotency-Key of `ctx` (of its principal):
    /// a request with it that does not wait is then still running, and answered so at once
    /// rather than stored as a refusal under the waiter's key. (One on another instance meets the
    /// waiter only if it waits too: the queue's unique index.)
    pub fn holds(&self, ctx: &RequestContext) -> bool {
        let Some(idem) = &ctx.idempotency else {
            return false;
        };
        let principal = ctx.principal.clone().unwrap_or_default();
        self.inner
            .keyed
            .lock()
            .expect("never poisoned")
            .contains_key(&(principal, idem.key.as_str().to_owned()))
    }

    /// How many requests of this instance wait in a queue, for the metrics.
    pub fn waiting(&self) -> usize {
        let queues = self.inner.queues.lock().expect("never poisoned");
        queues.values().map(BTreeMap::len).sum()
    }

    /// Acquires `req`, waiting up to `wait` in the key's queue while it is held: the grant, or
    /// a refusal (a retained recovery record is answered at once; `held` once the wait is over).
    /// The request's database bound counts from each try, not from its arrival.
    #[tracing::instrument(level = "debug", skip_all, fields(key = %req.key))]
    pub async fn acquire(
        &self,
        req: &NewLease,
        ctx: &RequestContext,
        wait: Duration,
    ) -> Result<Gated<AcquireOutcome>> {
        let until = Instant::now() + wait;
        // A request whose Idempotency-Key already waits in a queue, on any instance, is still
        // running: answered at once, it takes no second place.
        let Some((mut place, heard)) = self.enqueue(req, ctx, until).await? else {
            return Ok(Gated::InProgress);
        };
        let mut last_try = !heard || *self.inner.stopping.borrow();
        loop {
            restart_deadline();
            let gated = idempotency::gated(ctx, || {
                self.inner
                    .tries
                    .answer(AcquireJob::waiting(req, ctx, place.id, last_try))
            })
            .await?;
            match gated {
                Gated::Ran(answer) if !answer.settled && answer.held() => {
                    last_try = !self.sleep(&place, &answer, until).await;
                    // Passed over while this instance did not answer: its place is gone, so
                    // it tries once more, for the last time.
                    if self.inner.take_passed_over(place.id) {
                        last_try = true;
                    }
                }
                // A waiter's key has a row, so it never races to make one; a statement that
                // says otherwise is run again like any acquire.
                Gated::Ran(answer) if !answer.settled => {}
                gated => {
                    // The statement that answered took the row out.
                    place.left = true;
                    return Ok(gated.map(AcquireAnswer::into_outcome));
                }
            }
        }
    }

    /// Takes a place at the end of `req`'s key's queue, under its owner, once this instance listens (so that a
    /// release is heard from the moment the place is taken); whether it listens. An instance
    /// that does not listen by `until` (its database connection for it is slow to come, or
    /// away) takes the place anyway, for one try that is the last. `None` when a waiter with
    /// the request's Idempotency-Key (and API key) holds a place already, on any instance.
    async fn enqueue(
        &self,
        req: &NewLease,
        ctx: &RequestContext,
        until: Instant,
    ) -> Result<Option<(Place, bool)>> {
        let key = &req.key;
        let mut listening = self.inner.listening.subscribe();
        let mut stopping = self.inner.stopping.subscribe();
        let heard = tokio::select! {
            on = tokio::time::timeout_at(until, listening.wait_for(|on| *on)) => {
                on.is_ok_and(|on| on.is_ok())
            }
            _ = stopping.wait_for(|on| *on) => false,
        };
        if !heard {
            tracing::warn!(
                %key,
                "this instance does not hear wake-ups from the database; the waiting acquire tries once"
            );
        }
        // The request's bound counts from here, not from its arrival.
        restart_deadline();
        let instance = self.inner.instance.load(Ordering::Relaxed);
        let principal = ctx.principal.clone().unwrap_or_default();
        let idem = ctx.idempotency.as_ref().map(|i| i.key.as_str().to_owned());
        let mut unblocked = false;
        let queued = loop {
            let queued = self
                .inner
                .enqueues
                .answer(Enqueue {
                    key: key.clone(),
                    instance,
                    principal: principal.clone(),
                    idem: idem.clone(),
                    owner: req.owner.as_str().to_owned(),
                })
                .await;
            match (queued, &idem) {
                (Ok(Queued { id: None }), Some(idem)) if !unblocked => {
                    // The place that holds the key may be one no request holds any more (of a
                    // dead instance, or left behind here): freed, the key is tried once more.
                    unblocked = true;
                    match self.inner.unblock(&principal, idem, instance).await {
                        Ok(0) => return Ok(None),
                        Ok(_) => continue,
                        Err(e) => break Err(e),
                    }
                }
                (Ok(Queued { id: None }), _) => return Ok(None),
                (Ok(Queued { id: Some(id) }), _) => break Ok(id),
                (Err(e), _) => break Err(e),
            }
        };
        let id = match queued {
            Ok(id) => id,
            Err(e) => {
                // The place may have been taken with its answer lost: the sweep takes it out.
                self.inner.left_behind();
                // No lease was changed whatever became of the place.
                return Err(match e {
                    StoreError::Indeterminate(e) => StoreError::Unavailable(e),
                    other => other,
                });
            }
        };
        let notify = Arc::new(Notify::new());
        self.inner
            .queues
            .lock()
            .expect("never poisoned")
            .entry(key.as_str().to_owned())
            .or_default()
            .insert(id, notify.clone());
        let keyed = idem.map(|idem| (principal, idem));
        if let Some(k) = &keyed {
            *self
                .inner
                .keyed
                .lock()
                .expect("never poisoned")
                .entry(k.clone())
                .or_default() += 1;
        }
        let place = Place {
            inner: self.inner.clone(),
            key: key.as_str().to_owned(),
            id,
            notify,
            left: false,
            keyed,
        };
        Ok(Some((place, heard)))
    }

    /// Sleeps until `place` should try again (true) or its wait is over (false): woken by the
    /// database or by the waiter before it here, or, for the first waiter here, until the
    /// holder's lease expires by the database clock.
    async fn sleep(&self, place: &Place, answer: &AcquireAnswer, until: Instant) -> bool {
        let expiry = answer
            .held_for()
            .filter(|_| self.inner.first_here(place))
            // A millisecond past expires_at, so that the try finds it passed: the statement
            // compares with its own now(), which is later than the answer's clock.
            .map(|left| Instant::now() + left + Duration::from_millis(1));
        let mut stopping = self.inner.stopping.subscribe();
        tokio::select! {
            () = place.notify.notified() => true,
            () = sleep_until_some(expiry) => true,
            () = tokio::time::sleep_until(until) => false,
            _ = stopping.wait_for(|on| *on) => false,
        }
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
