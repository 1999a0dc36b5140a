//! The `leases` table: grants, renewals, releases, recovery records, and the token sequence.
//!
//! Each key has one row, made by its first grant and never deleted. Every statement here that
//! changes a lease first takes the row lock of its key (`FOR NO KEY UPDATE` or the `UPDATE`
//! itself), and under READ COMMITTED a row lock always yields the row's newest committed version
//! (the executor re-reads it once the lock is granted). So each statement decides on the state
//! that is current when it holds the lock, and two statements on one key, from any instances,
//! take effect one after the other.

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgPool};

use super::{Bounded, Db, RequestContext, Result};
use crate::domain::{
    Cursor, FencingToken, Key, KeyPrefix, KeyStatus, Lease, LeaseState, Metadata, Owner, Page,
    PageLimit, RecoveryReason, RecoveryRecord, TtlMs,
};

/// What a caller asks for when it acquires a key.
#[derive(Debug, Clone)]
pub struct NewLease {
    /// The key.
    pub key: Key,
    /// The would-be holder.
    pub owner: Owner,
    /// The lease's time to live.
    pub ttl: TtlMs,
    /// Metadata to keep with the lease.
    pub metadata: Option<Metadata>,
    /// Whether an expiry should leave a recovery record.
    pub crash_recovery: bool,
    /// Whether the caller states that a retained recovery record has been dealt with.
    pub reconciled: bool,
}

/// How an acquire ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AcquireOutcome {
    /// The lease is granted with a new token. `recovered` is the recovery record it replaced.
    Granted {
        /// The new lease.
        lease: Lease,
        /// The record that `reconciled: true` replaced, if there was one.
        recovered: Option<RecoveryRecord>,
    },
    /// Another lease is live; nothing changed.
    Held {
        /// The live lease.
        holder: Lease,
    },
    /// A recovery record is retained and the caller did not say it was reconciled; nothing
    /// changed.
    RecoveryRequired {
        /// The retained record.
        recovery: RecoveryRecord,
    },
}

/// How a change to a live lease (renew, release, abandon, require-recovery) ended.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseChange {
    /// The token was the key's live lease and the change is made.
    Done(Lease),
    /// The token is not the key's live lease (expired, released, superseded or never issued);
    /// nothing changed.
    Lost,
}

/// The columns of a lease, as every statement here returns them, with a prefix.
macro_rules! lease_columns {
    ($t:literal, $p:literal) => {
        concat!(
            $t,
            ".key AS ",
            $p,
            "key, ",
            $t,
            ".token AS ",
            $p,
            "token, ",
            $t,
            ".owner AS ",
            $p,
            "owner, ",
            $t,
            ".ttl_ms AS ",
            $p,
            "ttl_ms, ",
            $t,
            ".metadata AS ",
            $p,
            "metadata, ",
            $t,
            ".crash_recovery AS ",
            $p,
            "crash_recovery, ",
            $t,
            ".recovery_required AS ",
            $p,
            "recovery_required, ",
            $t,
            ".acquired_at AS ",
            $p,
            "acquired_at, ",
            $t,
            ".expires_at AS ",
            $p,
            "expires_at, ",
            $t,
            ".ended_at AS ",
            $p,
            "ended_at"
        )
    };
}

/// The recovery reason and state of a lease row, by the rules in the migration's functions.
macro_rules! derived_columns {
    ($t:literal) => {
        concat!(
            "lease_recovery_reason(",
            $t,
            ".end_reason, ",
            $t,
            ".expires_at, ",
            $t,
            ".crash_recovery, ",
            $t,
            ".recovery_required, now()) AS recovery_reason, ",
            "lease_state(",
            $t,
            ".end_reason, ",
            $t,
            ".expires_at, ",
            $t,
            ".crash_recovery, ",
            $t,
            ".recovery_required, now()) AS state"
        )
    };
}

/// A lease row as read from the database.
#[derive(Debug, FromRow)]
struct LeaseRow {
    key: String,
    token: i64,
    owner: String,
    ttl_ms: i64,
    metadata: Option<serde_json::Value>,
    crash_recovery: bool,
    recovery_required: bool,
    acquired_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    ended_at: Option<DateTime<Utc>>,
}

/// A lease row with its derived recovery reason and state.
#[derive(Debug, FromRow)]
struct StatusRow {
    #[sqlx(flatten)]
    lease: LeaseRow,
    recovery_reason: Option<String>,
    state: String,
}

impl LeaseRow {
    /// Values in the database were checked on the way in; a row that fails the checks means the
    /// schema and the code disagree, which is a bug worth a loud error rather than a guess.
    fn into_lease(self) -> Lease {
        Lease {
            key: Key::parse(self.key).expect("stored keys are valid"),
            owner: Owner::parse(self.owner).expect("stored owners are valid"),
            token: FencingToken::new(self.token).expect("stored tokens are positive"),
            acquired_at: self.acquired_at,
            expires_at: self.expires_at,
            ttl_ms: TtlMs::from_stored(self.ttl_ms),
            metadata: self.metadata.map(Metadata::from_stored),
            crash_recovery: self.crash_recovery,
            recovery_required: self.recovery_required,
        }
    }

    fn recovery_record(&self, reason: &str) -> RecoveryRecord {
        RecoveryRecord {
            owner: Owner::parse(self.owner.clone()).expect("stored owners are valid"),
            token: FencingToken::new(self.token).expect("stored tokens are positive"),
            acquired_at: self.acquired_at,
            ended_at: self.ended_at.unwrap_or(self.expires_at),
            reason: RecoveryReason::parse(reason).expect("lease_recovery_reason's values"),
            metadata: self.metadata.clone().map(Metadata::from_stored),
        }
    }
}

impl StatusRow {
    fn into_status(self) -> KeyStatus {
        let recovery = self
            .recovery_reason
            .as_deref()
            .map(|r| self.lease.recovery_record(r));
        let lease = self.lease.into_lease();
        KeyStatus {
            key: lease.key.clone(),
            state: LeaseState::parse(&self.state).expect("lease_state's values"),
            newest_token: lease.token,
            lease,
            recovery,
        }
    }
}

/// The acquire statement. `cur` locks the key's row, if it exists, and yields its newest
/// version; `decision` applies the contract's rules to it; exactly one of `granted` (an
/// existing row, updated in place) and `inserted` (the key's first grant) runs; a reconciled
/// record is written to `recoveries` in the same statement, so the grant and its audit row
/// commit together.
///
/// Race-freedom: on an existing key, every acquire, renew, release and write of that key waits
/// for the row lock, so `decision` sees the state left by the last of them. On a new key there
/// is no row to lock: concurrent first acquires all try the `INSERT`, the primary key lets one
/// win, and the losers' `ON CONFLICT DO NOTHING` yields no row; their verdict is `insert` with
/// no lease, and [`acquire`] runs the statement again, now against the winner's row. Tokens are
/// drawn only once the row is locked (or inserted), so per key they increase in grant order.
/// They are drawn with `next_fencing_token()`, which secures the sequence on the server's
/// timeline first (see [`super::timeline`]), so a promoted standby never repeats a token.
pub(crate) const ACQUIRE: &str = concat!(
    "WITH cur AS (SELECT ", lease_columns!("l", ""), ", ", derived_columns!("l"), "
        FROM leases l WHERE l.key = $1 FOR NO KEY UPDATE),
    decision AS (
        SELECT CASE
            WHEN cur.key IS NULL THEN 'insert'
            WHEN cur.state = 'held' THEN 'held'
            WHEN cur.recovery_reason IS NOT NULL AND NOT $6 THEN 'recovery_required'
            ELSE 'grant'
        END AS verdict
        FROM (VALUES (1)) AS one LEFT JOIN cur ON true),
    granted AS (
        UPDATE leases SET token = next_fencing_token(), owner = $2, ttl_ms = $3::bigint,
            metadata = $4::json, crash_recovery = $5, recovery_required = false, acquired_at = now(),
            expires_at = now() + $3 * interval '1 millisecond', end_reason = NULL, ended_at = NULL
        FROM decision WHERE leases.key = $1 AND decision.verdict = 'grant'
        RETURNING leases.*),
    inserted AS (
        INSERT INTO leases (key, token, owner, ttl_ms, metadata, crash_recovery, acquired_at, expires_at)
        SELECT $1, next_fencing_token(), $2, $3, $4::json, $5, now(), now() + $3 * interval '1 millisecond'
        FROM decision WHERE decision.verdict = 'insert'
        ON CONFLICT (key) DO NOTHING
        RETURNING *),
    new_lease AS (SELECT * FROM granted UNION ALL SELECT * FROM inserted),
    reconciled AS (
        INSERT INTO recoveries (key, reason, record_owner, record_token, record_acquired_at,
            record_ended_at, record_metadata, reconciled_by, new_token, request_id, remote_addr, principal)
        SELECT cur.key, cur.recovery_reason, cur.owner, cur.token, cur.acquired_at,
            coalesce(cur.ended_at, cur.expires_at), cur.metadata, new_lease.owner, new_lease.token, $7, $8, $9
        FROM cur, new_lease WHERE cur.recovery_reason IS NOT NULL)
    SELECT decision.verdict, ", lease_columns!("n", "n_"), ", cur.*
    FROM decision LEFT JOIN new_lease n ON true LEFT JOIN cur ON true"
);

#[derive(Debug, FromRow)]
struct AcquireRow {
    verdict: String,
    #[sqlx(flatten)]
    granted: PrefixedLease,
    #[sqlx(flatten)]
    current: StatusRowOpt,
}

/// The new lease's columns, `n_`-prefixed; all NULL when nothing was granted.
#[derive(Debug, FromRow)]
struct PrefixedLease {
    n_key: Option<String>,
    n_token: Option<i64>,
    n_owner: Option<String>,
    n_ttl_ms: Option<i64>,
    n_metadata: Option<serde_json::Value>,
    n_crash_recovery: Option<bool>,
    n_recovery_required: Option<bool>,
    n_acquired_at: Option<DateTime<Utc>>,
    n_expires_at: Option<DateTime<Utc>>,
    n_ended_at: Option<DateTime<Utc>>,
}

impl PrefixedLease {
    fn into_row(self) -> Option<LeaseRow> {
        Some(LeaseRow {
            key: self.n_key?,
            token: self.n_token?,
            owner: self.n_owner?,
            ttl_ms: self.n_ttl_ms?,
            metadata: self.n_metadata,
            crash_recovery: self.n_crash_recovery?,
            recovery_required: self.n_recovery_required?,
            acquired_at: self.n_acquired_at?,
            expires_at: self.n_expires_at?,
            ended_at: self.n_ended_at,
        })
    }
}

/// The locked row's columns; all NULL on a key's first acquire.
#[derive(Debug, FromRow)]
struct StatusRowOpt {
    key: Option<String>,
    token: Option<i64>,
    owner: Option<String>,
    ttl_ms: Option<i64>,
    metadata: Option<serde_json::Value>,
    crash_recovery: Option<bool>,
    recovery_required: Option<bool>,
    acquired_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    ended_at: Option<DateTime<Utc>>,
    recovery_reason: Option<String>,
    state: Option<String>,
}

impl StatusRowOpt {
    fn into_row(self) -> Option<StatusRow> {
        Some(StatusRow {
            lease: LeaseRow {
                key: self.key?,
                token: self.token?,
                owner: self.owner?,
                ttl_ms: self.ttl_ms?,
                metadata: self.metadata,
                crash_recovery: self.crash_recovery?,
                recovery_required: self.recovery_required?,
                acquired_at: self.acquired_at?,
                expires_at: self.expires_at?,
                ended_at: self.ended_at,
            },
            recovery_reason: self.recovery_reason,
            state: self.state?,
        })
    }
}

/// Acquires a key: one statement (`ACQUIRE`), run a second time only when it lost the race
/// to create a new key's row (rows are never deleted, so a second run always finds one).
#[tracing::instrument(level = "debug", skip_all, fields(key = %req.key))]
pub async fn acquire(db: &Db, req: &NewLease, ctx: &RequestContext) -> Result<AcquireOutcome> {
    loop {
        let row: AcquireRow = db
            .fetch_one(|| {
                sqlx::query_as(ACQUIRE)
                    .bind(req.key.as_str())
                    .bind(req.owner.as_str())
                    .bind(req.ttl.get())
                    .bind(req.metadata.as_ref().map(|m| m.as_json().to_string()))
                    .bind(req.crash_recovery)
                    .bind(req.reconciled)
                    .bind(ctx.request_id.as_deref())
                    .bind(ctx.remote_addr.as_deref())
                    .bind(ctx.principal.as_deref())
            })
            .await?;
        let granted = row.granted.into_row();
        let current = row.current.into_row();
        match (row.verdict.as_str(), granted, current) {
            ("insert", None, _) => continue,
            ("insert" | "grant", Some(lease), current) => {
                let recovered = current.and_then(|c| {
                    let reason = c.recovery_reason.clone()?;
                    Some(c.lease.recovery_record(&reason))
                });
                return Ok(AcquireOutcome::Granted {
                    lease: lease.into_lease(),
                    recovered,
                });
            }
            ("held", _, Some(c)) => {
                return Ok(AcquireOutcome::Held {
                    holder: c.lease.into_lease(),
                });
            }
            ("recovery_required", _, Some(c)) => {
                let reason = c.recovery_reason.clone().expect("a verdict needs a reason");
                return Ok(AcquireOutcome::RecoveryRequired {
                    recovery: c.lease.recovery_record(&reason),
                });
            }
            (verdict, ..) => unreachable!("acquire verdict {verdict} without its row"),
        }
    }
}

/// The renew statement ([`renew`]).
pub(crate) const RENEW: &str = concat!(
    "UPDATE leases l SET ttl_ms = coalesce($3, l.ttl_ms),
        expires_at = now() + coalesce($3, l.ttl_ms) * interval '1 millisecond'
    WHERE l.key = $1 AND l.token = $2 AND l.end_reason IS NULL AND l.expires_at > now()
    RETURNING ",
    lease_columns!("l", "")
);

/// Renews a live lease: one `UPDATE` whose `WHERE` requires the token to be the key's live
/// lease. The row lock it takes re-checks that condition on the newest version of the row, so a
/// renew racing a takeover either lands before it (and the takeover sees a live lease) or sees
/// the new token and changes nothing.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key))]
pub async fn renew(
    db: &Db,
    key: &Key,
    token: FencingToken,
    ttl: Option<TtlMs>,
) -> Result<LeaseChange> {
    let row: Option<LeaseRow> = db
        .fetch_optional(|| {
            sqlx::query_as(RENEW)
                .bind(key.as_str())
                .bind(token.get())
                .bind(ttl.map(TtlMs::get))
        })
        .await?;
    Ok(row.map_or(LeaseChange::Lost, |r| LeaseChange::Done(r.into_lease())))
}

/// How a holder ends or marks its live lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Release: the key is free at once (unless marked by require-recovery).
    Release,
    /// Abandon: the key is unlocked but keeps a recovery record.
    Abandon,
    /// Require-recovery: the lease stays live; its end will leave a recovery record.
    RequireRecovery,
}

/// Releases, abandons or marks a live lease: one `UPDATE` with the same live-lease condition as
/// [`renew`], and race-free for the same reason.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key, ending = ?ending))]
pub async fn end(db: &Db, key: &Key, token: FencingToken, ending: Ending) -> Result<LeaseChange> {
    const WHERE_LIVE: &str = " WHERE l.key = $1 AND l.token = $2 AND l.end_reason IS NULL AND l.expires_at > now() RETURNING ";
    const COLUMNS: &str = lease_columns!("l", "");
    let set = match ending {
        Ending::Release => "UPDATE leases l SET end_reason = 'released', ended_at = now()",
        Ending::Abandon => "UPDATE leases l SET end_reason = 'abandoned', ended_at = now()",
        Ending::RequireRecovery => "UPDATE leases l SET recovery_required = true",
    };
    let sql = [set, WHERE_LIVE, COLUMNS].concat();
    let row: Option<LeaseRow> = db
        .fetch_optional(|| sqlx::query_as(&sql).bind(key.as_str()).bind(token.get()))
        .await?;
    Ok(row.map_or(LeaseChange::Lost, |r| LeaseChange::Done(r.into_lease())))
}

/// A key's newest lease, state and recovery record. A plain read: it sees the latest committed
/// state and changes nothing.
pub async fn status(db: &Db, key: &Key) -> Result<Option<KeyStatus>> {
    const STATUS: &str = concat!(
        "SELECT ",
        lease_columns!("l", ""),
        ", ",
        derived_columns!("l"),
        " FROM leases l WHERE l.key = $1"
    );
    let row: Option<StatusRow> = db
        .fetch_optional(|| sqlx::query_as(STATUS).bind(key.as_str()))
        .await?;
    Ok(row.map(StatusRow::into_status))
}

/// A page of keys in key order, after `after`, under `prefix`, optionally in one state.
#[derive(Debug, Clone)]
pub struct ListQuery {
    /// Only keys that start with this.
    pub prefix: KeyPrefix,
    /// Only keys in this state.
    pub state: Option<LeaseState>,
    /// Page size.
    pub limit: PageLimit,
    /// Resume after this key.
    pub after: Option<String>,
}

/// Lists keys: a keyset scan of the primary key index over `[prefix, upper_bound)`, after the
/// cursor, so a page costs the same on the first and the millionth key.
pub async fn list(pool: &PgPool, q: &ListQuery) -> Result<Page<KeyStatus>> {
    const LIST: &str = concat!(
        "SELECT ",
        lease_columns!("l", ""),
        ", ",
        derived_columns!("l"),
        " FROM leases l
        WHERE l.key >= $1 AND l.key < $2 AND l.key > $3
          AND ($4::text IS NULL OR lease_state(l.end_reason, l.expires_at, l.crash_recovery,
                                               l.recovery_required, now()) = $4)
        ORDER BY l.key LIMIT $5"
    );
    let rows: Vec<StatusRow> = sqlx::query_as(LIST)
        .bind(q.prefix.as_str())
        .bind(q.prefix.upper_bound())
        .bind(q.after.as_deref().unwrap_or(""))
        .bind(q.state.map(LeaseState::as_str))
        .bind(q.limit.get() + 1)
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    let items = rows.into_iter().map(StatusRow::into_status).collect();
    Ok(Page::from_rows(items, q.limit, |s: &KeyStatus| {
        Cursor::after(s.key.as_str())
    }))
}

/// Moves the token sequence past every token already stored, so that a database restored from
/// an older backup, or a sequence reset by hand, never hands out a token twice. Returns the new
/// position when it had to move.
///
/// `SHARE ROW EXCLUSIVE` conflicts with the `ROW EXCLUSIVE` lock that every grant holds from
/// before it draws its token until it commits, so while this runs no grant is in flight: the
/// maximum it reads is final, and `setval` cannot move the sequence back past a token that a
/// concurrent grant drew.
pub async fn ensure_sequence_ahead(pool: &PgPool) -> Result<Option<i64>> {
    let mut tx = pool.begin().bounded(pool).await?;
    sqlx::query("LOCK TABLE leases IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .bounded(pool)
        .await?;
    let moved: Option<i64> = sqlx::query_scalar(
        "SELECT setval('fencing_token_seq', t.m)
         FROM (SELECT max(token) AS m FROM leases) t, fencing_token_seq s
         WHERE t.m IS NOT NULL AND (t.m > s.last_value OR (t.m = s.last_value AND NOT s.is_called))",
    )
    .fetch_optional(&mut *tx)
    .bounded(pool)
    .await?;
    tx.commit().bounded(pool).await?;
    if let Some(position) = moved {
        tracing::warn!(
            position,
            "the token sequence was behind stored tokens; moved it past them"
        );
    }
    Ok(moved)
}

/// How many keys have an open recovery record now, for the metrics gauge. Only keys whose newest
/// lease can leave one are read (the partial index `leases_recovery_candidates`); the clock
/// decides among those. Bounded like every other statement.
pub async fn count_recovery_pending(pool: &PgPool) -> Result<i64> {
    // The first predicate is implied by the second (see `lease_recovery_reason`); it is spelled
    // out so that the planner reads only the rows of the partial index
    // `leases_recovery_candidates`.
    sqlx::query_scalar(
        "SELECT count(*) FROM leases l
         WHERE (l.end_reason = 'abandoned' OR l.recovery_required OR l.crash_recovery)
           AND lease_recovery_reason(l.end_reason, l.expires_at, l.crash_recovery,
                                     l.recovery_required, now()) IS NOT NULL",
    )
    .fetch_one(pool)
    .bounded(pool)
    .await
}
