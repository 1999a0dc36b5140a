//! [`Conns`]: the connections an instance talks to its database through.
//!
//! The hot paths (acquire, renew, release, fenced write, read, status) run on a pool of their
//! own, managed by `deadpool`, because sqlx's pool tests every connection with a round trip
//! when it is given back: for a one-statement request that doubles the work of the database.
//! Here a connection goes back to the pool untested when its statement finished (with an
//! answer or an error of the statement, either way with the session in step); one whose
//! statement failed otherwise (the link, a shutdown, a timeout) or was abandoned mid-flight is
//! closed instead, and one that sat idle is checked before its next use. Everything else
//! (migrations, transactions, the audit log, keys, readiness) uses sqlx's own pool.

use std::sync::atomic::{AtomicBool, Ordering};

use deadpool::managed::{self, Metrics, Object, PoolError, RecycleError, RecycleResult, Timeouts};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgPool, PgRow};
use sqlx::query::QueryAs;
use sqlx::{Connection, Executor, FromRow, PgConnection, Postgres};
use tokio::time::Instant;

use super::{
    CHECK_IDLE_AFTER, Result, StoreError, deadline, rolled_back_race, timed_out, timeout_at,
};

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

/// Runs the statement `$q()` with `$fetch` on a hot connection, bounded like every call: the
/// wait for a connection, the statement and any second try end by `$deadline`. A statement that
/// could not be written because the server had already closed the connection (a restart since
/// the connection was last used) never reached it, so it is sent once more on a fresh
/// connection: a restart costs no request an answer. A statement the database rolled back whole
/// for a reason a second run does not meet ([`super::rolled_back_race`]) runs again, until the
/// deadline. A change that was sent and whose answer did not come back is
/// [`StoreError::Indeterminate`]; see [`Effect`].
macro_rules! hot {
    ($conns:ident, $deadline:expr, $effect:ident, $q:ident, $fetch:ident) => {{
        let deadline = $deadline;
        let mut fresh = false;
        loop {
            let mut conn = $conns.checkout(deadline).await?;
            let answer = timeout_at(deadline, $q().$fetch(conn.get())).await;
            match conn.finish(answer, &$conns.pool) {
                Err(e) if !fresh && never_sent(&e) => fresh = true,
                Err(e) if rolled_back_race(&e) && Instant::now() < deadline => continue,
                Err(e) if $effect == Effect::Changes => break Err(e.after_sending()),
                answer => break answer,
            }
        }
    }};
}

/// What a statement does, which decides what a failure after sending it means: nothing for a
/// read, an unknown outcome for a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// It changes nothing.
    Reads,
    /// It changes something and commits as it answers.
    Changes,
}

/// Opens the upload's transaction and makes sure the connection has its upload table, in one
/// round trip; quietly, since the table exists on every upload but a connection's first.
const UPLOAD_BEGIN: &str = "BEGIN; SET LOCAL client_min_messages = warning; \
    CREATE TEMP TABLE IF NOT EXISTS snapfence_upload (body bytea NOT NULL) ON COMMIT DELETE ROWS";
/// Streams a body into the upload table.
const UPLOAD_COPY: &str = "COPY pg_temp.snapfence_upload (body) FROM STDIN (FORMAT binary)";
/// How much of an uploaded body is in the connection's send buffer at once.
const UPLOAD_CHUNK: usize = 64 * 1024;

/// Whether a call failed writing to a connection its server had closed (`EPIPE`): nothing of
/// it was delivered.
fn never_sent(e: &StoreError) -> bool {
    matches!(e, StoreError::Unavailable(sqlx::Error::Io(io)) if io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The connections of an instance: sqlx's pool, and the pool of hot connections for the
/// one-statement paths. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Conns {
    pool: PgPool,
    hot: managed::Pool<Connector>,
}

/// How many requests are using a hot connection, and how many wait for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotPoolStatus {
    /// Connections open.
    pub open: usize,
    /// Connections open and not in use.
    pub idle: usize,
    /// Requests waiting for a connection: for one of the pool, or in a batch not sent yet.
    pub waiting: usize,
    /// The most connections it opens.
    pub max: usize,
}

/// The settings of the hot connections. Their statements are prepared once per connection and
/// run with a generic plan: their shape is fixed (arrays of any length, the same indexes whatever
/// the values), so a plan made for each run's values would cost planning on every batch (more
/// than the statement itself, for an acquire) and find nothing better. A generic plan is made
/// once, from the statistics of that moment, and kept for the life of the connection, so the
/// statements are written to read a batch's rows by key whatever those statistics say (a join
/// planned while `idempotency_records` was nearly empty scanned it whole, and went on scanning
/// it as it grew: an acquire took 9 ms with 100,000 records, against 0.1 ms); a test checks
/// their plans on an empty database (`tests/api/plans.rs`).
pub const HOT_SETTINGS: [(&str, &str); 1] = [("plan_cache_mode", "force_generic_plan")];

impl Conns {
    /// The hot pool beside `pool`, with its connection settings, size and timeout. Opens no
    /// connection until one is needed.
    pub(crate) fn new(pool: PgPool) -> Self {
        let timeout = pool.options().get_acquire_timeout();
        let options = (*pool.connect_options()).clone().options(HOT_SETTINGS);
        // LIFO: the connection used last goes out first, so a light load keeps to the few
        // backends whose caches are warm. FIFO rotated one client's requests through every
        // connection a burst had opened, and each statement then ran ~1.5 x slower
        // (bench/README.md, sixth pass).
        let hot = managed::Pool::builder(Connector(options))
            .max_size(pool.options().get_max_connections() as usize)
            .queue_mode(managed::QueueMode::Lifo)
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

    /// sqlx's pool, for everything but the hot paths.
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The hot pool's state, with `queued` requests waiting in batches not sent yet.
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
    /// When a call starting now for the request being served must have its answer.
    pub(crate) fn deadline(&self) -> Instant {
        deadline(&self.pool)
    }

    /// The error of a call that had no answer by its deadline.
    pub(crate) fn timed_out(&self) -> StoreError {
        timed_out(&self.pool)
    }

    /// Runs a batched statement, which answers a row per request (or none for some), on a hot
    /// connection by `deadline`; see [`hot!`].
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

    /// Runs a statement that answers at most one row on a hot connection; see [`hot!`].
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

    /// Runs a statement that answers one row and reads its body from
    /// `pg_temp.snapfence_upload`, after uploading `body` there, in one short transaction on a
    /// hot connection: begin, make sure the connection has its upload table, `COPY` the body in
    /// [`UPLOAD_CHUNK`]s (so neither the statement's arguments nor the connection's send buffer
    /// ever hold a copy of it), run the statement, commit. The table is temporary and emptied at
    /// commit: the body is durable only as the statement stores it. The connection goes back
    /// only after a commit; after any failure it is closed, never left inside a transaction.
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
        // Until the COMMIT is sent, a failure leaves the transaction uncommitted: nothing
        // happened. After it, the outcome is unknown until its answer comes.
        let committing = AtomicBool::new(false);
        let work = async {
            let c = conn.get();
            c.execute(UPLOAD_BEGIN).await?;
            let mut copy = c.copy_in_raw(UPLOAD_COPY).await?;
            // Binary COPY: the signature, no flags, no extension; one tuple of one field.
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
            let row = q().fetch_one(&mut *c).await?;
            committing.store(true, Ordering::Relaxed);
            c.execute("COMMIT").await?;
            Ok::<O, sqlx::Error>(row)
        };
        let answer = timeout_at(deadline, work).await;
        // After a failure the connection may still be inside the transaction: it is dropped
        // unfinished, which closes it.
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

    /// A hot connection, within the pool's timeout and before `deadline`. deadpool bounds each
    /// step of getting one (the wait, the check of an idle connection, a new connection) but not
    /// their sum: with the database stalled, every idle connection's check would wait out its
    /// own timeout in turn, so the whole checkout is bounded here.
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
        // A large body or answer leaves the connection's buffers as large as it was: given back
        // as they are, every connection of the pool would keep one such buffer for good. (For
        // buffers of the default size this does nothing.)
        let give_back = |mut conn: Object<Connector>| conn.shrink_buffers();
        match answer {
            Ok(Ok(t)) => {
                give_back(conn);
                Ok(t)
            }
            Ok(Err(e)) => match StoreError::from(e) {
                // An error of the statement itself: the session goes on.
                e @ StoreError::Internal(sqlx::Error::Database(_)) => {
                    give_back(conn);
                    Err(e)
                }
                // The rest may have ended the session (a shutdown, a lost link) or left it out
                // of step, and a timeout or overload is better met with a fresh connection.
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
