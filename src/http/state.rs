//! What every handler shares: the database pool and the service's rules.

use std::sync::Arc;

use super::limits::Limits;
use crate::metrics::Metrics;
use crate::rules::Rules;
use crate::store::Db;
use crate::store::keys::KeyCache;
use crate::store::leases::waiters::Waiters;
use crate::store::watch::Changes;

/// One `Arc`: axum clones the state per layer and handler, and cloning its parts cost ~8 % of CPU.
#[derive(Debug, Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] holds.
#[derive(Debug)]
pub struct Shared {
    /// The database.
    pub db: Db,
    /// The rules.
    pub rules: Arc<Rules>,
    /// This instance's metrics.
    pub metrics: Arc<Metrics>,
    /// This instance's copy of the live API keys.
    pub keys: KeyCache,
    /// What this instance lets in at once: per API key, and bytes of bodies.
    pub limits: Arc<Limits>,
    /// This instance's waiting acquires.
    pub waiters: Waiters,
    /// The history of changes, and this instance's watches.
    pub changes: Changes,
}

impl AppState {
    /// Starts following keys, waiters and changes, so it must run within a Tokio runtime.
    pub fn new(db: impl Into<Db>, rules: Rules) -> Self {
        let db = db.into();
        Self(Arc::new(Shared {
            keys: KeyCache::follow(&db),
            waiters: Waiters::start(&db, rules.waiter_stall_bound),
            changes: Changes::start(&db, rules.watch_retention),
            db,
            limits: Arc::new(Limits::new(&rules)),
            rules: Arc::new(rules),
            metrics: Metrics::new(),
        }))
    }
}
