//! The store: every SQL statement, as an engine that knows no feature and features that own their
//! rows, rules and SQL (`<feature>/sql/*.sql`, each saying what it locks and why it is race-free
//! under READ COMMITTED). Refusals are outcomes committed with their audit row; [`StoreError`] is
//! the database failing.

pub mod audit;
mod engine;
pub mod idempotency;
pub mod keys;
pub mod leases;
pub mod snapshots;
pub mod watch;

use std::ops::Deref;
use std::sync::Arc;

use sqlx::postgres::PgPool;

pub use engine::{
    BatchTotals, Connector, DbSettings, Engine, HOT_SETTINGS, HotConn, HotPoolStatus, MIGRATOR,
    Pooler, REPLAN_AFTER, Result, StoreError, TRACE_TARGET, Warmed, check_pooler, has_schema, pool,
    pooler, ready, restart_deadline, server_timeout, trace_requests, tracing_requests, within,
};
pub(crate) use engine::{Bounded, Tasks};
use leases::{timeline, waiters};

/// An instance's database: the engine (sqlx's pool is its `Deref`) and the features' batches,
/// which each feature reaches by `AsRef`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Db {
    engine: Engine,
    leases: Arc<leases::Batches>,
    snapshots: Arc<snapshots::Batches>,
}

impl Deref for Db {
    type Target = PgPool;

    fn deref(&self) -> &PgPool {
        &self.engine
    }
}

impl AsRef<Engine> for Db {
    fn as_ref(&self) -> &Engine {
        &self.engine
    }
}

impl AsRef<leases::Batches> for Db {
    fn as_ref(&self) -> &leases::Batches {
        &self.leases
    }
}

impl AsRef<snapshots::Batches> for Db {
    fn as_ref(&self) -> &snapshots::Batches {
        &self.snapshots
    }
}

impl From<PgPool> for Db {
    fn from(pool: PgPool) -> Self {
        Self::new(pool)
    }
}

impl Db {
    /// Opens no connection until one is needed; needs a Tokio runtime for the dispatchers.
    pub fn new(pool: PgPool) -> Self {
        Self::start(pool, None)
    }

    /// Sends the hot statements through a transaction-mode `pooler`; `pool` (its server direct)
    /// keeps the sessions: LISTEN, migrations, locks, and the statements off the hot paths.
    pub fn with_pooler(pool: PgPool, pooler: Pooler) -> Self {
        Self::start(pool, Some(pooler))
    }

    fn start(pool: PgPool, pooler: Option<Pooler>) -> Self {
        let engine = Engine::start(pool, pooler);
        Self {
            leases: Arc::new(leases::Batches::start(engine.conns())),
            snapshots: Arc::new(snapshots::Batches::start(engine.conns())),
            engine,
        }
    }

    /// Opens up to `n` hot connections now, each with every hot statement planned.
    pub async fn warm(&self, n: usize) -> Result<Warmed> {
        let statements: Vec<&'static str> = hot_statements()
            .into_iter()
            // It reads the table each transaction that uploads a large body makes for itself.
            .filter(|&(name, _)| !name.ends_with("put_uploaded"))
            .map(|(_, sql)| sql)
            .collect();
        self.engine.conns().warm(n, &statements).await
    }

    /// Every batch kind's batches and requests since start, for the metrics.
    pub fn batch_totals(&self) -> Vec<BatchTotals> {
        self.engine.conns().batch_totals()
    }

    /// The hot pool's state, for the metrics.
    pub fn hot_status(&self) -> HotPoolStatus {
        self.engine
            .conns()
            .hot_status(self.leases.queued() + self.snapshots.queued())
    }
}

/// Every statement the hot connections run, named as its rendered file: each batched one, then
/// its lone form (`lone/`), then the single statements.
#[doc(hidden)]
pub fn hot_statements() -> Vec<(&'static str, &'static str)> {
    macro_rules! both {
        ($($name:literal: $batched:expr),* $(,)?) => {
            [$(($name, $batched.text())),*, $((concat!("lone/", $name), $batched.lone_text())),*]
        };
    }
    let fenced = &*snapshots::FENCED;
    let batched = both![
        "acquire": leases::ACQUIRE,
        "renew": leases::RENEW,
        "end": leases::END,
        "reconciled": leases::RECONCILED,
        "put": fenced.put,
        "put_uploaded": fenced.put_uploaded,
        "precheck": fenced.precheck,
        "delete_head": fenced.delete_head,
        "txn": fenced.txn,
        "get": snapshots::GET,
    ];
    let single = [
        ("status", leases::STATUS),
        ("wait_enqueue", waiters::ENQUEUE),
        ("wait_leave", waiters::LEAVE),
    ];
    batched.into_iter().chain(single).collect()
}

/// Who sent a request and from where, and its Idempotency-Key.
#[derive(Debug, Clone, Default)]
pub struct RequestContext {
    /// The request's `x-request-id`.
    pub request_id: Option<String>,
    /// The peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, when authentication is configured.
    pub principal: Option<String>,
    /// The id of the principal's API key, which a changing statement checks is still live.
    pub key_id: Option<i64>,
    /// The Idempotency-Key of a changing call, with the request's fingerprint.
    pub idempotency: Option<idempotency::Idempotency>,
}

/// Migrates, then moves the token sequence past every stored token. Concurrent starts are safe:
/// migrations take an advisory lock, [`leases::ensure_sequence_ahead`] a table lock.
pub async fn prepare(pool: &PgPool) -> Result<()> {
    MIGRATOR.run(pool).await?;
    leases::ensure_sequence_ahead(pool).await?;
    timeline::secure(pool).await?;
    #[cfg(feature = "fault-controls")]
    if snapshots::fencing_broken() {
        tracing::error!(
            "SNAPFENCE_BREAK_FENCING=written-token: fenced writes are checked against the highest \
             token written, not the newest granted; fencing is broken on purpose (a negative \
             control of the fault tests). Never run this outside them"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn header(name: &str) -> String {
        format!(
            "-- src/store/rendered/{name}.sql: the statement as the service sends it, assembled by \
             src/store/engine/statement.rs.\n-- Do not edit: `SNAPFENCE_RENDER=1 cargo test --lib \
             rendered` writes it again from its parts.\n"
        )
    }

    #[test]
    fn rendered_statements_are_the_statements_the_service_runs() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/store/rendered");
        let render = std::env::var_os("SNAPFENCE_RENDER").is_some();
        let mut stale = Vec::new();
        for (name, text) in super::hot_statements() {
            let path = dir.join(format!("{name}.sql"));
            let rendered = header(name) + text;
            if render {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, &rendered).unwrap();
            } else if std::fs::read_to_string(&path).ok().as_deref() != Some(rendered.as_str()) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "these rendered statements differ from what the service runs: {stale:?}; \
             run `SNAPFENCE_RENDER=1 cargo test --lib rendered` and commit them"
        );
    }
}
