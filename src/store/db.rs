//! [`Db`]: the connections an instance talks to its database through.
//!
//! The hot paths (acquire, renew, release, fenced write, read, status) run on a pool of their
//! own, managed by `deadpool`, because sqlx's pool tests every connection with a round trip
//! when it is given back: for a one-statement request that doubles the work of the database.
//! Here a connection goes back to the pool untested when its statement finished (with an
//! answer or a database error, either way with the protocol in step); one whose statement
//! failed on the way, timed out or was abandoned mid-flight is closed instead, and one that
//! sat idle is checked before its next use. Everything else (migrations, transactions, the
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

    /// Runs a statement that answers one row on a hot connection.
    pub(crate) async fn fetch_one<'q, O>(
        &self,
        q: QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<O>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        let mut conn = self.checkout().await?;
        let answer = tokio::time::timeout(service_bound(&self.pool), q.fetch_one(conn.get())).await;
        conn.finish(answer, &self.pool)
    }

    /// Runs a statement that answers at most one row on a hot connection.
    pub(crate) async fn fetch_optional<'q, O>(
        &self,
        q: QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<Option<O>>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        let mut conn = self.checkout().await?;
        let answer =
            tokio::time::timeout(service_bound(&self.pool), q.fetch_optional(conn.get())).await;
        conn.finish(answer, &self.pool)
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
    /// or an error the server sent), else closes it; returns the answer.
    fn finish<T>(
        mut self,
        answer: std::result::Result<sqlx::Result<T>, tokio::time::error::Elapsed>,
        pool: &PgPool,
    ) -> Result<T> {
        let conn = self.0.take().expect("finished once");
        match answer {
            Ok(Ok(t)) => Ok(t),
            Ok(Err(e @ sqlx::Error::Database(_))) => Err(StoreError::from(e)),
            Ok(Err(e)) => {
                drop(Object::take(conn));
                Err(StoreError::from(e))
            }
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
