//! This instance's side of the queues: the places its requests hold, and whom to wake.

use std::sync::Arc;

use tokio::sync::Notify;

use super::Inner;
use super::leave::Leave;
use crate::domain::Key;
use crate::store::{Bounded, Result};

impl Inner {
    pub(super) fn take_passed_over(&self, id: i64) -> bool {
        self.passed_over.lock().expect("never poisoned").remove(&id)
    }

    pub(super) fn passed_over(&self, ids: Vec<i64>) {
        if ids.is_empty() {
            return;
        }
        tracing::warn!(
            waiters = ids.len(),
            "waiters of this instance were passed over while it did not answer (frozen past --waiter-stall-bound); each tries once more"
        );
        let queues = self.queues.lock().expect("never poisoned");
        let mut passed = self.passed_over.lock().expect("never poisoned");
        for id in ids {
            if let Some(notify) = queues.values().find_map(|q| q.get(&id)) {
                passed.insert(id);
                notify.notify_one();
            }
        }
    }

    pub(super) fn held(&self) -> Vec<i64> {
        let queues = self.queues.lock().expect("never poisoned");
        queues.values().flat_map(|q| q.keys().copied()).collect()
    }

    pub(super) async fn unblock(&self, principal: &str, idem: &str, instance: i32) -> Result<u64> {
        let held = self.held();
        Ok(sqlx::query(include_str!("../sql/wait_unblock.sql"))
            .bind(principal)
            .bind(idem)
            .bind(instance)
            .bind(&held)
            .execute(&self.pool)
            .bounded(&self.pool)
            .await?
            .rows_affected())
    }

    pub(super) fn first_here(&self, place: &Place) -> bool {
        let queues = self.queues.lock().expect("never poisoned");
        queues
            .get(place.key.as_str())
            .and_then(|q| q.keys().next())
            .is_some_and(|&first| first == place.id)
    }

    pub(super) fn wake(&self, key: &str) {
        let queues = self.queues.lock().expect("never poisoned");
        if let Some(first) = queues.get(key).and_then(|q| q.values().next()) {
            first.notify_one();
        }
    }

    pub(super) fn wake_all(&self) {
        let queues = self.queues.lock().expect("never poisoned");
        for first in queues.values().filter_map(|q| q.values().next()) {
            first.notify_one();
        }
    }
}

/// A waiter's place; dropped with its request, it leaves the queue and wakes the next waiter here.
pub(super) struct Place {
    pub inner: Arc<Inner>,
    pub key: Key,
    pub id: i64,
    pub notify: Arc<Notify>,
    /// Whether the statement that answered it took its row out already.
    pub left: bool,
    /// Its (principal, Idempotency-Key), when it sent one.
    pub keyed: Option<(String, String)>,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.inner.take_passed_over(self.id);
        if let Some(k) = self.keyed.take() {
            let mut keyed = self.inner.keyed.lock().expect("never poisoned");
            if let Some(n) = keyed.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    keyed.remove(&k);
                }
            }
        }
        {
            let mut queues = self.inner.queues.lock().expect("never poisoned");
            if let Some(queue) = queues.get_mut(self.key.as_str()) {
                queue.remove(&self.id);
                match queue.values().next() {
                    Some(next) => next.notify_one(),
                    None => {
                        queues.remove(self.key.as_str());
                    }
                }
            }
        }
        if self.left {
            return;
        }
        let inner = self.inner.clone();
        let leave = Leave {
            key: self.key.clone(),
            id: self.id,
        };
        // Without a runtime (shutting down) the sweep takes the row out.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            // Shutting down: the rows of an instance that is gone are the sweep's, one per waiter
            // is no news.
            if inner.pool.is_closed() {
                return;
            }
            let id = leave.id;
            if let Err(e) = inner.leaves.submit(leave).await {
                tracing::warn!(error = %e, waiter = id, "could not take a waiter out of its queue; the sweep will");
            }
        });
    }
}
