//! The `leases` rows and the changing statements' JSON answers, as statements return them, into
//! domain types.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::FromRow;

use super::{AcquireOutcome, LeaseChange};
use crate::domain::{
    FencingToken, Key, KeyStatus, Lease, LeaseState, Metadata, Owner, RecoveryReason,
    RecoveryRecord, TtlMs,
};

#[derive(Debug, FromRow, Deserialize)]
pub(super) struct LeaseRow {
    pub(super) key: String,
    pub(super) token: i64,
    pub(super) owner: String,
    pub(super) ttl_ms: i64,
    pub(super) metadata: Option<serde_json::Value>,
    pub(super) crash_recovery: bool,
    pub(super) recovery_required: bool,
    pub(super) acquired_at: DateTime<Utc>,
    pub(super) expires_at: DateTime<Utc>,
    pub(super) ended_at: Option<DateTime<Utc>>,
}

#[derive(Debug, FromRow, Deserialize)]
pub(super) struct StatusRow {
    #[sqlx(flatten)]
    #[serde(flatten)]
    pub(super) lease: LeaseRow,
    pub(super) recovery_reason: Option<String>,
    pub(super) state: String,
    #[serde(default)]
    pub(super) kept_owner: Option<String>,
    #[serde(default)]
    pub(super) kept_token: Option<i64>,
    #[serde(default)]
    pub(super) kept_acquired_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(super) kept_ended_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(super) kept_metadata: Option<serde_json::Value>,
    #[serde(default)]
    pub(super) waiters: i64,
}

impl LeaseRow {
    /// Values were checked on the way in: a failing row is a schema bug, said loudly.
    pub(super) fn into_lease(self) -> Lease {
        Lease {
            key: Key::parse(self.key).expect("stored keys are valid"),
            owner: Owner::parse(self.owner).expect("stored owners are valid"),
            token: FencingToken::new(self.token).expect("stored tokens are positive"),
            acquired_at: self.acquired_at,
            expires_at: self.expires_at,
            ttl_ms: TtlMs::from_stored(self.ttl_ms),
            metadata: self.metadata.map(Metadata::from_stored),
            crash_recovery: self.crash_recovery,
            recovery_required: self.recovery_required,
        }
    }

    pub(super) fn recovery_record(&self, reason: &str) -> RecoveryRecord {
        RecoveryRecord {
            owner: Owner::parse(self.owner.clone()).expect("stored owners are valid"),
            token: FencingToken::new(self.token).expect("stored tokens are positive"),
            acquired_at: self.acquired_at,
            ended_at: self.ended_at.unwrap_or(self.expires_at),
            reason: RecoveryReason::parse(reason).expect("lease_recovery_reason's values"),
            metadata: self.metadata.clone().map(Metadata::from_stored),
        }
    }
}

impl StatusRow {
    pub(super) fn recovery_record(&self) -> Option<RecoveryRecord> {
        let reason = self.recovery_reason.as_deref()?;
        let Some(token) = self.kept_token else {
            return Some(self.lease.recovery_record(reason));
        };
        Some(RecoveryRecord {
            owner: Owner::parse(self.kept_owner.clone().expect("a kept record is whole"))
                .expect("stored owners are valid"),
            token: FencingToken::new(token).expect("stored tokens are positive"),
            acquired_at: self.kept_acquired_at.expect("a kept record is whole"),
            ended_at: self.kept_ended_at.expect("a kept record is whole"),
            reason: RecoveryReason::parse(reason).expect("key_recovery_reason's values"),
            metadata: self.kept_metadata.clone().map(Metadata::from_stored),
        })
    }

    pub(super) fn into_status(self) -> KeyStatus {
        let recovery = self.recovery_record();
        let lease = self.lease.into_lease();
        KeyStatus {
            key: lease.key.clone(),
            state: LeaseState::parse(&self.state).expect("lease_state's values"),
            newest_token: lease.token,
            lease,
            recovery,
            waiters: self.waiters,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct AcquireAnswer {
    pub(super) verdict: String,
    pub(super) granted: Option<LeaseRow>,
    /// The key's row as found, when the answer names it.
    pub(super) current: Option<StatusRow>,
    /// False when it lost the race to create the key's row, or a waiter found the key held.
    pub(super) settled: bool,
    /// The database's now(); absent from older remembered answers.
    #[serde(default)]
    pub(super) clock: Option<DateTime<Utc>>,
    #[serde(default)]
    pub(super) keeps: bool,
    #[serde(default)]
    pub(super) waiters: Option<i64>,
}

impl AcquireAnswer {
    /// For a waiter's unsettled answer: how long until the holding lease expires.
    pub(super) fn held_for(&self) -> Option<std::time::Duration> {
        let current = self.current.as_ref()?;
        if self.verdict != "held" || current.state != "held" {
            return None;
        }
        let left = current.lease.expires_at - self.clock?;
        Some(left.to_std().unwrap_or_default())
    }

    pub(super) fn held(&self) -> bool {
        self.verdict == "held"
    }

    pub(super) fn into_outcome(self) -> AcquireOutcome {
        match (self.verdict.as_str(), self.granted, self.current) {
            ("insert" | "grant", Some(lease), current) => {
                let record = current.and_then(|c| c.recovery_record()).map(Box::new);
                let (recovered, kept) = if self.keeps {
                    (None, record)
                } else {
                    (record, None)
                };
                AcquireOutcome::Granted {
                    lease: lease.into_lease(),
                    recovered,
                    kept,
                }
            }
            ("held", _, Some(c)) => AcquireOutcome::Held {
                state: LeaseState::parse(&c.state).expect("lease_state's values"),
                holder: c.lease.into_lease(),
                waiters: self.waiters,
            },
            ("recovery_required", _, Some(c)) => AcquireOutcome::RecoveryRequired {
                recovery: c.recovery_record().expect("a verdict needs a reason"),
            },
            (verdict, ..) => unreachable!("acquire verdict {verdict} without its row"),
        }
    }
}

/// What a renewal or ending did: the lease as changed, or none (not the live lease).
#[derive(Debug, Deserialize)]
pub(crate) struct ChangeAnswer {
    pub(super) lease: Option<LeaseRow>,
}

impl ChangeAnswer {
    pub(super) fn into_change(self) -> LeaseChange {
        self.lease
            .map_or(LeaseChange::Lost, |r| LeaseChange::Done(r.into_lease()))
    }
}
