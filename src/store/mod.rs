//! Every SQL statement of the service, one function each, grouped by table family: `leases`
//! (leases, tokens and recovery records), `snapshots` (fenced writes and reads), `audit`
//! (rejections and recoveries, and their retention), `keys` (API keys). The statements of the
//! leases and snapshots live in files of their own (`src/store/sql/*.sql`, compiled in with
//! `include_str!`), each with its parameters, the rows it locks and why it is race-free under
//! READ COMMITTED with any number of service instances on one database written beside it;
//! `bench/compare.sh` runs the same files with pgbench.
//!
//! Every statement is also bounded on the service's side (the `Bounded` trait): the server's timeouts
//! end a slow statement, but not a wait on a connection that stalled on the way.
//!
//! Refused operations are outcomes, not errors: a stale write is recorded in the audit log,
//! committed, and returned as [`snapshots::WriteOutcome::Refused`]. [`StoreError`] is only for
//! the database failing, and then nothing was changed.

pub mod audit;
mod db;
pub mod keys;
pub mod leases;
pub mod snapshots;
pub mod timeline;

use std::future::Future;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use db::{Db, HotPoolStatus};

/// The database failed. Refusals are not errors; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached, or gave up on the statement (timeout, shutdown, too many
    /// connections, a lost connection). Nothing was changed; retrying later is safe.
    #[error("the database is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// Any other database failure: a bug or a schema mismatch.
    #[error("database error: {0}")]
    Internal(#[source] sqlx::Error),
    /// Applying the migrations failed.
    #[error("applying the migrations failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_unavailable(&e) {
            Self::Unavailable(e)
        } else {
            Self::Internal(e)
        }
    }
}

/// Whether an error means "the database is not there right now" rather than "this statement is
/// wrong". SQLSTATE classes: 08 connection exception, 53 insufficient resources, 57 operator
/// intervention (shutdown, statement timeout), 40 transaction rollback (serialization, deadlock),
/// 55P03 (`lock_timeout` passed), and 25006 (read-only transaction: the database is a standby,
/// as after a failover until the service is pointed at the new primary): each leaves nothing
/// changed and may succeed when retried.
fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            ["08", "53", "57", "40", "55P03", "25006"]
                .iter()
                .any(|prefix| c.starts_with(prefix))
        }),
        _ => false,
    }
}

/// Result of a store call.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A database call bounded on the service's side: the pool's timeout (`--db-timeout`) plus
/// [`SERVER_CANCEL_MARGIN`].
///
/// `statement_timeout` is enforced by the server, so it cannot end a wait for an answer that a
/// stalled link (a partition, a frozen proxy) never delivers; without this bound such a request
/// would hang. A call cut off here is answered `503 unavailable`; if it was a write it may have
/// committed all the same, like any call whose connection is lost after it was sent. The
/// connection it used is tested before it goes back to the pool and closed if it is broken.
pub(crate) trait Bounded<T>: Future<Output = sqlx::Result<T>> + Sized {
    async fn bounded(self, pool: &PgPool) -> Result<T> {
        let limit = service_bound(pool);
        match tokio::time::timeout(limit, self).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(timed_out(limit)),
        }
    }
}

/// How long the service waits for a database call: the pool's timeout plus
/// [`SERVER_CANCEL_MARGIN`].
fn service_bound(pool: &PgPool) -> Duration {
    pool.options().get_acquire_timeout() + SERVER_CANCEL_MARGIN
}

/// The error of a call that had no answer within `limit`.
fn timed_out(limit: Duration) -> StoreError {
    StoreError::Unavailable(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("no answer from the database within {limit:?}"),
    )))
}

impl<T, F: Future<Output = sqlx::Result<T>>> Bounded<T> for F {}

/// How much longer than the server's own timeouts the service waits before it gives up on a
/// call. When the server cancels a statement (lock or statement timeout) it rolls it back and
/// says so, and the 503 that follows is certain to have changed nothing; giving up first on a
/// healthy link would leave the statement running, and perhaps committing, after the 503.
const SERVER_CANCEL_MARGIN: Duration = Duration::from_secs(1);

/// How long a pooled connection may sit unused before it is checked before its next use.
pub(crate) const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// How the service talks to its database.
#[derive(Debug, Clone)]
pub struct DbSettings {
    /// Connections in the pool of one instance.
    pub pool_size: u32,
    /// How long a request waits for a connection, and how long a statement may run, before the
    /// request is answered `503 unavailable`.
    pub timeout: Duration,
}

impl Default for DbSettings {
    fn default() -> Self {
        Self {
            pool_size: 16,
            timeout: Duration::from_secs(5),
        }
    }
}

/// Opens a pool. Connections are made lazily, so the service starts (and answers 503) while the
/// database is down, and recovers by itself when it comes back.
pub fn pool(options: PgConnectOptions, settings: &DbSettings) -> PgPool {
    let ms = settings.timeout.as_millis().to_string();
    let options = options
        .application_name("snapfence")
        // A statement that waits on a lock or a slow disk is cancelled, rolled back and
        // answered 503 instead of holding a client forever.
        .options([
            ("statement_timeout", ms.as_str()),
            ("lock_timeout", ms.as_str()),
            // No transaction may sit idle holding locks if an instance stalls mid-transaction.
            ("idle_in_transaction_session_timeout", ms.as_str()),
        ]);
    PgPoolOptions::new()
        .max_connections(settings.pool_size)
        .min_connections(0)
        .acquire_timeout(settings.timeout)
        // A connection that sat idle may be to a database that restarted since: it is checked
        // (one round trip) before it is used. A busy connection is not, since a check per
        // request would cost as much as a read; if the database restarts under load, each
        // broken connection fails one request with 503 (nothing changed) and is replaced.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= CHECK_IDLE_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(options)
}

/// The migrations in `migrations/`, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Applies the migrations, then moves the token sequence past every token already stored.
///
/// Several instances may start at once: sqlx serialises migrations with an advisory lock, and
/// [`leases::ensure_sequence_ahead`] takes a table lock that orders it against every grant.
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

/// Whether the database holds snapfence's tables, of any version: one without them is not a
/// service's database (yet), which `snapfence keys` tells apart from an empty key table.
pub async fn has_schema(pool: &PgPool) -> Result<bool> {
    sqlx::query_scalar("SELECT to_regclass('leases') IS NOT NULL")
        .fetch_one(pool)
        .bounded(pool)
        .await
}

/// Whether the database answers and has every migration this build knows of.
pub async fn ready(pool: &PgPool) -> Result<bool> {
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    // to_regclass: a database that was never migrated has no migrations table, which is
    // "not ready", not an error.
    let applied: Option<i64> = sqlx::query_scalar(
        "SELECT CASE WHEN to_regclass('_sqlx_migrations') IS NOT NULL
                THEN (SELECT max(version) FROM _sqlx_migrations WHERE success) END",
    )
    .fetch_one(pool)
    .bounded(pool)
    .await?;
    Ok(applied.is_some_and(|v| v >= latest))
}

/// Where a request came from, for the audit log.
#[derive(Debug, Clone, Default)]
pub struct RequestContext {
    /// The request's `x-request-id`.
    pub request_id: Option<String>,
    /// The peer address.
    pub remote_addr: Option<String>,
    /// The authenticated principal, when authentication is configured.
    pub principal: Option<String>,
}
