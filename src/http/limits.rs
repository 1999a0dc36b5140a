//! Per API key, requests in flight and their rate; for all requests, the bytes of bodies being
//! received. Each is decided before anything is read, so no refusal changes anything; limits are
//! per instance.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::{ApiError, Throttled, Unavailability};
use crate::rules::{RateLimit, Rules};

/// The limits of one instance, from its rules.
#[derive(Debug)]
pub struct Limits {
    max_in_flight: usize,
    in_flight: Mutex<HashMap<String, usize>>,
    rate: Option<(RateLimit, DefaultKeyedRateLimiter<String>)>,
    bodies: Arc<BodyBudget>,
    max_watches_per_key: usize,
    max_watches: usize,
    watches: Mutex<(HashMap<String, usize>, usize)>,
    max_waiters_per_key: usize,
    max_waiters: usize,
    waiters: Mutex<(HashMap<String, usize>, usize)>,
}

impl Limits {
    /// The limits `rules` sets; a rate that is not positive and finite limits nothing.
    pub fn new(rules: &Rules) -> Self {
        let rate = rules.rate_limit_per_key.and_then(|rate| {
            let period = Duration::try_from_secs_f64(rate.per_second.recip()).ok()?;
            let quota = Quota::with_period(period)?.allow_burst(rate.burst);
            Some((rate, DefaultKeyedRateLimiter::keyed(quota)))
        });
        Self {
            max_in_flight: rules.max_in_flight_per_key,
            in_flight: Mutex::default(),
            rate,
            bodies: Arc::new(BodyBudget {
                limit: rules.max_body_bytes_in_flight,
                held: AtomicUsize::new(0),
            }),
            max_watches_per_key: rules.max_watches_per_key,
            max_watches: rules.max_watches,
            watches: Mutex::default(),
            max_waiters_per_key: rules.max_waiters_per_key,
            max_waiters: rules.max_waiters,
            waiters: Mutex::default(),
        }
    }

    /// Admits a watch stream unless its key or the instance is at its most; it counts as in flight.
    pub fn admit_watch(self: &Arc<Self>, key: Option<&str>) -> Result<WatchAdmission, Throttled> {
        let mut watches = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        let (by_key, total) = &mut *watches;
        if *total >= self.max_watches {
            return Err(Throttled::InstanceWatches {
                limit: self.max_watches,
            });
        }
        if let Some(key) = key {
            let open = by_key.entry(key.to_owned()).or_insert(0);
            if *open >= self.max_watches_per_key {
                return Err(Throttled::Watches {
                    key: key.to_owned(),
                    limit: self.max_watches_per_key,
                });
            }
            *open += 1;
        }
        *total += 1;
        Ok(WatchAdmission {
            limits: Arc::clone(self),
            key: key.map(str::to_owned),
        })
    }

    /// Admits a waiting acquire of `key` unless the key or the instance has its most waiters.
    pub fn admit_waiter(self: &Arc<Self>, key: &str) -> Result<WaiterAdmission, Throttled> {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let (by_key, total) = &mut *waiters;
        if *total >= self.max_waiters {
            return Err(Throttled::InstanceWaiters {
                limit: self.max_waiters,
            });
        }
        let waiting = by_key.entry(key.to_owned()).or_insert(0);
        if *waiting >= self.max_waiters_per_key {
            return Err(Throttled::Waiters {
                key: key.to_owned(),
                limit: self.max_waiters_per_key,
            });
        }
        *waiting += 1;
        *total += 1;
        Ok(WaiterAdmission {
            limits: Arc::clone(self),
            key: key.to_owned(),
        })
    }

    /// The watch streams open on this instance, for the metrics and the tests.
    pub fn watches(&self) -> usize {
        self.watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .1
    }

    /// Admits a request unless its key is at its most in flight or over its rate; never queues.
    pub fn admit(self: &Arc<Self>, key: &str) -> Result<Admission, Throttled> {
        {
            let mut in_flight = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match in_flight.get_mut(key) {
                Some(n) if *n >= self.max_in_flight => {
                    return Err(Throttled::InFlight {
                        key: key.to_owned(),
                        limit: self.max_in_flight,
                    });
                }
                Some(n) => *n += 1,
                None => {
                    in_flight.insert(key.to_owned(), 1);
                }
            }
        }
        let admission = Admission {
            limits: Arc::clone(self),
            key: key.to_owned(),
        };
        if let Some((rate, limiter)) = &self.rate {
            if let Err(not_until) = limiter.check_key(&admission.key) {
                let wait = not_until.wait_time_from(limiter.clock().now());
                return Err(Throttled::Rate {
                    key: admission.key.clone(),
                    per_second: rate.per_second,
                    burst: rate.burst.get(),
                    retry_after: whole_seconds(wait),
                });
            }
        }
        Ok(admission)
    }

    /// The budget of the bodies being received.
    pub fn bodies(&self) -> &Arc<BodyBudget> {
        &self.bodies
    }
}

/// An open watch stream; it counts against its key's and the instance's streams until dropped.
#[derive(Debug)]
pub struct WatchAdmission {
    limits: Arc<Limits>,
    key: Option<String>,
}

impl Drop for WatchAdmission {
    fn drop(&mut self) {
        let mut watches = self
            .limits
            .watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (by_key, total) = &mut *watches;
        *total -= 1;
        if let Some(key) = &self.key {
            if let Some(n) = by_key.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    by_key.remove(key);
                }
            }
        }
    }
}

/// A waiting acquire; it counts against its key's and the instance's waiters until dropped.
#[derive(Debug)]
pub struct WaiterAdmission {
    limits: Arc<Limits>,
    key: String,
}

impl Drop for WaiterAdmission {
    fn drop(&mut self) {
        let mut waiters = self
            .limits
            .waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (by_key, total) = &mut *waiters;
        *total -= 1;
        if let Some(n) = by_key.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                by_key.remove(&self.key);
            }
        }
    }
}

/// A request's [`Admission`], kept by a handler whose answer outlives it (a watch).
#[derive(Debug, Clone)]
pub struct HeldAdmission(Arc<Mutex<Option<Admission>>>);

impl HeldAdmission {
    /// Holds `admission`.
    pub fn new(admission: Admission) -> Self {
        Self(Arc::new(Mutex::new(Some(admission))))
    }

    /// Takes the admission out, to keep it beyond the handler.
    pub fn take(&self) -> Option<Admission> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Sheds a request at once with `503` while the instance serves `--max-concurrent-requests`;
/// else it holds a place ([`Serving`]) until answered, or until it becomes a waiter.
pub async fn shed(serving: Arc<Semaphore>, mut req: Request, next: Next) -> Response {
    let Ok(permit) = serving.try_acquire_owned() else {
        return ApiError::Unavailable(Unavailability::Overloaded).into_response();
    };
    let held = Serving(Arc::new(Mutex::new(Some(permit))));
    req.extensions_mut().insert(held.clone());
    let response = next.run(req).await;
    drop(held);
    response
}

/// A request's place among those the instance serves at once. A waiting acquire gives it back
/// while it waits: waiters have bounds of their own, so they never keep other requests out.
#[derive(Debug, Clone)]
pub struct Serving(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl Serving {
    /// Gives the place back.
    pub fn leave(&self) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// `Retry-After` in whole seconds rounded up, at least one: 0 invites a refused retry.
fn whole_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// A request of an API key in flight; it counts against its key until dropped.
#[derive(Debug)]
pub struct Admission {
    limits: Arc<Limits>,
    key: String,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut in_flight = self
            .limits
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = in_flight.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.key);
            }
        }
    }
}

/// Body bytes one instance may hold, charged before they are read, so an over-budget body takes no
/// memory.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    held: AtomicUsize,
}

impl BodyBudget {
    /// The budget in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A charge of no bytes yet, for one body.
    pub fn charge(self: &Arc<Self>) -> Charge {
        Charge {
            budget: Arc::clone(self),
            bytes: 0,
        }
    }

    fn take(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }
}

/// The bytes one body holds of a [`BodyBudget`], given back when this is dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Charge {
    /// Grows the charge to `total` bytes; `false`, unchanged, if that would pass the budget.
    pub fn cover(&mut self, total: usize) -> bool {
        if total <= self.bytes {
            return true;
        }
        let taken = self.budget.take(total - self.bytes);
        if taken {
            self.bytes = total;
        }
        taken
    }

    /// `body`, holding this charge until its last clone drops.
    pub fn hold(self, body: Bytes) -> Bytes {
        Bytes::from_owner(Held {
            body,
            _charge: self,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

struct Held {
    body: Bytes,
    _charge: Charge,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    fn limits(rules: Rules) -> Arc<Limits> {
        Arc::new(Limits::new(&rules))
    }

    #[test]
    fn a_key_at_its_cap_is_refused_and_admitted_again_once_one_ends() {
        let limits = limits(Rules {
            max_in_flight_per_key: 2,
            ..Rules::default()
        });
        let first = limits.admit("a").unwrap();
        let _second = limits.admit("a").unwrap();
        assert!(matches!(
            limits.admit("a"),
            Err(Throttled::InFlight { limit: 2, .. })
        ));
        assert!(
            limits.admit("b").is_ok(),
            "another key has a cap of its own"
        );
        drop(first);
        assert!(limits.admit("a").is_ok());
    }

    #[test]
    fn waiters_are_bounded_per_key_and_per_instance_and_leave_no_entry_behind() {
        let limits = limits(Rules {
            max_waiters_per_key: 2,
            max_waiters: 3,
            ..Rules::default()
        });
        let a1 = limits.admit_waiter("a").unwrap();
        let _a2 = limits.admit_waiter("a").unwrap();
        assert!(matches!(
            limits.admit_waiter("a"),
            Err(Throttled::Waiters { limit: 2, .. })
        ));
        let b1 = limits.admit_waiter("b").unwrap();
        assert!(matches!(
            limits.admit_waiter("c"),
            Err(Throttled::InstanceWaiters { limit: 3 })
        ));
        drop(a1);
        drop(b1);
        assert!(limits.admit_waiter("c").is_ok());
        assert_eq!(
            limits.waiters.lock().unwrap().0.len(),
            1,
            "only a's entry is left"
        );
    }

    #[test]
    fn a_key_with_nothing_in_flight_leaves_no_entry_behind() {
        let limits = limits(Rules::default());
        drop(limits.admit("a").unwrap());
        assert!(limits.in_flight.lock().unwrap().is_empty());
    }

    #[test]
    fn a_key_over_its_rate_is_told_when_its_next_request_may_come() {
        let limits = limits(Rules {
            rate_limit_per_key: Some(RateLimit {
                per_second: 0.1,
                burst: NonZeroU32::new(2).unwrap(),
            }),
            ..Rules::default()
        });
        let _burst = [limits.admit("a").unwrap(), limits.admit("a").unwrap()];
        match limits.admit("a") {
            Err(Throttled::Rate { retry_after, .. }) => {
                assert!((9..=10).contains(&retry_after), "{retry_after}");
            }
            other => panic!("not refused by the rate: {other:?}"),
        }
        assert_eq!(
            limits.in_flight.lock().unwrap()["a"],
            2,
            "a refused request is not in flight"
        );
    }

    #[test]
    fn watch_streams_are_bounded_per_key_and_per_instance() {
        let limits = limits(Rules {
            max_watches_per_key: 2,
            max_watches: 3,
            ..Rules::default()
        });
        let a1 = limits.admit_watch(Some("a")).unwrap();
        let _a2 = limits.admit_watch(Some("a")).unwrap();
        assert!(matches!(
            limits.admit_watch(Some("a")),
            Err(Throttled::Watches { limit: 2, .. })
        ));
        let _anonymous = limits.admit_watch(None).unwrap();
        assert!(matches!(
            limits.admit_watch(Some("b")),
            Err(Throttled::InstanceWatches { limit: 3 })
        ));
        drop(a1);
        let _b = limits.admit_watch(Some("b")).unwrap();
        assert_eq!(limits.watches(), 3);
        assert!(limits.watches.lock().unwrap().0.get("a") == Some(&1));
    }

    #[test]
    fn retry_after_rounds_up_to_a_whole_second_and_is_never_zero() {
        assert_eq!(whole_seconds(Duration::ZERO), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(whole_seconds(Duration::from_secs(3)), 3);
    }

    #[test]
    fn a_body_holds_its_charge_until_its_last_clone_is_dropped() {
        let limits = limits(Rules {
            max_body_bytes_in_flight: 10,
            ..Rules::default()
        });
        let budget = limits.bodies();
        let mut charge = budget.charge();
        assert!(charge.cover(6));
        let mut other = budget.charge();
        assert!(!other.cover(5), "6 + 5 would pass 10");
        assert!(other.cover(4));
        drop(other);
        let body = charge.hold(Bytes::from_static(b"abcdef"));
        let clone = body.slice(1..3);
        drop(body);
        assert!(!budget.charge().cover(5), "a clone still holds the charge");
        drop(clone);
        assert!(budget.charge().cover(10));
    }
}
