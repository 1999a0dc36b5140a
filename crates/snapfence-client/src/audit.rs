//! The audit log and the health checks.

use snapfence_types::{Health, Page, Recovery, RecoveryReason, RefusalReason, Rejection};

#[cfg(doc)]
use crate::Error;
use crate::{AuditFilter, Client, Result};

impl Client {
    /// `GET /v1/audit/rejections`: refused fenced writes, newest first.
    pub async fn rejections(&self, filter: &AuditFilter<RefusalReason>) -> Result<Page<Rejection>> {
        self.get_json("/v1/audit/rejections", |r| r.query(filter))
            .await
    }

    /// `GET /v1/audit/recoveries`: replaced recovery records, newest first.
    pub async fn recoveries(&self, filter: &AuditFilter<RecoveryReason>) -> Result<Page<Recovery>> {
        self.get_json("/v1/audit/recoveries", |r| r.query(filter))
            .await
    }

    /// `GET /healthz`: the process is up.
    pub async fn healthz(&self) -> Result<Health> {
        self.get_json("/healthz", |r| r).await
    }

    /// `GET /readyz`: the database answers and is migrated; [`Error::Unavailable`] otherwise.
    pub async fn readyz(&self) -> Result<Health> {
        self.get_json("/readyz", |r| r).await
    }
}
