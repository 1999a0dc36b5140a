//! The rules an instance enforces, from its configuration.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::domain::TtlBounds;

/// The rules an instance enforces, from its configuration.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Bounds on a lease's TTL.
    pub ttl_bounds: TtlBounds,
    /// Snapshot versions kept per key, the current one included.
    pub keep_versions: i64,
    /// The largest snapshot body, in bytes; also the largest transaction body.
    pub max_snapshot_bytes: usize,
    /// The most ops one transaction may have.
    pub max_txn_ops: usize,
    /// The most snapshots one transaction's prefix deletes may remove together.
    pub max_txn_prefix_keys: i64,
    /// How long audit rows are kept.
    pub audit_retention: Duration,
    /// How long Idempotency-Key records are kept.
    pub idempotency_retention: Duration,
    /// How long a request body may take to arrive.
    pub body_timeout: Duration,
    /// The longest an acquire waits in a key's queue, whatever its `wait_ms` asks.
    pub max_wait: Duration,
    /// The most requests one instance serves at once; more are shed with 503.
    pub max_concurrent_requests: usize,
    /// The largest total size of a request's headers, in bytes.
    pub max_header_bytes: usize,
    /// How long a request head may take to arrive (see [`crate::conn`]).
    pub head_timeout: Duration,
    /// How long a keep-alive connection may idle before it is closed.
    pub idle_timeout: Duration,
    /// The most connections one instance keeps open; one more waits in the listen queue.
    pub max_connections: usize,
    /// Whether requests without credentials are served while no live API key exists.
    pub anonymous_without_keys: bool,
    /// The most requests one API key may have in flight on one instance; one more is answered 429.
    pub max_in_flight_per_key: usize,
    /// The rate one API key may send requests at to one instance, if it is limited.
    pub rate_limit_per_key: Option<RateLimit>,
    /// The most request body bytes one instance holds at once; more is answered 503.
    pub max_body_bytes_in_flight: usize,
    /// How long the history of changes is kept for watches to resume in.
    pub watch_retention: Duration,
    /// How often an idle watch is sent a comment line, so that it stays open.
    pub watch_heartbeat: Duration,
    /// How long one watch stream lasts before the service ends it.
    pub max_watch: Duration,
    /// The most watch streams one API key may have open on one instance.
    pub max_watches_per_key: usize,
    /// The most watch streams one instance serves at once, with or without a key.
    pub max_watches: usize,
    /// How long an instance may not answer (frozen) before its waiters are passed over.
    pub waiter_stall_bound: Duration,
    /// The most waiting acquires of one key on one instance.
    pub max_waiters_per_key: usize,
    /// The most waiting acquires one instance holds, below its concurrent requests.
    pub max_waiters: usize,
}

/// A rate limit per API key: a token bucket of `burst` requests, refilled at `per_second`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests a second, on average; may be below one (0.1 is one every 10 s).
    pub per_second: f64,
    /// Requests that may come at once after a quiet spell.
    pub burst: NonZeroU32,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            ttl_bounds: TtlBounds::default(),
            keep_versions: 10,
            max_snapshot_bytes: 8 * 1024 * 1024,
            max_txn_ops: 128,
            max_txn_prefix_keys: 10_000,
            audit_retention: Duration::from_secs(30 * 86_400),
            idempotency_retention: Duration::from_secs(86_400),
            body_timeout: Duration::from_secs(30),
            max_wait: Duration::from_millis(snapfence_types::MAX_WAIT_MS as u64),
            max_concurrent_requests: 1024,
            max_header_bytes: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            anonymous_without_keys: true,
            max_in_flight_per_key: 64,
            rate_limit_per_key: None,
            max_body_bytes_in_flight: 256 * 1024 * 1024,
            watch_retention: Duration::from_secs(86_400),
            watch_heartbeat: Duration::from_secs(10),
            max_watch: Duration::from_secs(300),
            max_watches_per_key: 16,
            max_watches: 1024,
            waiter_stall_bound: Duration::from_secs(1),
            max_waiters_per_key: 128,
            max_waiters: 2048,
        }
    }
}
