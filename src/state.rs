//! What every handler shares: the database pool and the service's rules.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::domain::TtlBounds;
use crate::metrics::Metrics;
use crate::store::Db;
use crate::store::keys::KeyCache;

/// The rules an instance enforces, from its configuration.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Bounds on a lease's TTL.
    pub ttl_bounds: TtlBounds,
    /// Snapshot versions kept per key, the current one included.
    pub keep_versions: i64,
    /// The largest snapshot body, in bytes.
    pub max_snapshot_bytes: usize,
    /// How long audit rows are kept.
    pub audit_retention: Duration,
    /// How long Idempotency-Key records are kept.
    pub idempotency_retention: Duration,
    /// How long a request body may take to arrive.
    pub body_timeout: Duration,
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
    /// Whether requests without credentials are served while no live API key exists. True for
    /// a loopback listener (or with `--insecure-no-auth`); false means every request needs a key.
    pub anonymous_without_keys: bool,
}

impl Default for Rules {
    fn default() -> Self {
        Self {
            ttl_bounds: TtlBounds::default(),
            keep_versions: 10,
            max_snapshot_bytes: 8 * 1024 * 1024,
            audit_retention: Duration::from_secs(30 * 86_400),
            idempotency_retention: Duration::from_secs(86_400),
            body_timeout: Duration::from_secs(30),
            max_concurrent_requests: 1024,
            max_header_bytes: 16 * 1024,
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            anonymous_without_keys: true,
        }
    }
}

/// The state handed to every handler with `with_state`.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The database.
    pub db: Db,
    /// The rules.
    pub rules: Arc<Rules>,
    /// This instance's metrics.
    pub metrics: Arc<Metrics>,
    /// This instance's copy of the live API keys.
    pub keys: KeyCache,
}

impl AppState {
    /// State over a pool with the given rules; starts following the API keys, so it must be
    /// called within a Tokio runtime.
    pub fn new(db: PgPool, rules: Rules) -> Self {
        Self {
            keys: KeyCache::follow(db.clone()),
            db: Db::new(db),
            rules: Arc::new(rules),
            metrics: Metrics::new(),
        }
    }
}
