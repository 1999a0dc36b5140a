//! A typed client of the HTTP contract (`docs/api.md`): [`Client`] has one method per
//! endpoint, [`Error`] one variant per contract code, and [`LeaseKeeper`] holds a lease for as
//! long as a piece of work runs.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use snapfence_client::{AcquireRequest, Client, PutOptions};
//! use snapfence_client::{Key, Owner};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7878")?;
//! let key = Key::parse("jobs/42")?;
//! let grant = client
//!     .acquire(&key, &AcquireRequest::new(Owner::parse("worker-7")?, Duration::from_secs(30)))
//!     .await?;
//! let written = client
//!     .put_snapshot(&key, grant.lease.token, "state v1", &PutOptions::default())
//!     .await?;
//! println!("stored version {} as {}", written.meta.version, written.meta.etag);
//! client.release(&key, grant.lease.token).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # A lease fences its namespace
//!
//! A lease on `runs/7` fences every key under `runs/7/` (contract v1.3): name it as the write's
//! [`PutOptions::fence`], or write many keys at once, all or nothing, with [`Client::txn`]. A
//! superseded holder's write is [`Error::StaleToken`], audited, and changes nothing:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use snapfence_client::{AcquireRequest, Client, Key, Owner, PutOptions, TxnOp};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7878")?;
//! let run = Key::parse("runs/7")?;
//! let grant = client
//!     .acquire(&run, &AcquireRequest::new(Owner::parse("worker-7")?, Duration::from_secs(30)))
//!     .await?;
//! let under_run = PutOptions {
//!     fence: Some(run.clone()),
//!     ..PutOptions::default()
//! };
//! let step = Key::parse("runs/7/step/0001")?;
//! client.put_snapshot(&step, grant.lease.token, "state", &under_run).await?;
//! let ops = [
//!     TxnOp::put(Key::parse("runs/7/step/0002")?, "state 2"),
//!     TxnOp::put(Key::parse("runs/7/writes/0002/a")?, "pending write"),
//! ];
//! let committed = client.txn(&run, grant.lease.token, &ops).await?;
//! println!("{} ops committed under {}", committed.results.len(), committed.fencing_key);
//! # Ok(())
//! # }
//! ```
//!
//! # Watching changes
//!
//! [`Client::watch`] follows the changes to keys (grants, releases, expiries, writes,
//! refusals…) as the server numbers them, and resumes by itself, without a gap or a duplicate,
//! when its connection ends or breaks:
//!
//! ```no_run
//! use snapfence_client::{ChangeId, ChangeKind, Client, Error, KeyPrefix, WatchOptions};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7878")?;
//! let options = WatchOptions::new()
//!     .prefix(KeyPrefix::parse("jobs/")?)
//!     .since(ChangeId::ORIGIN);
//! let mut watch = client.watch(&options);
//! while let Some(change) = watch.next().await {
//!     match change {
//!         Ok(change) if change.event == ChangeKind::SnapshotWritten => {
//!             println!("{} now at version {:?}", change.data.key, change.data.version);
//!         }
//!         Ok(_) => {}
//!         // The history since `since` is gone: read the state again, then watch from now.
//!         Err(Error::Compacted { .. }) => break,
//!         Err(e) => return Err(e.into()),
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Timeouts and retries
//!
//! Every attempt is bounded by [`ClientBuilder::timeout`] (connecting by
//! [`ClientBuilder::connect_timeout`]), except a watch's, which never ends by itself: each of its
//! reads is bounded instead, by [`ClientBuilder::watch_idle_timeout`]. A failed attempt is retried, with exponential backoff and
//! jitter, up to [`RetryPolicy::max_attempts`], whenever the same call may succeed later: nothing
//! reached the server, `503 unavailable` or `indeterminate`, another 5xx, a broken connection or
//! a timeout, an unreadable answer; and, for a change, `409 request_in_progress` (an earlier
//! attempt is still running on the server).
//!
//! That is safe for the changes too (acquire, renew, release, abandon, require-recovery,
//! reconciled, put, delete, txn): each call is sent with a fresh `Idempotency-Key`, the same on every attempt, and the
//! server (v1.1) does a change at most once per key and answers a retry with what the first
//! attempt did. So a grant or a write whose answer was lost happens exactly once, and its caller
//! still learns the token or the version. [`Error::is_indeterminate`] tells a failure that left
//! the outcome unknown even after the last attempt, and [`Error`] says how to find out.
//!
//! # Passing a trace on
//!
//! A server that exports traces (`OTEL_*` variables, `docs/operations.md`) makes each request's
//! span a child of the caller's W3C `traceparent`. Calls inside [`trace::scope`] send the
//! caller's [`TraceContext`] with every request they make: each attempt and retry, a waiting
//! acquire, and what they start, which keeps it: a [`Watch`]'s reconnections, a
//! [`LeaseKeeper`]'s renewals and its release on drop, an [`Election`]'s keeper and observation.
//! Outside any scope nothing is sent. A malformed `traceparent` is refused by
//! [`TraceContext::parse`] ([`Error::InvalidRequest`]), never sent:
//!
//! ```no_run
//! use snapfence_client::trace::{self, TraceContext};
//! use snapfence_client::{Client, Key};
//!
//! # async fn example(traceparent: &str) -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7878")?;
//! let key = Key::parse("jobs/42")?;
//! // A traceparent that is not valid W3C starts no trace: the call goes without one.
//! let context = TraceContext::parse(traceparent).ok();
//! let status = trace::scope(context, client.lease_status(&key)).await?;
//! println!("{:?}", status.state);
//! # Ok(())
//! # }
//! ```
//!
//! With the `opentelemetry` feature, the current OpenTelemetry context's span is sent when no
//! scope says otherwise ([`TraceContext::current`]).

mod audit;
mod builder;
mod election;
mod error;
mod keeper;
mod leases;
mod retry;
mod snapshots;
pub mod trace;
mod transport;
mod types;
mod watch;

use std::sync::Arc;

pub use self::builder::ClientBuilder;
pub use self::election::{Election, Leader, Leadership, Observe};
pub use self::error::Error;
pub use self::keeper::{KeeperOptions, LeaseKeeper, LostReason};
use self::retry::OnRetry;
pub use self::retry::RetryPolicy;
pub use self::trace::TraceContext;
pub use self::types::{
    AuditFilter, LeaseFilter, PageRequest, PutOptions, Snapshot, SnapshotFilter, SnapshotHead,
    Written,
};
pub use self::watch::{Watch, WatchOptions};
/// The contract's vocabulary, re-exported so that a user of the client needs no second crate.
pub use snapfence_types::*;

/// Result of a client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A client of one snapfence service. Cheap to clone; clones share their connections.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The connections of watches, whose reads are bounded one by one instead of as a whole.
    watch_http: reqwest::Client,
    base: Arc<str>,
    retry: RetryPolicy,
    on_retry: Option<OnRetry>,
    /// Each attempt's bound ([`ClientBuilder::timeout`]); a waiting acquire's attempt has its
    /// wait on top.
    timeout: std::time::Duration,
}

impl Client {
    /// A client of the service at `base` (e.g. `http://127.0.0.1:7878`) with the default
    /// timeouts and retries.
    pub fn new(base: impl Into<String>) -> Result<Self> {
        Self::builder(base).build()
    }

    /// The service's base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The same client with another retry policy, sharing its connections.
    pub fn with_retry(&self, retry: RetryPolicy) -> Self {
        Self {
            retry,
            ..self.clone()
        }
    }
}
