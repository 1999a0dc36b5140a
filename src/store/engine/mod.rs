//! The engine of the store: connections (sqlx's pool, and the hot pool of [`conns`]), the
//! batches the hot paths are gathered in ([`batch`]), the statements they send ([`statement`]),
//! the bound every call keeps, and the errors of the database. It knows no feature: the
//! features (`leases`, `snapshots`, `idempotency`, `keys`, `audit`, `watch`) own their
//! statements, rows and rules, and build on this.

pub(crate) mod batch;
pub(crate) mod conns;
pub(crate) mod statement;

use std::future::Future;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

pub use conns::{HOT_SETTINGS, HotPoolStatus};

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
/// not meet: a row that a concurrent statement committed first under the same unique key (the
/// features' statements meet one only in a race, such as two records of one Idempotency-Key,
/// and the second run then finds that row), a deadlock or a serialization failure.
pub(crate) fn rolled_back_race(e: &StoreError) -> bool {
    let database = match e {
        StoreError::Internal(sqlx::Error::Database(d))
        | StoreError::Unavailable(sqlx::Error::Database(d)) => d,
        _ => return false,
    };
    database
        .code()
        .is_some_and(|c| c == "23505" || c == "40P01" || c == "40001")
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

/// How long a call whose deadline has passed gets for a last look at its answer.
const LAST_LOOK: Duration = Duration::from_millis(1);

/// `tokio::time::timeout_at` with a last look: once the deadline is seen to pass, `call` has
/// [`LAST_LOOK`] more, and its answer is taken if it comes. A process that was not running as the
/// deadline passed (frozen by SIGSTOP) resumes with its timers due before it has seen what its
/// sockets received meanwhile (its wait for I/O returns interrupted, reporting nothing), so an
/// answer that came in time would otherwise count as none, and a change that was made be
/// answered `indeterminate`. The last look's own timer fires only from a wait for I/O begun
/// after it was set, which reports such an answer. A call that has no answer is given up a
/// millisecond after its deadline.
pub(crate) async fn timeout_at<F: Future>(
    deadline: tokio::time::Instant,
    call: F,
) -> std::result::Result<F::Output, tokio::time::error::Elapsed> {
    let mut call = std::pin::pin!(call);
    match tokio::time::timeout_at(deadline, call.as_mut()).await {
        Ok(answer) => Ok(answer),
        Err(_) => tokio::time::timeout(LAST_LOOK, call).await,
    }
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
        match timeout_at(deadline(pool), self).await {
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

/// Runs a retention statement (`$1` the retention in ms, `$2` the batch) and returns how many
/// rows it deleted.
pub(crate) async fn delete_batch(
    pool: &PgPool,
    sql: &str,
    retention: Duration,
    batch: i64,
) -> Result<u64> {
    let done = sqlx::query(sql)
        .bind(retention.as_millis() as i64)
        .bind(batch)
        .execute(pool)
        .bounded_change(pool)
        .await?;
    Ok(done.rows_affected())
}
