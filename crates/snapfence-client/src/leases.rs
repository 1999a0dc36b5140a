//! The lease calls: acquire, renew, release, abandon, require-recovery, reconciled, status and
//! list.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use snapfence_types::headers::FENCING_TOKEN;
use snapfence_types::{
    AcquireRequest, FencingToken, Grant, Key, KeyStatus, Lease, Page, RenewRequest, Waiter,
};

#[cfg(doc)]
use crate::Error;
use crate::retry::CallKind;
use crate::transport::{Call, segment};
use crate::{Client, LeaseFilter, PageRequest, Result};

impl Client {
    /// `POST /v1/leases/{key}`: acquire. Without a wait ([`AcquireRequest::wait`]) a live
    /// lease of anyone answers [`Error::LeaseHeld`] at once; with one, the server queues the
    /// call behind the key's earlier waiters and answers once the key is granted to it, or
    /// [`Error::LeaseHeld`] once the wait has passed (each attempt is then bounded by the
    /// client's timeout plus the wait). A retained recovery record answers
    /// [`Error::RecoveryRequired`] at once either way.
    pub async fn acquire(&self, key: &Key, request: &AcquireRequest) -> Result<Grant> {
        let path = format!("/v1/leases/{}", segment(key)?);
        let wait = Duration::from_millis(request.wait_ms.unwrap_or(0).max(0) as u64);
        let timeout = self.timeout + wait;
        self.send_json(
            CallKind::Change,
            Call {
                method: Method::POST,
                path: &path,
            },
            &[StatusCode::CREATED],
            |r| r.json(request).timeout(timeout),
        )
        .await
    }

    /// `POST /v1/leases/{key}/renew`: extends the live lease of `token` by `ttl`, or by its own
    /// TTL when `None`. [`Error::LeaseLost`] when the token is not the key's live lease.
    pub async fn renew(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Option<Duration>,
    ) -> Result<Lease> {
        let body = RenewRequest::new(token, ttl);
        let path = format!("/v1/leases/{}/renew", segment(key)?);
        self.send_json(
            CallKind::Change,
            Call {
                method: Method::POST,
                path: &path,
            },
            &[StatusCode::OK],
            |r| r.json(&body),
        )
        .await
    }

    /// A fenced call on a lease that answers `204`.
    async fn end(&self, method: Method, path: String, token: FencingToken) -> Result<()> {
        self.send(
            CallKind::Change,
            Call {
                method,
                path: &path,
            },
            &[StatusCode::NO_CONTENT],
            |r| r.header(FENCING_TOKEN, token.get()),
        )
        .await
        .map(drop)
    }

    /// `DELETE /v1/leases/{key}`: release; the key is free at once, unless require-recovery
    /// marked the lease.
    pub async fn release(&self, key: &Key, token: FencingToken) -> Result<()> {
        let path = format!("/v1/leases/{}", segment(key)?);
        self.end(Method::DELETE, path, token).await
    }

    /// `POST /v1/leases/{key}/abandon`: unlock, but keep a recovery record.
    pub async fn abandon(&self, key: &Key, token: FencingToken) -> Result<()> {
        let path = format!("/v1/leases/{}/abandon", segment(key)?);
        self.end(Method::POST, path, token).await
    }

    /// `POST /v1/leases/{key}/require-recovery`: mark cleanup incomplete while still holding;
    /// the lease's later release or expiry leaves a recovery record.
    pub async fn require_recovery(&self, key: &Key, token: FencingToken) -> Result<()> {
        let path = format!("/v1/leases/{}/require-recovery", segment(key)?);
        self.end(Method::POST, path, token).await
    }

    /// v1.2, `POST /v1/leases/{key}/reconciled`: the holder of `token`, a lease acquired with
    /// [`AcquireRequest::reconciling`], says the leftovers of the recovery record its grant kept
    /// ([`Grant::recovery`]) no longer conflict: the record moves to the audit log and the lease
    /// goes on (returned as it is). A lease that keeps no record (the key had none when it was
    /// granted, or it confirmed already) is returned unchanged. [`Error::LeaseLost`] when the
    /// token is not the key's live lease: the record then stays as it was.
    pub async fn reconciled(&self, key: &Key, token: FencingToken) -> Result<Lease> {
        let path = format!("/v1/leases/{}/reconciled", segment(key)?);
        self.send_json(
            CallKind::Change,
            Call {
                method: Method::POST,
                path: &path,
            },
            &[StatusCode::OK],
            |r| r.header(FENCING_TOKEN, token.get()),
        )
        .await
    }

    /// `GET /v1/leases/{key}`: the key's state, newest lease and recovery record.
    /// [`Error::NotFound`] for a key never leased.
    pub async fn lease_status(&self, key: &Key) -> Result<KeyStatus> {
        let path = format!("/v1/leases/{}", segment(key)?);
        self.get_json(&path, |r| r).await
    }

    /// `GET /v1/leases`: one page of keys, in key order.
    pub async fn list_leases(&self, filter: &LeaseFilter) -> Result<Page<KeyStatus>> {
        self.get_json("/v1/leases", |r| r.query(filter)).await
    }

    /// `GET /v1/leases/{key}/waiters` (beyond the contract): one page of the key's queue of
    /// waiting acquires, first to be granted first; empty when no one waits.
    pub async fn lease_waiters(&self, key: &Key, page: &PageRequest) -> Result<Page<Waiter>> {
        let path = format!("/v1/leases/{}/waiters", segment(key)?);
        self.get_json(&path, |r| r.query(page)).await
    }
}
