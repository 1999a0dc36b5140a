//! The store's engine: connections, batches, the statement builder, call bounds and errors; it
//! knows no feature.

pub(crate) mod batch;
pub(crate) mod conns;
pub(crate) mod listen;
pub(crate) mod statement;
pub(crate) mod trace;

use std::future::Future;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

pub use conns::{
    BatchTotals, Connector, HOT_SETTINGS, HotConn, HotPoolStatus, REPLAN_AFTER, Warmed,
};
pub use trace::{TRACE_TARGET, trace_requests, tracing_requests};

/// An instance's database as every feature sees it: sqlx's pool (its `Deref`), the hot connections
/// and the one LISTEN connection. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
    conns: conns::Conns,
    hub: std::sync::Arc<listen::Hub>,
}

impl Engine {
    /// Opens no connection until one is needed; needs a Tokio runtime.
    pub(crate) fn start(pool: PgPool, pooler: Option<Pooler>) -> Self {
        let conns = conns::Conns::new(pool, pooler);
        Self {
            hub: std::sync::Arc::new(listen::Hub::start(conns.pool())),
            conns,
        }
    }

    pub(crate) fn conns(&self) -> &conns::Conns {
        &self.conns
    }

    pub(crate) fn hub(&self) -> &listen::Hub {
        &self.hub
    }
}

impl std::ops::Deref for Engine {
    type Target = PgPool;

    fn deref(&self) -> &PgPool {
        self.conns.pool()
    }
}

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
    /// The database is unreachable or gave up on the statement; nothing changed, a retry is safe.
    #[error("the database is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// A sent change lost its answer, so it may or may not have taken effect.
    #[error("the outcome is unknown: {0}")]
    Indeterminate(#[source] sqlx::Error),
    /// Any other database failure: a bug or a schema mismatch.
    #[error("database error: {0}")]
    Internal(#[source] sqlx::Error),
    /// Applying the migrations failed.
    #[error("applying the migrations failed: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
}

/// A migration that failed because the database went away is [`StoreError::Unavailable`]: a
/// lost connection is not a schema or rights problem, and start-up waits it out.
impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        use sqlx::migrate::MigrateError::{Execute, ExecuteMigration};
        match e {
            Execute(e) | ExecuteMigration(e, _) if is_unavailable(&e) => Self::Unavailable(e),
            e => Self::Migrate(e),
        }
    }
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

/// Whether the database is away rather than the statement wrong: SQLSTATE classes 08, 53, 57, 40,
/// and 55P03 (`lock_timeout`) and 25006 (a standby). Each changed nothing and may succeed when
/// retried.
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
    /// This failure for a change that had been sent: a lost link or a deadline becomes
    /// [`Indeterminate`](Self::Indeterminate); the database's own refusals and never-sent calls
    /// keep their meaning.
    pub(crate) fn after_sending(self) -> Self {
        match self {
            Self::Unavailable(e) if !never_delivered(&e) => Self::Indeterminate(e),
            other => other,
        }
    }
}

/// Whether the database rolled a statement back for a reason a rerun does not meet: a unique row a
/// concurrent statement committed first, a deadlock, or a serialization failure.
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

/// Whether a failed call surely never reached the server (refused, no connection, or `EPIPE`).
fn never_delivered(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        sqlx::Error::Io(io) => io.kind() == std::io::ErrorKind::BrokenPipe,
        _ => false,
    }
}

/// Result of a store call.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

struct RequestClock {
    bound: Duration,
    deadline: std::cell::Cell<tokio::time::Instant>,
}

tokio::task_local! {
    static REQUEST: RequestClock;
}

/// Runs `request` with all its database calls bounded to end within `bound`, so no 503 is late.
pub async fn within<F: Future>(bound: Duration, request: F) -> F::Output {
    let clock = RequestClock {
        bound,
        deadline: std::cell::Cell::new(tokio::time::Instant::now() + bound),
    };
    REQUEST.scope(clock, request).await
}

/// Restarts the request's bound once its body has arrived: the upload has its own timeout.
pub fn restart_deadline() {
    let _ = REQUEST.try_with(|c| c.deadline.set(tokio::time::Instant::now() + c.bound));
}

fn deadline(pool: &PgPool) -> tokio::time::Instant {
    let own = tokio::time::Instant::now() + pool.options().get_acquire_timeout();
    REQUEST
        .try_with(|c| c.deadline.get().min(own))
        .unwrap_or(own)
}

const LAST_LOOK: Duration = Duration::from_millis(1);

/// `timeout_at` with a last look of [`LAST_LOOK`] once the deadline passes. A process frozen past
/// the deadline (SIGSTOP) resumes with its timers due before it has read its sockets, so an answer
/// that came in time would count as none and a made change be answered `indeterminate`.
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

/// A database call bounded by the request's deadline ([`within`]) or the pool's timeout.
/// `statement_timeout` cannot end a wait for an answer a stalled link never delivers; the server's
/// own timeouts are shorter ([`server_timeout`]), so a healthy server cancels first and the 503 is
/// certain to have changed nothing.
pub(crate) trait Bounded<T>: Future<Output = sqlx::Result<T>> + Sized {
    async fn bounded(self, pool: &PgPool) -> Result<T> {
        match timeout_at(deadline(pool), self).await {
            Ok(answer) => Ok(answer?),
            Err(_) => Err(timed_out(pool)),
        }
    }

    async fn bounded_change(self, pool: &PgPool) -> Result<T> {
        self.bounded(pool).await.map_err(StoreError::after_sending)
    }
}

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

/// The server's timeouts: a fifth under the service's bound (at most 1 s), so the server cancels
/// first and says so.
pub fn server_timeout(bound: Duration) -> Duration {
    bound - (bound / 5).min(Duration::from_secs(1))
}

pub(crate) const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// How the service talks to its database.
#[derive(Debug, Clone)]
pub struct DbSettings {
    /// Connections in the pool of one instance.
    pub pool_size: u32,
    /// How long a request may wait for its database calls in all before it is answered `503`.
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

/// The session settings of every connection: the server's timeouts under the service's bound.
fn session_settings(settings: &DbSettings) -> [(&'static str, String); 4] {
    let ms = server_timeout(settings.timeout).as_millis().to_string();
    [
        ("statement_timeout", ms.clone()),
        ("lock_timeout", ms),
        (
            "idle_in_transaction_session_timeout",
            settings.timeout.as_millis().to_string(),
        ),
        ("jit", "off".to_string()),
    ]
}

/// Opens a lazy pool, so the service starts and recovers while the database is down.
pub fn pool(options: PgConnectOptions, settings: &DbSettings) -> PgPool {
    let session = session_settings(settings);
    let options = options
        .application_name("snapfence")
        .options(session.iter().map(|(k, v)| (*k, v.as_str())));
    PgPoolOptions::new()
        .max_connections(settings.pool_size)
        .min_connections(0)
        .acquire_timeout(settings.timeout)
        // Only an idle connection is checked (its database may have restarted); a check costs a
        // read.
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

/// A transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy) that the hot connections reach the
/// database through. A pooled server serves another client between transactions, so each
/// statement runs in a transaction of its own that sets the session settings with `SET LOCAL`,
/// as an unnamed statement, with no startup options the pooler could refuse.
#[derive(Debug, Clone)]
pub struct Pooler {
    pub(crate) options: PgConnectOptions,
    pub(crate) size: u32,
    /// `BEGIN` and the settings, sent as one simple query.
    pub(crate) begin: String,
}

/// The pooler at `options`, for `settings.pool_size` hot connections.
pub fn pooler(options: PgConnectOptions, settings: &DbSettings) -> Pooler {
    let begin = std::iter::once("BEGIN".to_string())
        .chain(
            session_settings(settings)
                .iter()
                .map(|(k, v)| format!("SET LOCAL {k} = '{v}'")),
        )
        .collect::<Vec<_>>()
        .join("; ");
    Pooler {
        options: options
            .application_name("snapfence")
            .extra_float_digits(None),
        size: settings.pool_size,
        begin,
    }
}

/// Opens a transaction through the pooler and ends it, as each hot statement will: a pooler that
/// is down, refuses the login or the settings fails start-up rather than the first request.
pub async fn check_pooler(pooler: &Pooler) -> Result<()> {
    let timeout = Duration::from_secs(10);
    let check = async {
        let mut conn = PgConnection::connect_with(&pooler.options).await?;
        conn.execute(format!("{}; COMMIT", pooler.begin).as_str())
            .await?;
        conn.close().await
    };
    match tokio::time::timeout(timeout, check).await {
        Ok(done) => Ok(done?),
        Err(_) => Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
    }
}

/// The migrations in `migrations/`, embedded at build time.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Whether the database holds snapfence's tables at all.
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
