//! The `leases` table: grants, renewals, releases, recovery records, and the token sequence.
//!
//! Each key has one row, made by its first grant and never deleted. Every statement here that
//! changes a lease first takes the row lock of its key (`FOR NO KEY UPDATE` or the `UPDATE`
//! itself), and under READ COMMITTED a row lock always yields the row's newest committed version
//! (the executor re-reads it once the lock is granted). So each statement decides on the state
//! that is current when it holds the lock, and two statements on one key, from any instances,
//! take effect one after the other.

pub mod queue;
pub mod timeline;
pub mod waiters;

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::{FromRow, PgPool};

use super::engine::batch::{Batcher, Indexed, Kind};
use super::engine::conns::{Conns, Effect};
use super::engine::statement::{Batched, Column, QueryAs, column};
use super::idempotency::{self, Change, Gated, GatedRow};
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

/// A lease row as read from the database, or from a statement's JSON answer.
#[derive(Debug, FromRow, Deserialize)]
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

/// A lease row with its derived recovery reason and state, and the record a reconciling lease
/// keeps (v1.2; absent from answers remembered before it was added).
#[derive(Debug, FromRow, Deserialize)]
struct StatusRow {
    #[sqlx(flatten)]
    #[serde(flatten)]
    lease: LeaseRow,
    recovery_reason: Option<String>,
    state: String,
    #[serde(default)]
    kept_owner: Option<String>,
    #[serde(default)]
    kept_token: Option<i64>,
    #[serde(default)]
    kept_acquired_at: Option<DateTime<Utc>>,
    #[serde(default)]
    kept_ended_at: Option<DateTime<Utc>>,
    #[serde(default)]
    kept_metadata: Option<serde_json::Value>,
    /// How many acquires wait in the key's queue; status.sql and list.sql count them, a
    /// statement's JSON answer does not.
    #[serde(default)]
    waiters: i64,
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
    /// The key's retained recovery record: the one a reconciling lease keeps, if it keeps one,
    /// else the newest lease's own (`key_recovery_reason` in the migrations decides the reason).
    fn recovery_record(&self) -> Option<RecoveryRecord> {
        let reason = self.recovery_reason.as_deref()?;
        let Some(token) = self.kept_token else {
            return Some(self.lease.recovery_record(reason));
        };
        Some(RecoveryRecord {
            owner: Owner::parse(self.kept_owner.clone().expect("a kept record is whole"))
                .expect("stored owners are valid"),
            token: FencingToken::new(token).expect("stored tokens are positive"),
            acquired_at: self.kept_acquired_at.expect("a kept record is whole"),
            ended_at: self.kept_ended_at.expect("a kept record is whole"),
            reason: RecoveryReason::parse(reason).expect("key_recovery_reason's values"),
            metadata: self.kept_metadata.clone().map(Metadata::from_stored),
        })
    }

    fn into_status(self) -> KeyStatus {
        let recovery = self.recovery_record();
        let lease = self.lease.into_lease();
        KeyStatus {
            key: lease.key.clone(),
            state: LeaseState::parse(&self.state).expect("lease_state's values"),
            newest_token: lease.token,
            lease,
            recovery,
            waiters: self.waiters,
        }
    }
}

/// The acquire statement over a batch: its requests, the gate, the grants, the records of their
/// Idempotency-Keys. What it locks and why it is race-free, also on a key's first grant, is
/// written beside it in `sql/acquire.sql`. A waiting acquire's try ([`waiters`]) is the same
/// statement, with its row in the key's queue and whether it is its last try.
pub(crate) static ACQUIRE: LazyLock<Batched<AcquireJob>> = LazyLock::new(|| {
    idempotency::changing(
        [
            column!(AcquireJob, "key": "text" = |j| j.req.key.as_str()),
            column!(AcquireJob, "owner": "text" = |j| j.req.owner.as_str()),
            column!(AcquireJob, "ttl_ms": "bigint" = |j| j.req.ttl.get()),
            column!(AcquireJob, "metadata": "text" = |j| {
                j.req.metadata.as_ref().map(|m| m.as_json().to_string())
            }),
            column!(AcquireJob, "crash_recovery": "boolean" = |j| j.req.crash_recovery),
            column!(AcquireJob, "reconciled": "boolean" = |j| j.req.reconciled),
            column!(AcquireJob, "request_id": "text" = |j| j.ctx.request_id.as_deref()),
            column!(AcquireJob, "remote_addr": "text" = |j| j.ctx.remote_addr.as_deref()),
            column!(AcquireJob, "reconciling": "boolean" = |j| j.req.reconciling),
            column!(AcquireJob, "waiter": "bigint" = |j| j.waiter),
            column!(AcquireJob, "last_try": "boolean" = |j| j.last_try),
        ],
        &[],
        &[include_str!("sql/acquire.sql")],
        &[],
    )
});

/// What an acquire did (`result` in `sql/acquire.sql`).
#[derive(Debug, Deserialize)]
pub(crate) struct AcquireAnswer {
    verdict: String,
    /// The new lease, if one was granted.
    granted: Option<LeaseRow>,
    /// The key's row as the statement found it, if the key had one.
    current: Option<StatusRow>,
    /// False when the statement lost the race to create the key's row, and must run again; or,
    /// for a waiter, when it found the key held and waits on.
    pub(super) settled: bool,
    /// The statement's `now()`: the database clock the holder's expiry is measured against.
    /// Absent from answers remembered before it was added.
    #[serde(default)]
    clock: Option<DateTime<Utc>>,
    /// v1.2: whether the grant keeps the key's recovery record (a reconciling grant over one).
    #[serde(default)]
    keeps: bool,
}

impl AcquireAnswer {
    /// For a waiter's unsettled answer: how long until the lease that holds the key expires by
    /// the database clock, if a live lease holds it (rather than a waiter queued before).
    pub(super) fn held_for(&self) -> Option<std::time::Duration> {
        let current = self.current.as_ref()?;
        if self.verdict != "held" || current.state != "held" {
            return None;
        }
        let left = current.lease.expires_at - self.clock?;
        Some(left.to_std().unwrap_or_default())
    }

    /// Whether the statement found the key held (by a lease, or reserved by a waiter ahead).
    pub(super) fn held(&self) -> bool {
        self.verdict == "held"
    }

    pub(super) fn into_outcome(self) -> AcquireOutcome {
        match (self.verdict.as_str(), self.granted, self.current) {
            ("insert" | "grant", Some(lease), current) => {
                let record = current.and_then(|c| c.recovery_record()).map(Box::new);
                let (recovered, kept) = if self.keeps {
                    (None, record)
                } else {
                    (record, None)
                };
                AcquireOutcome::Granted {
                    lease: lease.into_lease(),
                    recovered,
                    kept,
                }
            }
            ("held", _, Some(c)) => AcquireOutcome::Held {
                holder: c.lease.into_lease(),
            },
            ("recovery_required", _, Some(c)) => AcquireOutcome::RecoveryRequired {
                recovery: c.recovery_record().expect("a verdict needs a reason"),
            },
            (verdict, ..) => unreachable!("acquire verdict {verdict} without its row"),
        }
    }
}

/// The dispatchers of the lease calls' batches ([`super::engine::batch`]); each ends when this
/// is dropped.
#[derive(Debug)]
pub(crate) struct Batches {
    /// Acquires.
    pub(crate) acquire: Batcher<AcquireBatch>,
    /// Renewals.
    pub(crate) renew: Batcher<RenewBatch>,
    /// Releases, abandons and require-recovery marks.
    pub(crate) end: Batcher<EndBatch>,
    /// Confirmations of reconciliations (v1.2).
    pub(crate) reconciled: Batcher<ReconciledBatch>,
}

impl Batches {
    /// Starts the dispatchers on `conns`.
    pub(crate) fn start(conns: &Conns) -> Self {
        Self {
            acquire: Batcher::start(conns.clone()),
            renew: Batcher::start(conns.clone()),
            end: Batcher::start(conns.clone()),
            reconciled: Batcher::start(conns.clone()),
        }
    }

    /// The requests waiting in batches to be sent.
    pub(crate) fn queued(&self) -> usize {
        self.acquire.queued() + self.renew.queued() + self.end.queued() + self.reconciled.queued()
    }
}

/// Acquires, gathered into batches ([`super::engine::batch`]).
#[derive(Debug)]
pub(crate) struct AcquireBatch;

/// One acquire of a batch: the request and, for a waiter's try ([`waiters`]), its row in the
/// key's queue and whether its wait is over (a plain acquire is its own last try, from no
/// queue: a `held` verdict is its answer).
#[derive(Debug)]
pub(crate) struct AcquireJob {
    req: NewLease,
    ctx: RequestContext,
    waiter: Option<i64>,
    last_try: bool,
}

impl AcquireJob {
    /// A try of `req` by the waiter queued as `waiter`.
    pub(super) fn waiting(
        req: &NewLease,
        ctx: &RequestContext,
        waiter: i64,
        last_try: bool,
    ) -> Self {
        Self {
            req: req.clone(),
            ctx: ctx.clone(),
            waiter: Some(waiter),
            last_try,
        }
    }
}

impl Change for AcquireJob {
    fn key(&self) -> &Key {
        &self.req.key
    }

    fn ctx(&self) -> &RequestContext {
        &self.ctx
    }
}

impl Kind for AcquireBatch {
    type Job = AcquireJob;
    type Row = GatedRow<AcquireAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q AcquireJob]) -> QueryAs<'q, Indexed<Self::Row>> {
        ACQUIRE.query(jobs)
    }
}

/// Acquires a key: its request goes in the next batch of acquires (`ACQUIRE`), and again only
/// when it lost the race to create a new key's row (rows are never deleted, so a second run
/// always finds one).
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

/// What a renewal or an ending did (`result` in `sql/renew.sql` and `sql/end.sql`): the lease as
/// changed, or none when the token was not the key's live lease.
#[derive(Debug, Deserialize)]
pub(crate) struct ChangeAnswer {
    lease: Option<LeaseRow>,
}

impl ChangeAnswer {
    fn into_change(self) -> LeaseChange {
        self.lease
            .map_or(LeaseChange::Lost, |r| LeaseChange::Done(r.into_lease()))
    }
}

/// The renew statement over a batch ([`renew`]), between the gate and the record; its
/// race-freedom argument is in `sql/renew.sql`.
pub(crate) static RENEW: LazyLock<Batched<ChangeJob<Option<TtlMs>>>> = LazyLock::new(|| {
    let [key, token] = ChangeJob::lease_columns();
    let ttl = column!(ChangeJob<Option<TtlMs>>, "ttl_ms": "bigint" = |j| j.change.map(TtlMs::get));
    idempotency::changing(
        [key, token, ttl],
        &[],
        &[include_str!("sql/renew.sql")],
        &[],
    )
});

/// A change of a live lease in a batch: the key, the token that must be its live lease, and
/// what the change is (the new TTL of a renewal, the ending of an ending).
#[derive(Debug)]
pub(crate) struct ChangeJob<C> {
    key: Key,
    token: FencingToken,
    change: C,
    ctx: RequestContext,
}

impl<C> ChangeJob<C> {
    /// The columns every change of a live lease has: the key, and the token that must be its
    /// live lease.
    fn lease_columns() -> [Column<Self>; 2] {
        [
            column!(Self, "key": "text" = |j| j.key.as_str()),
            column!(Self, "token": "bigint" = |j| j.token.get()),
        ]
    }
}

impl<C> Change for ChangeJob<C> {
    fn key(&self) -> &Key {
        &self.key
    }

    fn ctx(&self) -> &RequestContext {
        &self.ctx
    }
}

/// Renewals, gathered into batches ([`super::engine::batch`]).
#[derive(Debug)]
pub(crate) struct RenewBatch;

impl Kind for RenewBatch {
    type Job = ChangeJob<Option<TtlMs>>;
    type Row = GatedRow<ChangeAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>> {
        RENEW.query(jobs)
    }
}

/// Endings, gathered into batches ([`super::engine::batch`]).
#[derive(Debug)]
pub(crate) struct EndBatch;

impl Kind for EndBatch {
    type Job = ChangeJob<&'static str>;
    type Row = GatedRow<ChangeAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>> {
        END.query(jobs)
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

/// The ending statement over a batch ([`end`]), between the gate and the record.
pub(crate) static END: LazyLock<Batched<ChangeJob<&'static str>>> = LazyLock::new(|| {
    let [key, token] = ChangeJob::lease_columns();
    let ending = column!(ChangeJob<&'static str>, "ending": "text" = |j| j.change);
    idempotency::changing(
        [key, token, ending],
        &[],
        &[include_str!("sql/end.sql")],
        &[],
    )
});

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

/// The confirmation statement over a batch ([`reconciled`]), between the gate and the record;
/// its race-freedom argument is in `sql/reconciled.sql`.
pub(crate) static RECONCILED: LazyLock<Batched<ChangeJob<()>>> = LazyLock::new(|| {
    let [key, token] = ChangeJob::lease_columns();
    let audit = [
        column!(ChangeJob<()>, "request_id": "text" = |j| j.ctx.request_id.as_deref()),
        column!(ChangeJob<()>, "remote_addr": "text" = |j| j.ctx.remote_addr.as_deref()),
    ];
    idempotency::changing(
        [key, token].into_iter().chain(audit),
        &[],
        &[include_str!("sql/reconciled.sql")],
        &[],
    )
});

/// Confirmations of reconciliations, gathered into batches ([`super::engine::batch`]). A job's change
/// is its request's context, which the audit row of the moved record names.
#[derive(Debug)]
pub(crate) struct ReconciledBatch;

impl Kind for ReconciledBatch {
    type Job = ChangeJob<()>;
    type Row = GatedRow<ChangeAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>> {
        RECONCILED.query(jobs)
    }
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

/// A key's newest lease, state and recovery record. A plain read: it sees the latest committed
/// state and changes nothing.
pub async fn status(db: &Db, key: &Key) -> Result<Option<KeyStatus>> {
    let row: Option<StatusRow> = db
        .conns()
        .fetch_optional(Effect::Reads, || {
            sqlx::query_as(include_str!("sql/status.sql")).bind(key.as_str())
        })
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
