//! [`Conns`]: the instance's connections. The hot paths use a deadpool pool, since sqlx's tests
//! every returned connection with a round trip, doubling a one-statement request's work.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult, Timeouts};
use futures_util::future::{BoxFuture, try_join_all};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgRow};
use sqlx::query::QueryAs;
use sqlx::{Connection, Executor, FromRow, PgConnection, Postgres};
use std::time::Duration;

use tokio::time::Instant;

use super::batch::Counts;
use super::{
    CHECK_IDLE_AFTER, Pooler, Result, StoreError, deadline, rolled_back_race, timed_out, timeout_at,
};

/// Opens hot connections, checks idle ones, and has their plans made again as they age.
#[derive(Debug)]
pub struct Connector {
    options: PgConnectOptions,
    /// Whether connections keep their plans: not through a pooler, where nothing is kept.
    keeps_plans: bool,
}

impl Connector {
    /// Opens connections with `options` that keep their statements' plans (the hot settings).
    pub fn new(options: PgConnectOptions) -> Self {
        Self {
            options,
            keeps_plans: true,
        }
    }
}

/// A hot connection, and when its plans were made: PostgreSQL plans for the tables' size at the
/// time, so plans made while a table was small would read it whole once it has grown.
#[derive(Debug)]
pub struct HotConn {
    conn: PgConnection,
    planned: std::time::Instant,
}

impl HotConn {
    /// Plans made again once they are three times as old as the connection was when they were
    /// made (at 1, 4, 16, 64 and 256 s of its life: a table growing steadily is then never over
    /// four times the size it was planned for), and then every [`REPLAN_AT_MOST`].
    fn plans_due(&self, created: std::time::Instant) -> bool {
        let made_at_age = self.planned.saturating_duration_since(created);
        let due = (made_at_age * 3).clamp(REPLAN_AFTER, REPLAN_AT_MOST);
        self.planned.elapsed() >= due
    }

    /// Prepares each of `statements` and has PostgreSQL make its generic plan now (`EXPLAIN
    /// EXECUTE` makes and keeps it), so that no request waits for it; answers the plans held.
    pub fn plan_ahead<'c>(
        &'c mut self,
        statements: &'c [&'static str],
    ) -> BoxFuture<'c, sqlx::Result<usize>> {
        Box::pin(async move {
            let conn = &mut self.conn;
            for &sql in statements {
                // sqlx keeps the statement by its text, so requests run this one.
                Executor::prepare(&mut *conn, sql).await?;
                let (name, params): (String, i32) = sqlx::query_as(
                    "SELECT name, cardinality(parameter_types) FROM pg_prepared_statements \
                     WHERE statement = $1",
                )
                .bind(sql)
                .fetch_one(&mut *conn)
                .await?;
                let nulls = vec!["NULL"; usize::try_from(params).unwrap_or(0)].join(", ");
                let explain = format!("EXPLAIN EXECUTE {name}({nulls})");
                conn.execute(explain.as_str()).await?;
            }
            self.planned = std::time::Instant::now();
            let (held,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM pg_prepared_statements \
                 WHERE statement = ANY($1) AND generic_plans > 0",
            )
            .bind(statements)
            .fetch_one(&mut self.conn)
            .await?;
            Ok(usize::try_from(held).unwrap_or(0))
        })
    }
}

impl std::ops::Deref for HotConn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for HotConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

/// A hot connection's first plans are made again after this; later ones at three times the
/// connection's age when they were made, up to every five minutes.
pub const REPLAN_AFTER: Duration = Duration::from_secs(1);
const REPLAN_AT_MOST: Duration = Duration::from_secs(300);

impl managed::Manager for Connector {
    type Type = HotConn;
    type Error = sqlx::Error;

    async fn create(&self) -> sqlx::Result<HotConn> {
        Ok(HotConn {
            conn: PgConnection::connect_with(&self.options).await?,
            planned: std::time::Instant::now(),
        })
    }

    async fn recycle(&self, hot: &mut HotConn, m: &Metrics) -> RecycleResult<sqlx::Error> {
        if self.keeps_plans && hot.plans_due(m.created) {
            // Prepared statements stay; each is planned again at its next use, for the tables'
            // size then (PostgreSQL scales the sizes its statistics saw to the current ones).
            hot.conn
                .execute("DISCARD PLANS")
                .await
                .map_err(RecycleError::Backend)?;
            hot.planned = std::time::Instant::now();
        } else if m.last_used() >= CHECK_IDLE_AFTER {
            hot.conn.ping().await.map_err(RecycleError::Backend)?;
        }
        Ok(())
    }
}

/// Runs `$q()` with `$fetch` on a hot connection by `$deadline`. A statement that met a connection
/// the server had closed never reached it and is sent once more on a fresh one; one the database
/// rolled back for a race ([`super::rolled_back_race`]) runs again until the deadline. A change
/// whose answer was lost is [`StoreError::Indeterminate`].
macro_rules! hot {
    ($conns:ident, $deadline:expr, $effect:ident, $q:ident, $fetch:ident) => {{
        let deadline = $deadline;
        let mut fresh = false;
        loop {
            let mut conn = $conns.checkout(deadline).await?;
            let c = conn.get();
            let answer = if $conns.opening.persistent {
                timeout_at(deadline, $q().$fetch(c)).await
            } else {
                let pooled = async {
                    $conns.opening.begin(c).await?;
                    let rows = $q().persistent(false).$fetch(&mut *c).await;
                    $conns.opening.end(c, rows).await
                };
                timeout_at(deadline, pooled).await
            };
            match conn.finish(answer, &$conns.pool) {
                Err(e) if !fresh && never_sent(&e) => fresh = true,
                Err(e) if rolled_back_race(&e) && Instant::now() < deadline => continue,
                Err(e) if $effect == Effect::Changes => break Err(e.after_sending()),
                answer => break answer,
            }
        }
    }};
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    Reads,
    /// A change that commits as it answers.
    Changes,
}

/// Run after `BEGIN` (and a pooled connection's settings).
const UPLOAD_TABLE: &str = "SET LOCAL client_min_messages = warning; \
    CREATE TEMP TABLE IF NOT EXISTS snapfence_upload (body bytea NOT NULL) ON COMMIT DELETE ROWS";
const UPLOAD_COPY: &str = "COPY pg_temp.snapfence_upload (body) FROM STDIN (FORMAT binary)";
const UPLOAD_CHUNK: usize = 64 * 1024;

fn never_sent(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(sqlx::Error::Io(io)) if io.kind() == std::io::ErrorKind::BrokenPipe)
}

#[derive(Debug, Clone)]
pub(crate) struct Conns {
    pool: PgPool,
    hot: managed::Pool<Connector>,
    opening: Opening,
    /// Each batch kind's counts, by name (a kind started twice counts once).
    batches: Arc<Mutex<BTreeMap<&'static str, Arc<Counts>>>>,
}

/// The batches of one kind sent since start, and the requests they carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchTotals {
    /// The kind: `acquire`, `put`, `txn`, ...
    pub kind: &'static str,
    /// Batches sent.
    pub batches: u64,
    /// Requests they carried.
    pub requests: u64,
}

/// Hot connections opened ahead of load ([`Db::warm`](crate::store::Db::warm)), and the generic
/// plans they hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Warmed {
    /// Connections opened and planned.
    pub connections: usize,
    /// Statements planned, summed over the connections.
    pub plans: usize,
}

/// How many requests are using a hot connection, and how many wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotPoolStatus {
    /// Connections open.
    pub open: usize,
    /// Connections open and not in use.
    pub idle: usize,
    /// Requests waiting for a connection or in a batch not sent yet.
    pub waiting: usize,
    /// The most connections it opens.
    pub max: usize,
}

/// The hot connections' settings: generic plans, made once for every batch size and kept until
/// [`REPLAN_AFTER`] says, so a statement reads a batch's rows by key (`tests/api/plans.rs`).
pub const HOT_SETTINGS: [(&str, &str); 1] = [("plan_cache_mode", "force_generic_plan")];

impl Conns {
    pub(crate) fn new(pool: PgPool, pooler: Option<Pooler>) -> Self {
        let timeout = pool.options().get_acquire_timeout();
        let (options, size, opening) = match pooler {
            Some(p) => (p.options, p.size, Opening::pooled(p.begin)),
            None => (
                (*pool.connect_options()).clone().options(HOT_SETTINGS),
                pool.options().get_max_connections(),
                Opening::direct(),
            ),
        };
        // LIFO keeps a light load on the backends with warm caches (FIFO ran ~1.5x slower).
        let connector = Connector {
            options,
            keeps_plans: opening.persistent,
        };
        let hot = managed::Pool::builder(connector)
            .max_size(size as usize)
            .queue_mode(managed::QueueMode::Lifo)
            .timeouts(Timeouts {
                wait: Some(timeout),
                create: Some(timeout),
                recycle: Some(timeout),
            })
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .expect("a runtime is set, so the timeouts can be");
        Self {
            pool,
            hot,
            opening,
            batches: Arc::default(),
        }
    }

    pub(crate) fn batch_counts(&self, kind: &'static str) -> Arc<Counts> {
        let mut batches = self.batches.lock().expect("never poisoned");
        batches.entry(kind).or_default().clone()
    }

    pub(crate) fn batch_totals(&self) -> Vec<BatchTotals> {
        let batches = self.batches.lock().expect("never poisoned");
        batches
            .iter()
            .map(|(&kind, counts)| {
                let (batches, requests) = counts.totals();
                BatchTotals {
                    kind,
                    batches,
                    requests,
                }
            })
            .collect()
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Opens up to `n` hot connections at once and plans `statements` on each, so that a burst
    /// right after start meets connections ready (opening one and planning every statement takes
    /// about 30 ms of CPU, on the request path otherwise). Through a pooler nothing is kept.
    pub(crate) async fn warm(&self, n: usize, statements: &[&'static str]) -> Result<Warmed> {
        if !self.opening.persistent {
            return Ok(Warmed::default());
        }
        let n = n.min(self.hot.status().max_size);
        let mut conns = try_join_all((0..n).map(|_| self.checkout(self.deadline()))).await?;
        let plans = try_join_all(conns.iter_mut().map(|c| c.hot().plan_ahead(statements))).await;
        let plans = plans.map_err(StoreError::from)?;
        for conn in conns {
            conn.give_back();
        }
        Ok(Warmed {
            connections: n,
            plans: plans.into_iter().sum(),
        })
    }

    pub(crate) fn hot_status(&self, queued: usize) -> HotPoolStatus {
        let s = self.hot.status();
        HotPoolStatus {
            open: s.size,
            idle: s.available,
            waiting: s.waiting + queued,
            max: s.max_size,
        }
    }
}

impl Conns {
    pub(crate) fn deadline(&self) -> Instant {
        deadline(&self.pool)
    }

    pub(crate) fn timed_out(&self) -> StoreError {
        timed_out(&self.pool)
    }

    pub(crate) async fn fetch_batch<'q, O>(
        &self,
        effect: Effect,
        deadline: Instant,
        q: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<Vec<O>>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        hot!(self, deadline, effect, q, fetch_all)
    }

    pub(crate) async fn fetch_optional<'q, O>(
        &self,
        effect: Effect,
        q: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<Option<O>>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        hot!(self, self.deadline(), effect, q, fetch_optional)
    }

    /// Runs a one-row statement reading its body from `pg_temp.snapfence_upload`, after a binary
    /// `COPY` of `body` in [`UPLOAD_CHUNK`]s, so no argument or send buffer holds a copy. One short
    /// transaction; the table is emptied at commit. After any failure the connection is closed,
    /// never left in a transaction.
    pub(crate) async fn fetch_one_uploading<'q, O>(
        &self,
        body: &[u8],
        q: impl Fn() -> QueryAs<'q, Postgres, O, PgArguments>,
    ) -> Result<O>
    where
        O: Send + Unpin + for<'r> FromRow<'r, PgRow>,
    {
        let len = i32::try_from(body.len()).map_err(|_| {
            StoreError::Internal(sqlx::Error::Protocol(format!(
                "a body of {} bytes is over PostgreSQL's limit",
                body.len()
            )))
        })?;
        let deadline = deadline(&self.pool);
        let mut conn = self.checkout(deadline).await?;
        let committing = AtomicBool::new(false);
        let work = async {
            let c = conn.get();
            let begin = &self.opening.begin;
            c.execute(format!("{begin}; {UPLOAD_TABLE}").as_str())
                .await?;
            let mut copy = c.copy_in_raw(UPLOAD_COPY).await?;
            let mut head = Vec::with_capacity(25);
            head.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
            head.extend_from_slice(&[0; 8]);
            head.extend_from_slice(&1i16.to_be_bytes());
            head.extend_from_slice(&len.to_be_bytes());
            copy.send(head).await?;
            for chunk in body.chunks(UPLOAD_CHUNK) {
                copy.send(chunk).await?;
            }
            copy.send(&(-1i16).to_be_bytes()[..]).await?;
            copy.finish().await?;
            let row = q()
                .persistent(self.opening.persistent)
                .fetch_one(&mut *c)
                .await?;
            committing.store(true, Ordering::Relaxed);
            c.execute("COMMIT").await?;
            Ok::<O, sqlx::Error>(row)
        };
        let answer = timeout_at(deadline, work).await;
        let failed = match answer {
            Ok(Ok(row)) => return conn.finish(Ok(Ok(row)), &self.pool),
            Ok(Err(e)) => StoreError::from(e),
            Err(_) => timed_out(&self.pool),
        };
        Err(if committing.load(Ordering::Relaxed) {
            failed.after_sending()
        } else {
            failed
        })
    }

    /// A transaction on a hot connection, for work of more than one statement. Dropped unfinished,
    /// its connection is closed, so the server rolls it back.
    pub(crate) async fn begin(&self, deadline: Instant) -> Result<HotTx> {
        let mut conn = self.checkout(deadline).await?;
        self.opening.begin(conn.get()).await?;
        Ok(HotTx {
            conn,
            opening: self.opening.clone(),
        })
    }

    /// deadpool bounds each step of a checkout but not their sum.
    async fn checkout(&self, deadline: Instant) -> Result<Checkout> {
        let limit = deadline.min(Instant::now() + self.pool.options().get_acquire_timeout());
        match tokio::time::timeout_at(limit, self.hot.get()).await {
            Ok(Ok(conn)) => Ok(Checkout(Some(conn))),
            Ok(Err(PoolError::Backend(e))) => Err(StoreError::from(e)),
            Ok(Err(PoolError::Closed)) => Err(StoreError::Unavailable(sqlx::Error::PoolClosed)),
            Ok(Err(_)) | Err(_) => Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
        }
    }
}

/// How a hot connection's transactions open, and whether its statements may be kept prepared:
/// through a transaction-mode pooler each opens with the pooler's settings and statements stay
/// unnamed, since the next transaction may run on another server connection.
#[derive(Debug, Clone)]
struct Opening {
    begin: Arc<str>,
    persistent: bool,
}

impl Opening {
    fn direct() -> Self {
        Self {
            begin: Arc::from("BEGIN"),
            persistent: true,
        }
    }

    fn pooled(begin: impl Into<Arc<str>>) -> Self {
        Self {
            begin: begin.into(),
            persistent: false,
        }
    }

    async fn begin(&self, c: &mut PgConnection) -> sqlx::Result<()> {
        c.execute(&*self.begin).await.map(drop)
    }

    /// Commits after `work` succeeded, else rolls back.
    async fn end<T>(&self, c: &mut PgConnection, work: sqlx::Result<T>) -> sqlx::Result<T> {
        match work {
            Ok(t) => c.execute("COMMIT").await.map(|_| t),
            Err(e) => {
                // A failed rollback leaves a broken link, which the next statement on it finds
                // before it is sent.
                let _ = c.execute("ROLLBACK").await;
                Err(e)
            }
        }
    }
}

/// See [`Conns::begin`].
pub(crate) struct HotTx {
    conn: Checkout,
    opening: Opening,
}

impl HotTx {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.conn.get()
    }

    pub(crate) fn persistent(&self) -> bool {
        self.opening.persistent
    }

    pub(crate) async fn commit(self) -> Result<()> {
        self.end("COMMIT").await
    }

    pub(crate) async fn rollback(self) -> Result<()> {
        self.end("ROLLBACK").await
    }

    async fn end(mut self, sql: &str) -> Result<()> {
        self.conn.get().execute(sql).await?;
        if let Some(mut conn) = self.conn.0.take() {
            conn.shrink_buffers();
        }
        Ok(())
    }
}

struct Checkout(Option<Object<Connector>>);

impl Checkout {
    fn get(&mut self) -> &mut PgConnection {
        self.0.as_mut().expect("in use until finished")
    }

    fn hot(&mut self) -> &mut HotConn {
        self.0.as_mut().expect("in use until finished")
    }

    /// Back to the pool; dropped instead, a checkout's connection is closed.
    fn give_back(mut self) {
        drop(self.0.take());
    }

    fn finish<T>(
        mut self,
        answer: std::result::Result<sqlx::Result<T>, tokio::time::error::Elapsed>,
        pool: &PgPool,
    ) -> Result<T> {
        let conn = self.0.take().expect("finished once");
        // Shrink buffers a large body grew, or every pooled connection keeps one for good.
        let give_back = |mut conn: Object<Connector>| conn.shrink_buffers();
        match answer {
            Ok(Ok(t)) => {
                give_back(conn);
                Ok(t)
            }
            Ok(Err(e)) => match StoreError::from(e) {
                e @ StoreError::Internal(sqlx::Error::Database(_)) => {
                    give_back(conn);
                    Err(e)
                }
                e => {
                    drop(Object::take(conn));
                    Err(e)
                }
            },
            Err(_) => {
                drop(Object::take(conn));
                Err(timed_out(pool))
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
