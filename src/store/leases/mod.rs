//! The `leases` table: grants, renewals, releases, recovery records, and the token sequence.
//!
//! Each key has one row, made by its first grant and never deleted. Every statement here that
//! changes a lease first takes the row lock of its key (`FOR NO KEY UPDATE` or the `UPDATE`
//! itself), and under READ COMMITTED a row lock always yields the row's newest committed version
//! (the executor re-reads it once the lock is granted). So each statement decides on the state
//! that is current when it holds the lock, and two statements on one key, from any instances,
//! take effect one after the other.

mod batches;
pub mod queue;
mod rows;
pub mod timeline;
pub mod waiters;

use batches::ChangeJob;
pub(crate) use batches::{ACQUIRE, AcquireBatch, AcquireJob, Batches, END, RECONCILED, RENEW};
use rows::{AcquireAnswer, ChangeAnswer, StatusRow};

use sqlx::PgPool;

use super::engine::conns::Effect;
use super::idempotency::{self, Gated};
use super::{Bounded, Db, RequestContext, Result};
use crate::domain::{
    Cursor, FencingToken, Key, KeyPrefix, KeyStatus, Lease, LeaseState, Metadata, Owner, Page,
    PageLimit, RecoveryRecord, TtlMs,
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
    /// v1.2: whether the caller reconciles while holding the key: a grant over a retained
    /// recovery record keeps the record until [`reconciled`] confirms. Exclusive with
    /// `reconciled` (the HTTP layer refuses both).
    pub reconciling: bool,
}

/// How an acquire ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AcquireOutcome {
    /// The lease is granted with a new token. `recovered` is the recovery record it replaced,
    /// `kept` the one a reconciling grant keeps (at most one of the two is set).
    Granted {
        /// The new lease.
        lease: Lease,
        /// The record that `reconciled: true` replaced, if there was one.
        recovered: Option<Box<RecoveryRecord>>,
        /// The record that `reconciling: true` keeps until the holder confirms, if there was
        /// one.
        kept: Option<Box<RecoveryRecord>>,
    },
    /// Another lease is live, or the key is free and goes to live waiters queued before this
    /// request; nothing changed.
    Held {
        /// The live lease; on a free key, the last one.
        holder: Lease,
        /// The key's state as the statement found it: `held`, or the free state of a key that
        /// goes to `waiters`.
        state: LeaseState,
        /// How many live waiters the free key goes to before this request; `None` while a lease
        /// holds it (and in answers remembered before it was counted).
        waiters: Option<i64>,
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

/// Acquires a key: its request goes in the next batch of acquires (`ACQUIRE`), and again only when the batch statement lost the race to
/// create a new key's row (rows are never deleted, so a second run always finds one).
#[tracing::instrument(level = "debug", skip_all, fields(key = %req.key))]
pub async fn acquire(
    db: &Db,
    req: &NewLease,
    ctx: &RequestContext,
) -> Result<Gated<AcquireOutcome>> {
    loop {
        let gated = idempotency::gated(ctx, || {
            db.leases().acquire.answer(AcquireJob {
                req: req.clone(),
                ctx: ctx.clone(),
                waiter: None,
                last_try: true,
            })
        })
        .await?;
        match gated {
            Gated::Ran(AcquireAnswer { settled: false, .. }) => continue,
            gated => return Ok(gated.map(AcquireAnswer::into_outcome)),
        }
    }
}

/// Renews a live lease: its request goes in the next batch of renewals, one `UPDATE`
/// (`sql/renew.sql`) that changes each lease only while its token is the key's live lease.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key))]
pub async fn renew(
    db: &Db,
    key: &Key,
    token: FencingToken,
    ttl: Option<TtlMs>,
    ctx: &RequestContext,
) -> Result<Gated<LeaseChange>> {
    let gated = idempotency::gated(ctx, || {
        db.leases().renew.answer(ChangeJob {
            key: key.clone(),
            token,
            change: ttl,
            ctx: ctx.clone(),
        })
    })
    .await?;
    Ok(gated.map(ChangeAnswer::into_change))
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

/// Releases, abandons or marks a live lease: in the next batch of endings, one `UPDATE`
/// (`sql/end.sql`) with the same
/// live-lease condition as [`renew`], and race-free for the same reason.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key, ending = ?ending))]
pub async fn end(
    db: &Db,
    key: &Key,
    token: FencingToken,
    ending: Ending,
    ctx: &RequestContext,
) -> Result<Gated<LeaseChange>> {
    let ending = match ending {
        Ending::Release => "released",
        Ending::Abandon => "abandoned",
        Ending::RequireRecovery => "recovery_required",
    };
    let gated = idempotency::gated(ctx, || {
        db.leases().end.answer(ChangeJob {
            key: key.clone(),
            token,
            change: ending,
            ctx: ctx.clone(),
        })
    })
    .await?;
    Ok(gated.map(ChangeAnswer::into_change))
}

/// v1.2: the holder of `token`, the key's live lease, confirms that the leftovers of the
/// recovery record its reconciling grant kept no longer conflict: in the next batch of
/// confirmations, one statement (`sql/reconciled.sql`) clears the kept record, writes it to the
/// audit log (operation `reconciled`) and answers the lease, which goes on unchanged; a lease
/// that keeps no record is answered as it is, and changes nothing. Not the live lease:
/// [`LeaseChange::Lost`], nothing changed.
#[tracing::instrument(level = "debug", skip_all, fields(key = %key))]
pub async fn reconciled(
    db: &Db,
    key: &Key,
    token: FencingToken,
    ctx: &RequestContext,
) -> Result<Gated<LeaseChange>> {
    let gated = idempotency::gated(ctx, || {
        db.leases().reconciled.answer(ChangeJob {
            key: key.clone(),
            token,
            change: (),
            ctx: ctx.clone(),
        })
    })
    .await?;
    Ok(gated.map(ChangeAnswer::into_change))
}

/// The statement of a key's status (`sql/status.sql`), run on a hot connection.
pub(crate) const STATUS: &str = include_str!("sql/status.sql");

/// A key's newest lease, state, recovery record and live waiters. A plain read: it sees the
/// latest committed state and changes nothing.
pub async fn status(db: &Db, key: &Key) -> Result<Option<KeyStatus>> {
    let row: Option<StatusRow> = db
        .conns()
        .fetch_optional(Effect::Reads, || sqlx::query_as(STATUS).bind(key.as_str()))
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
    let rows: Vec<StatusRow> = sqlx::query_as(include_str!("sql/list.sql"))
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
/// position when it had to move. One short transaction: a table lock, then
/// `sql/sequence_ahead.sql`, which says why the lock makes it safe against concurrent grants.
pub async fn ensure_sequence_ahead(pool: &PgPool) -> Result<Option<i64>> {
    let mut tx = pool.begin().bounded(pool).await?;
    sqlx::query("LOCK TABLE leases IN SHARE ROW EXCLUSIVE MODE")
        .execute(&mut *tx)
        .bounded(pool)
        .await?;
    let moved: Option<i64> = sqlx::query_scalar(include_str!("sql/sequence_ahead.sql"))
        .fetch_optional(&mut *tx)
        .bounded(pool)
        .await?;
    tx.commit().bounded_change(pool).await?;
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
    sqlx::query_scalar(include_str!("sql/recovery_pending.sql"))
        .fetch_one(pool)
        .bounded(pool)
        .await
}
