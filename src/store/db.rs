//! [`Db`]: the connections an instance talks to its database through.
//!
//! The hot paths (acquire, renew, release, fenced write, read, status) run on a pool of their
//! own, managed by `deadpool`, because sqlx's pool tests every connection with a round trip
//! when it is given back: for a one-statement request that doubles the work of the database.
//! Here a connection goes back to the pool untested when its statement finished (with an
//! answer or an error of the statement, either way with the session in step); one whose
//! statement failed otherwise (the link, a shutdown, a timeout) or was abandoned mid-flight is
//! closed instead, and one that sat idle is checked before its next use. Everything else (migrations, transactions, the
//! audit log, keys, readiness) uses sqlx's own pool, which [`Db`] dereferences to.

use std::ops::Deref;

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult, Timeouts};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgRow};
use sqlx::query::QueryAs;
use sqlx::{Connection, FromRow, PgConnection, Postgres};

use super::{CHECK_IDLE_AFTER, Result, StoreError, service_bound};

/// Opens hot connections and checks idle ones.
#[derive(Debug)]
pub struct Connector(PgConnectOptions);

impl managed::Manager for Connector {
    type Type = PgConnection;
    type Error = sqlx::Error;

    async fn create(&self) -> sqlx::Result<PgConnection> {
        PgConnection::connect_with(&self.0).await
    }

    async fn recycle(&self, conn: &mut PgConnection, m: &Metrics) -> RecycleResult<sqlx::Error> {
        if m.last_used() >= CHECK_IDLE_AFTER {
            conn.ping().await.map_err(RecycleError::Backend)?;
        }
        Ok(())
    }
}

/// Runs the statement `$q()` with `$fetch` on a hot connection, bounded like every call. A
/// statement that could not be written because the server had already closed the connection
/// (a restart since the connection was last used) never reached it, so it is sent once more on
/// a fresh connection: a restart costs no request an answer.
macro_rules! hot {
    ($db:ident, $q:ident, $fetch:ident) => {{
        let mut fresh = false;
        loop {
            let mut conn = $db.checkout().await?;
            let answer =
                tokio::time::timeout(service_bound(&$db.pool), $q().$fetch(conn.get())).await;
            match conn.finish(answer, &$db.pool) {
                Err(e) if !fresh && never_sent(&e) => fresh = true,
                answer => break answer,
            }
        }
    }};
}

/// Whether a call failed writing to a connection its server had closed (`EPIPE`): nothing of
/// it was delivered.
fn never_sent(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(sqlx::Error::Io(io)) if io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The database of an instance: sqlx's pool for everything (it dereferences to it), and a pool
/// of hot connections for the one-statement paths. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Db {
    pool: PgPool,
    hot: managed::Pool<Connector>,
}

impl Deref for Db {
    type Target = PgPool;

    fn deref(&self) -> &PgPool {
        &self.pool
    }
}

/// How many requests are using a hot connection, and how many wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotPoolStatus {
    /// Connections open.
    pub open: usize,
    /// Connections open and not in use.
    pub idle: usize,
    /// Requests waiting for a connection.
    pub waiting: usize,
    /// The most connections it opens.
    pub max: usize,
}

impl Db {
    /// The hot pool beside `pool`, with its connection settings, size and timeout. Opens no
    /// connection until one is needed.
    pub fn new(pool: PgPool) -> Self {
        let timeout = pool.options().get_acquire_timeout();
        let hot = managed::Pool::builder(Connector((*pool.connect_options()).clone()))
            .max_size(pool.options().get_max_connections() as usize)
            .timeouts(Timeouts {
                wait: Some(timeout),
                create: Some(timeout),
                recycle: Some(timeout),
            })
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .expect("a runtime is set, so the timeouts can be");
        Self { pool, hot }
    }

    /// The hot pool's state, for the metrics.
    pub fn hot_status(&self) -> HotPoolStatus {
        let s = self.hot.status();
        HotPoolStatus {
            open: s.size,
            idle: s.available,
            waiting: s.waiting,
            max: s.max_size,
        }
    }

    /// Runs a statement that answers one row on a hot connection; see [`hot!`].
    pub(crate) async fn fetch_one<'q, O>(
        &self,
        q: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<O>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        hot!(self, q, fetch_one)
    }

    /// Runs a statement that answers at most one row on a hot connection; see [`hot!`].
    pub(crate) async fn fetch_optional<'q, O>(
        &self,
        q: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<Option<O>>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        hot!(self, q, fetch_optional)
    }

    async fn checkout(&self) -> Result<Checkout> {
        match self.hot.get().await {
            Ok(conn) => Ok(Checkout(Some(conn))),
            Err(PoolError::Backend(e)) => Err(StoreError::from(e)),
            Err(PoolError::Closed) => Err(StoreError::Unavailable(sqlx::Error::PoolClosed)),
            Err(_) => Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
        }
    }
}

/// A hot connection in use. Dropped without [`finish`](Checkout::finish) (its request was
/// abandoned mid-statement) it is closed, never given back.
struct Checkout(Option<Object<Connector>>);

impl Checkout {
    fn get(&mut self) -> &mut PgConnection {
        self.0.as_mut().expect("in use until finished")
    }

    /// Gives the connection back if its statement ended in step with the server (an answer,
    /// or an error of the statement that the server sent), else closes it; returns the answer.
    fn finish<T>(
        mut self,
        answer: std::result::Result<sqlx::Result<T>, tokio::time::error::Elapsed>,
        pool: &PgPool,
    ) -> Result<T> {
        let conn = self.0.take().expect("finished once");
        match answer {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e)) => match StoreError::from(e) {
                // An error of the statement itself: the session goes on.
                e @ StoreError::Internal(sqlx::Error::Database(_)) => Err(e),
                // The rest may have ended the session (a shutdown, a lost link) or left it out
                // of step, and a timeout or overload is better met with a fresh connection.
                e => {
                    drop(Object::take(conn));
                    Err(e)
                }
            },
            Err(_) => {
                drop(Object::take(conn));
                Err(super::timed_out(service_bound(pool)))
            }
        }
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(Object::take(conn));
        }
    }
}
