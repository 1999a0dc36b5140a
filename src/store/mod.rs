//! Every SQL statement of the service, one function each, grouped by table family: `leases`
//! (leases, tokens and recovery records), `snapshots` (fenced writes and reads), `audit`
//! (rejections and recoveries, and their retention), `keys` (API keys). Each statement lives in a
//! file of its own (`src/store/sql/*.sql`, compiled in with `include_str!`), with its
//! parameters, the rows it locks and why it is race-free under READ COMMITTED with any number of
//! service instances on one database written beside it; `bench/compare.sh` runs the same files
//! with pgbench. The hot paths' statements are written over a batch of requests (arrays, one
//! element per request), which `batch` gathers from the calls that arrive together. Two are built in code because their shape is data: the audit log's page query
//! (one prepared statement per combination of filters) and its retention's batch delete (per
//! table); and a few one-call statements stay inline (`set_config`, `pg_notify`, the timeline's
//! function).
//!
//! Every statement is also bounded on the service's side (the `Bounded` trait): the server's timeouts
//! end a slow statement, but not a wait on a connection that stalled on the way.
//!
//! Refused operations are outcomes, not errors: a stale write is recorded in the audit log,
//! committed, and returned as [`snapshots::WriteOutcome::Refused`]. [`StoreError`] is only for
//! the database failing, and then nothing was changed.

pub mod audit;
mod batch;
mod db;
pub mod idempotency;
pub mod keys;
pub mod leases;
pub mod queues;
pub mod snapshot_keys;
pub mod snapshots;
pub mod timeline;
pub mod waiters;
pub mod watch;

use std::future::Future;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use db::{Db, HOT_SETTINGS, HotPoolStatus};

/// A pool of one connection beside `pool`, for a connection that `LISTEN`s: it is none of the
/// connections that serve requests, and what is set on it never comes back to them.
pub(crate) fn listening_pool(pool: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(pool.options().get_acquire_timeout())
        .connect_lazy_with((*pool.connect_options()).clone())
}

/// The background tasks of a part of the store (its listening, sweeping or relaying loops),
/// aborted when the last handle to that part goes.
#[derive(Debug)]
pub(crate) struct Tasks(pub(crate) Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Every statement the hot connections run ([`HOT_SETTINGS`]), named: for the test that their
/// generic plans, made while the tables are empty, read a batch's rows by key alone.
#[doc(hidden)]
pub fn hot_statements() -> Vec<(&'static str, &'static str)> {
    vec![
        ("acquire", leases::ACQUIRE),
        ("acquire (waiting)", leases::ACQUIRE_WAITING),
        ("renew", leases::RENEW),
        ("end", leases::END),
        ("reconciled", leases::RECONCILED),
        ("put", snapshots::PUT),
        ("put (uploaded body)", snapshots::PUT_UPLOADED.as_str()),
        ("check before the body", snapshots::PRECHECK),
        ("get", snapshots::GET),
        ("wait (enqueue)", include_str!("sql/wait_enqueue.sql")),
    ]
}

/// The database failed. Refusals are not errors; see the module docs.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached, or gave up on the statement (timeout, shutdown, too many
    /// connections, a lost connection). Nothing was changed; retrying later is safe.
    #[error("the database is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A change was sent to the database and its outcome is unknown: the link broke, or the
    /// deadline passed, after it was sent and before its answer (or its commit's) came back. It
    /// may or may not have taken effect. Never for a read, and never for an error the database
    /// answered (a statement the server refused was rolled back).
    #[error("the outcome is unknown: {0}")]
    Indeterminate(#[source] sqlx::Error),
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

impl StoreError {
    /// This failure as it reads for a call that changes something and had been sent: a lost
    /// link or a deadline is then [`Indeterminate`](Self::Indeterminate). What the database
    /// answered (its refusals roll the change back) and what was never sent (no connection, a
    /// connection its server had already closed) keep their meaning.
    pub(crate) fn after_sending(self) -> Self {
        match self {
            Self::Unavailable(e) if !never_delivered(&e) => Self::Indeterminate(e),
            other => other,
        }
    }
}

/// Whether the database rolled a statement back whole for a reason that running it again does
/// not meet: another statement's record for one of its Idempotency-Keys (the race of
/// `sql/gate.sql`; the second run finds that record), a deadlock or a serialization failure.
pub(crate) fn rolled_back_race(e: &StoreError) -> bool {
    let database = match e {
        StoreError::Internal(sqlx::Error::Database(d))
        | StoreError::Unavailable(sqlx::Error::Database(d)) => d,
        _ => return false,
    };
    database.constraint() == Some("idempotency_records_pkey")
        || database
            .code()
            .is_some_and(|c| c == "40P01" || c == "40001")
}

impl StoreError {
    /// The same failure again, for another request of the batch it failed: the same variant
    /// (which is what the HTTP layer answers by) with the same message.
    pub(crate) fn for_each(&self) -> Self {
        let copy = |e: &sqlx::Error| match e {
            sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed => sqlx::Error::WorkerCrashed,
            sqlx::Error::Io(io) => sqlx::Error::Io(std::io::Error::new(io.kind(), io.to_string())),
            other => sqlx::Error::Io(std::io::Error::other(other.to_string())),
        };
        match self {
            Self::Unavailable(e) => Self::Unavailable(copy(e)),
            Self::Indeterminate(e) => Self::Indeterminate(copy(e)),
            Self::Internal(e) => Self::Internal(sqlx::Error::Protocol(e.to_string())),
            Self::Migrate(e) => Self::Internal(sqlx::Error::Protocol(e.to_string())),
        }
    }
}

/// Whether a failed call surely never reached the server: the database's own answer (it was
/// received, and refused, so nothing changed), no connection to send it on, or a connection the
/// server had already closed (`EPIPE` on the write).
fn never_delivered(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::BrokenPipe,
        _ => false,
    }
}

/// Result of a store call.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The deadline of the request being served, and the bound it was counted with.
struct RequestClock {
    bound: Duration,
    deadline: std::cell::Cell<tokio::time::Instant>,
}

tokio::task_local! {
    /// When the request being served must have its answer: every database call made for it,
    /// each retry included, ends by then.
    static REQUEST: RequestClock;
}

/// Runs `request` with every database call made for it bounded to end within `bound` of now
/// (the request's arrival), together, retries included: the contract's 503 comes within the
/// bound, never later.
pub async fn within<F: Future>(bound: Duration, request: F) -> F::Output {
    let clock = RequestClock {
        bound,
        deadline: std::cell::Cell::new(tokio::time::Instant::now() + bound),
    };
    REQUEST.scope(clock, request).await
}

/// Starts the current request's bound again from now: called once its body has arrived, since a
/// body's upload is bounded by the body timeout of its own, not by the database's.
pub fn restart_deadline() {
    let _ = REQUEST.try_with(|c| c.deadline.set(tokio::time::Instant::now() + c.bound));
}

/// When a database call starting now must have its answer: the pool's timeout from now, or the
/// request's deadline if that is sooner.
fn deadline(pool: &PgPool) -> tokio::time::Instant {
    let own = tokio::time::Instant::now() + pool.options().get_acquire_timeout();
    REQUEST
        .try_with(|c| c.deadline.get().min(own))
        .unwrap_or(own)
}

/// A database call bounded on the service's side, by the request's deadline (see [`within`]) or
/// the pool's timeout (`--db-timeout`).
///
/// `statement_timeout` is enforced by the server, so it cannot end a wait for an answer that a
/// stalled link (a partition, a frozen proxy) never delivers; without this bound such a request
/// would hang. The server's own timeouts are set shorter (see [`server_timeout`]), so that a
/// healthy server cancels a slow statement, rolls it back and says so first: the 503 that
/// follows is then certain to have changed nothing.
pub(crate) trait Bounded<T>: Future<Output = sqlx::Result<T>> + Sized {
    /// For a read, or a statement inside a transaction that has not committed: whatever
    /// happens, nothing took effect.
    async fn bounded(self, pool: &PgPool) -> Result<T> {
        match tokio::time::timeout_at(deadline(pool), self).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(timed_out(pool)),
        }
    }

    /// For a change that commits as it answers (an autocommit statement, a `COMMIT`): once it
    /// was sent, a lost answer leaves its outcome unknown ([`StoreError::after_sending`]).
    async fn bounded_change(self, pool: &PgPool) -> Result<T> {
        self.bounded(pool).await.map_err(StoreError::after_sending)
    }
}

/// The error of a call that had no answer by its deadline.
fn timed_out(pool: &PgPool) -> StoreError {
    StoreError::Unavailable(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no answer from the database within the request's bound of {:?}",
            pool.options().get_acquire_timeout()
        ),
    )))
}

impl<T, F: Future<Output = sqlx::Result<T>>> Bounded<T> for F {}

/// The server's own timeouts (`statement_timeout`, `lock_timeout`): shorter than the service's
/// bound by a fifth of it, at most a second, so that a slow statement on a healthy server is
/// cancelled and rolled back by the server, which says so (`503 unavailable`, certain), before
/// the service gives up on it (`503 indeterminate`, uncertain).
pub fn server_timeout(bound: Duration) -> Duration {
    bound - (bound / 5).min(Duration::from_secs(1))
}

/// How long a pooled connection may sit unused before it is checked before its next use.
pub(crate) const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// How the service talks to its database.
#[derive(Debug, Clone)]
pub struct DbSettings {
    /// Connections in the pool of one instance.
    pub pool_size: u32,
    /// How long a request may wait for its database calls in all (a connection, its statements,
    /// a retry) before it is answered `503`; the server's own timeouts are a little shorter
    /// ([`server_timeout`]).
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
    let ms = server_timeout(settings.timeout).as_millis().to_string();
    let idle_ms = settings.timeout.as_millis().to_string();
    let options = options
        .application_name("snapfence")
        // A statement that waits on a lock or a slow disk is cancelled, rolled back and
        // answered 503 instead of holding a client forever.
        .options([
            ("statement_timeout", ms.as_str()),
            ("lock_timeout", ms.as_str()),
            // No transaction may sit idle holding locks if an instance stalls mid-transaction.
            ("idle_in_transaction_session_timeout", idle_ms.as_str()),
            // No statement of the service gains from compiling: each is short, and under load the
            // ones that cross jit_above_cost spent more in LLVM than in running (../PERF.md).
            ("jit", "off"),
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
    sqlx::query_scalar(include_str!("sql/schema.sql"))
        .fetch_one(pool)
        .bounded(pool)
        .await
}

/// Whether the database answers and has every migration this build knows of.
pub async fn ready(pool: &PgPool) -> Result<bool> {
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Option<i64> = sqlx::query_scalar(include_str!("sql/migrated.sql"))
        .fetch_one(pool)
        .bounded(pool)
        .await?;
    Ok(applied.is_some_and(|v| v >= latest))
}

/// Who sent a request and where from (for the audit log and the Idempotency-Key's scope), and
/// its Idempotency-Key.
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
