//! The `leases` table. Each key has one row, never deleted; every changing statement first locks
//! it, which under READ COMMITTED yields its newest version, so statements on one key take effect
//! one after the other.

mod batches;
pub mod queue;
mod rows;
pub mod timeline;
pub mod waiters;

pub use batches::Batches;
use batches::ChangeJob;
pub(crate) use batches::{ACQUIRE, AcquireBatch, AcquireJob, END, RECONCILED, RENEW};
use rows::{AcquireAnswer, ChangeAnswer, StatusRow};

use sqlx::PgPool;

use super::engine::conns::Effect;
use super::idempotency::{self, Gated};
use super::{Bounded, Engine, RequestContext, Result};
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
    /// v1.2: a grant over a retained record keeps it until [`reconciled`].
    pub reconciling: bool,
}

/// How an acquire ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AcquireOutcome {
    /// Granted; `recovered` is the record replaced, `kept` the one a reconciling grant keeps.
    Granted {
        /// The new lease.
        lease: Lease,
        /// The record that `reconciled: true` replaced.
        recovered: Option<Box<RecoveryRecord>>,
        /// The record `reconciling: true` keeps until the holder confirms.
        kept: Option<Box<RecoveryRecord>>,
    },
    /// Another lease is live, or the free key goes to earlier live waiters; nothing changed.
    Held {
        /// The live lease; on a free key, the last one.
        holder: Lease,
        /// `held`, or the free state of a key that goes to `waiters`.
        state: LeaseState,
        /// Live waiters before this request on a free key; `None` while a lease holds it.
        waiters: Option<i64>,
    },
    /// A recovery record is retained and not reconciled; nothing changed.
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
    /// The token is not the key's live lease; nothing changed.
    Lost,
}

/// Acquires a key, again only if it lost the race to create the key's row.
#[tracing::instrument(level = "debug", skip_all, fields(key = %req.key))]
pub async fn acquire(
    db: &impl AsRef<Batches>,
    req: &NewLease,
    ctx: &RequestContext,
) -> Result<Gated<AcquireOutcome>> {
    loop {
        let gated = idempotency::gated(ctx, || {
            db.as_ref().acquire.answer(AcquireJob {
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

/// Renews a live lease (`sql/renew.sql`).
#[tracing::instrument(level = "debug", skip_all, fields(key = %key))]
pub async fn renew(
    db: &impl AsRef<Batches>,
    key: &Key,
    token: FencingToken,
    ttl: Option<TtlMs>,
    ctx: &RequestContext,
) -> Result<Gated<LeaseChange>> {
    let gated = idempotency::gated(ctx, || {
        db.as_ref().renew.answer(ChangeJob {
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

/// Releases, abandons or marks a live lease (`sql/end.sql`).
#[tracing::instrument(level = "debug", skip_all, fields(key = %key, ending = ?ending))]
pub async fn end(
    db: &impl AsRef<Batches>,
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
        db.as_ref().end.answer(ChangeJob {
            key: key.clone(),
            token,
            change: ending,
            ctx: ctx.clone(),
        })
    })
    .await?;
    Ok(gated.map(ChangeAnswer::into_change))
}

/// v1.2: the live holder confirms the kept record is dealt with; it moves to the audit log
/// (`sql/reconciled.sql`).
#[tracing::instrument(level = "debug", skip_all, fields(key = %key))]
pub async fn reconciled(
    db: &impl AsRef<Batches>,
    key: &Key,
    token: FencingToken,
    ctx: &RequestContext,
) -> Result<Gated<LeaseChange>> {
    let gated = idempotency::gated(ctx, || {
        db.as_ref().reconciled.answer(ChangeJob {
            key: key.clone(),
            token,
            change: (),
            ctx: ctx.clone(),
        })
    })
    .await?;
    Ok(gated.map(ChangeAnswer::into_change))
}

pub(crate) const STATUS: &str = include_str!("sql/status.sql");

/// A key's newest lease, state, recovery record and live waiters; a plain read.
pub async fn status(db: &impl AsRef<Engine>, key: &Key) -> Result<Option<KeyStatus>> {
    let row: Option<StatusRow> = db
        .as_ref()
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

/// Lists keys by a keyset scan over `[prefix, upper_bound)`: every page costs the same.
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

/// Moves the token sequence past every stored token; the new position if it moved.
pub async fn ensure_sequence_ahead(pool: &PgPool) -> Result<Option<i64>> {
    let mut tx = pool.begin().bounded(pool).await?;
    sqlx::query(include_str!("sql/lock_grants.sql"))
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

/// Keys with an open recovery record, for the metrics gauge.
pub async fn count_recovery_pending(pool: &PgPool) -> Result<i64> {
    sqlx::query_scalar(include_str!("sql/recovery_pending.sql"))
        .fetch_one(pool)
        .bounded(pool)
        .await
}
