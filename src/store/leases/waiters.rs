//! Waiting acquires (contract v1.1): a request with `wait_ms` that finds the key held takes a place
//! in the key's queue (`lease_waiters`) and sleeps here, holding no connection, until woken. The
//! acquire statement grants a free key only to its first live waiter, so the queue is the grant
//! order across instances. Releases notify `snapfence_waiters`; an expiry needs none, as the first
//! waiter sleeps until `expires_at`. The listening connection holds an advisory lock named by the
//! instance id, and waiters of instances whose lock is free (dead) are skipped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

mod enqueue;
mod leave;
mod place;
mod tasks;

use super::{AcquireAnswer, AcquireBatch, AcquireJob, AcquireOutcome, NewLease};
use crate::store::engine::batch::Batcher;
use crate::store::idempotency::{self, Gated};
use crate::store::{Engine, RequestContext, Result, StoreError, Tasks, restart_deadline};
pub(crate) use enqueue::ENQUEUE;
use enqueue::{Enqueue, EnqueueBatch, Queued};
pub(crate) use leave::LEAVE;
use leave::LeaveBatch;
use place::Place;
use tasks::{Wakeups, sweep};

const CHANNEL: &str = "snapfence_waiters";
/// Twice within the contract's second.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

/// This instance's waiting acquires. Cheap to clone; its tasks stop with the last clone.
#[derive(Debug, Clone)]
pub struct Waiters {
    inner: Arc<Inner>,
    _tasks: Arc<Tasks>,
}

struct Inner {
    /// This instance's id, the name of its liveness lock (0 until it first listens).
    instance: Arc<AtomicI32>,
    queues: Mutex<HashMap<String, BTreeMap<i64, Arc<Notify>>>>,
    listening: watch::Sender<bool>,
    stopping: watch::Sender<bool>,
    tries: Batcher<AcquireBatch>,
    enqueues: Batcher<EnqueueBatch>,
    leaves: Batcher<LeaveBatch>,
    pool: PgPool,
    stall_bound: Duration,
    /// Waiters passed over while this instance was frozen: each makes one last try.
    passed_over: Mutex<HashSet<i64>>,
    /// The (principal, Idempotency-Key) of waiters that sent one, for [`Waiters::holds`].
    keyed: Mutex<HashMap<(String, String), usize>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiters")
            .field("instance", &self.instance.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A flood of waiters runs one batch of each of its kinds at a time: their statements then never
/// take every core and connection from the other requests' (measured in docs/operations.md).
const WAITERS_IN_FLIGHT: usize = 1;

impl Waiters {
    /// Starts listening for wake-ups under a fresh instance id; needs a Tokio runtime.
    pub fn start(db: &impl AsRef<Engine>, stall_bound: Duration) -> Self {
        let db: &Engine = db.as_ref();
        let pool: PgPool = (**db).clone();
        let inner = Arc::new(Inner {
            instance: db.hub().instance(),
            queues: Mutex::default(),
            listening: watch::Sender::new(false),
            stopping: watch::Sender::new(false),
            tries: Batcher::start_with(db.conns().clone(), WAITERS_IN_FLIGHT),
            enqueues: Batcher::start_with(db.conns().clone(), WAITERS_IN_FLIGHT),
            leaves: Batcher::start_with(db.conns().clone(), WAITERS_IN_FLIGHT),
            pool,
            stall_bound,
            passed_over: Mutex::default(),
            keyed: Mutex::default(),
        });
        db.hub()
            .subscribe(Arc::new(Wakeups(Arc::downgrade(&inner))));
        let tasks = vec![tokio::spawn(sweep(Arc::downgrade(&inner)))];
        Self {
            inner,
            _tasks: Arc::new(Tasks(tasks)),
        }
    }

    /// Ends every wait, now and from now on, each with a last try: for shutdown.
    pub fn stop(&self) {
        self.inner.stopping.send_replace(true);
    }

    /// Whether a waiter here holds `ctx`'s Idempotency-Key: the request is then still running.
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

    /// How many requests wait in a queue here, for the metrics.
    pub fn waiting(&self) -> usize {
        let queues = self.inner.queues.lock().expect("never poisoned");
        queues.values().map(BTreeMap::len).sum()
    }

    /// Acquires `req`, waiting up to `wait` in the key's queue; the database bound counts per try.
    #[tracing::instrument(level = "debug", skip_all, fields(key = %req.key))]
    pub async fn acquire(
        &self,
        req: &NewLease,
        ctx: &RequestContext,
        wait: Duration,
    ) -> Result<Gated<AcquireOutcome>> {
        let until = Instant::now() + wait;
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
                    // Its place is gone: one last try.
                    if self.inner.take_passed_over(place.id) {
                        last_try = true;
                    }
                }
                Gated::Ran(answer) if !answer.settled => {}
                gated => {
                    place.left = true;
                    return Ok(gated.map(AcquireAnswer::into_outcome));
                }
            }
        }
    }

    /// Takes a place at the end of the key's queue once this instance listens, so no release goes
    /// unheard.
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
                    // The holding place belongs to no request: freed, so try again.
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
            key: key.clone(),
            id,
            notify,
            left: false,
            keyed,
        };
        Ok(Some((place, heard)))
    }

    /// Sleeps until `place` should try again (true) or its wait is over (false).
    async fn sleep(&self, place: &Place, answer: &AcquireAnswer, until: Instant) -> bool {
        let expiry = answer
            .held_for()
            .filter(|_| self.inner.first_here(place))
            // A millisecond past `expires_at`, as the statement compares with its own later now().
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

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
