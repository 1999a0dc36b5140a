//! The JSON bodies of requests and answers that are not records of their own: acquire and
//! renew requests, grants, pages, the holder of a `lease_held` answer, health.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    Cursor, FencingToken, Lease, Metadata, Owner, PageLimit, RecoveryRecord, rfc3339_millis,
};

/// The body of an acquire. `AcquireRequest::new(owner, ttl)` asks for a plain lease; the
/// setters add the contract's options. The server reads it with unknown fields refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// The would-be holder.
    pub owner: Owner,
    /// The lease's time to live in milliseconds, checked against the server's bounds by the
    /// server (which alone knows them).
    #[serde(deserialize_with = "super::json_integer")]
    pub ttl_ms: i64,
    /// Kept with the lease and shown to anyone who finds the key held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Metadata>,
    /// Whether an expiry (rather than a release) leaves a recovery record.
    #[serde(default)]
    pub crash_recovery: bool,
    /// Whether the caller states that what a previous holder left behind no longer conflicts,
    /// so that a retained recovery record is replaced.
    #[serde(default)]
    pub reconciled: bool,
    /// v1.2: whether the caller reconciles while holding the key: on a key with a retained
    /// recovery record and no live lease the grant keeps the record (and shows it as the grant's
    /// `recovery`) until the holder confirms with `POST /v1/leases/{key}/reconciled`; everyone
    /// else is `lease_held` meanwhile. Exclusive with `reconciled`. Sent only when true, so a
    /// request without it reads (and fingerprints) as before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reconciling: bool,
    /// v1.1: how long to wait in milliseconds (0..=[`MAX_WAIT_MS`], absent or 0: not at all)
    /// while the key is held, in the key's queue, before the answer is `lease_held`. A retained
    /// recovery record is answered at once whatever the wait.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::json_integer_opt"
    )]
    pub wait_ms: Option<i64>,
}

/// The longest wait an acquire may ask for: five minutes.
pub const MAX_WAIT_MS: i64 = 300_000;

/// A duration in whole milliseconds, saturating (the server refuses what is out of its bounds).
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl AcquireRequest {
    /// A plain lease for `owner` lasting `ttl` unless renewed.
    pub fn new(owner: Owner, ttl: Duration) -> Self {
        Self {
            owner,
            ttl_ms: millis(ttl),
            metadata: None,
            crash_recovery: false,
            reconciled: false,
            reconciling: false,
            wait_ms: None,
        }
    }

    /// Waits up to `wait` (whole milliseconds, at most [`MAX_WAIT_MS`]) while the key is held;
    /// zero does not wait.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait_ms = Some(millis(wait)).filter(|&ms| ms > 0);
        self
    }

    /// The wait asked for, checked: `None` for no wait, an error for one out of bounds.
    pub fn checked_wait(&self) -> Result<Option<Duration>, crate::InvalidInput> {
        match self.wait_ms {
            None | Some(0) => Ok(None),
            Some(ms @ 1..=MAX_WAIT_MS) => Ok(Some(Duration::from_millis(ms as u64))),
            Some(ms) => Err(crate::InvalidInput::new(format!(
                "wait_ms must be within 0..={MAX_WAIT_MS}, got {ms}"
            ))),
        }
    }

    /// The lease's time to live (zero for a negative `ttl_ms`, which the server refuses).
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.ttl_ms).unwrap_or(0))
    }

    /// Attaches metadata.
    pub fn metadata(mut self, metadata: Metadata) -> Self {
        self.metadata = Some(metadata);
        self
    }

    /// Asks for a recovery record if the lease expires instead of being released.
    pub fn crash_recovery(mut self, on: bool) -> Self {
        self.crash_recovery = on;
        self
    }

    /// States that a retained recovery record has been dealt with.
    pub fn reconciled(mut self, on: bool) -> Self {
        self.reconciled = on;
        self
    }

    /// v1.2: reconciles while holding the key: a retained recovery record is kept by the grant
    /// until the holder confirms (`Client::reconciled`). Exclusive with
    /// [`reconciled`](Self::reconciled).
    pub fn reconciling(mut self, on: bool) -> Self {
        self.reconciling = on;
        self
    }

    /// Refuses `reconciled` and `reconciling` together, which the contract makes exclusive.
    pub fn checked_reconcile(&self) -> Result<(), crate::InvalidInput> {
        if self.reconciled && self.reconciling {
            return Err(crate::InvalidInput::new(
                "reconciled and reconciling are exclusive: reconciled says the leftovers were dealt with before asking, reconciling keeps the record until the holder confirms",
            ));
        }
        Ok(())
    }
}

/// The body of a renewal. Without `ttl_ms` the lease keeps its TTL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenewRequest {
    /// The token of the lease to renew.
    pub token: FencingToken,
    /// The new TTL in milliseconds, if it changes.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::json_integer_opt"
    )]
    pub ttl_ms: Option<i64>,
}

impl RenewRequest {
    /// Renews the lease of `token`, for `ttl` from now or, without one, for its current TTL.
    pub fn new(token: FencingToken, ttl: Option<Duration>) -> Self {
        Self {
            token,
            ttl_ms: ttl.map(millis),
        }
    }
}

/// A granted lease, and the recovery record it replaced when the acquire was `reconciled`, or
/// the one it keeps when the acquire was `reconciling` (v1.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    /// The new lease.
    #[serde(flatten)]
    pub lease: Lease,
    /// The replaced record, if there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<RecoveryRecord>,
    /// v1.2: the retained record this reconciling lease keeps until its holder confirms with
    /// `POST /v1/leases/{key}/reconciled`, if there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<RecoveryRecord>,
}

/// One page of a list: `{"items": [...], "next_cursor": string-or-null}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Pass it back as the `cursor` of the next request; `None` on the last page.
    pub next_cursor: Option<Cursor>,
}

impl<T> Page<T> {
    /// Builds a page from `limit + 1` fetched rows: the extra row only says that there is more.
    pub fn from_rows(mut items: Vec<T>, limit: PageLimit, position: impl Fn(&T) -> Cursor) -> Self {
        let more = items.len() as i64 > limit.get();
        items.truncate(limit.get() as usize);
        let next_cursor = if more {
            items.last().map(position)
        } else {
            None
        };
        Self { items, next_cursor }
    }
}

/// The answer of `/healthz` and `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok` or `ready`.
    pub status: String,
}

/// The `holder` of a `lease_held` answer: who holds the key and until when. The holder's token
/// is not shown, so a competitor cannot borrow it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// The holder's owner name.
    pub owner: String,
    /// When the live lease was granted.
    #[serde(with = "rfc3339_millis")]
    pub acquired_at: DateTime<Utc>,
    /// When it expires unless renewed.
    #[serde(with = "rfc3339_millis")]
    pub expires_at: DateTime<Utc>,
    /// Its metadata.
    pub metadata: Option<serde_json::Value>,
}

impl From<&Lease> for Holder {
    fn from(l: &Lease) -> Self {
        Self {
            owner: l.owner.as_str().to_owned(),
            acquired_at: l.acquired_at,
            expires_at: l.expires_at,
            metadata: l.metadata.as_ref().map(|m| m.as_json().clone()),
        }
    }
}
