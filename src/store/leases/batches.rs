//! The lease calls' batched statements, their requests' columns and their batch kinds.

use std::sync::LazyLock;

use super::NewLease;
use super::rows::{AcquireAnswer, ChangeAnswer};
use crate::domain::{FencingToken, Key, TtlMs};
use crate::store::RequestContext;
use crate::store::engine::batch::{Batcher, Indexed, Kind};
use crate::store::engine::conns::{Conns, Effect};
use crate::store::engine::statement::{Batched, Column, QueryAs, column};
use crate::store::idempotency::{self, Change, GatedRow};

pub(crate) static ACQUIRE: LazyLock<Batched<AcquireJob>> = LazyLock::new(|| {
    idempotency::changing(acquire_columns(), &[], &[include_str!("sql/acquire.sql")])
});

fn acquire_columns() -> [Column<AcquireJob>; 11] {
    [
        column!(AcquireJob, "key" = |j| j.req.key.as_str()),
        column!(AcquireJob, "owner" = |j| j.req.owner.as_str()),
        column!(AcquireJob, "ttl_ms" = |j| j.req.ttl.get()),
        column!(
            AcquireJob,
            "metadata" = |j| { j.req.metadata.as_ref().map(|m| m.as_json().to_string()) }
        ),
        column!(AcquireJob, "crash_recovery" = |j| j.req.crash_recovery),
        column!(AcquireJob, "reconciled" = |j| j.req.reconciled),
        column!(AcquireJob, "request_id" = |j| j.ctx.request_id.as_deref()),
        column!(AcquireJob, "remote_addr" = |j| j.ctx.remote_addr.as_deref()),
        column!(AcquireJob, "reconciling" = |j| j.req.reconciling),
        column!(AcquireJob, "waiter" = |j| j.waiter),
        column!(AcquireJob, "last_try" = |j| j.last_try),
    ]
}

#[derive(Debug)]
/// The lease calls' batches.
pub struct Batches {
    pub(crate) acquire: Batcher<AcquireBatch>,
    pub(crate) renew: Batcher<RenewBatch>,
    pub(crate) end: Batcher<EndBatch>,
    pub(crate) reconciled: Batcher<ReconciledBatch>,
}

impl Batches {
    pub(crate) fn start(conns: &Conns) -> Self {
        Self {
            acquire: Batcher::start(conns.clone()),
            renew: Batcher::start(conns.clone()),
            end: Batcher::start(conns.clone()),
            reconciled: Batcher::start(conns.clone()),
        }
    }

    pub(crate) fn queued(&self) -> usize {
        self.acquire.queued() + self.renew.queued() + self.end.queued() + self.reconciled.queued()
    }
}

#[derive(Debug)]
pub(crate) struct AcquireBatch;

/// One acquire: the request and, for a waiter's try, its queue row and whether its wait is over.
#[derive(Debug)]
pub(crate) struct AcquireJob {
    pub(super) req: NewLease,
    pub(super) ctx: RequestContext,
    pub(super) waiter: Option<i64>,
    pub(super) last_try: bool,
}

impl AcquireJob {
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
    const NAME: &'static str = "acquire";
    type Job = AcquireJob;
    type Row = GatedRow<AcquireAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q AcquireJob]) -> QueryAs<'q, Indexed<Self::Row>> {
        ACQUIRE.query(jobs)
    }
}

pub(crate) static RENEW: LazyLock<Batched<ChangeJob<Option<TtlMs>>>> = LazyLock::new(|| {
    let [key, token] = ChangeJob::lease_columns();
    let ttl = column!(
        ChangeJob<Option<TtlMs>>,
        "ttl_ms" = |j| j.change.map(TtlMs::get)
    );
    idempotency::changing([key, token, ttl], &[], &[include_str!("sql/renew.sql")])
});

#[derive(Debug)]
pub(crate) struct ChangeJob<C> {
    pub(super) key: Key,
    pub(super) token: FencingToken,
    pub(super) change: C,
    pub(super) ctx: RequestContext,
}

impl<C> ChangeJob<C> {
    fn lease_columns() -> [Column<Self>; 2] {
        [
            column!(Self, "key" = |j| j.key.as_str()),
            column!(Self, "token" = |j| j.token.get()),
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

#[derive(Debug)]
pub(crate) struct RenewBatch;

impl Kind for RenewBatch {
    const NAME: &'static str = "renew";
    type Job = ChangeJob<Option<TtlMs>>;
    type Row = GatedRow<ChangeAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>> {
        RENEW.query(jobs)
    }
}

#[derive(Debug)]
pub(crate) struct EndBatch;

impl Kind for EndBatch {
    const NAME: &'static str = "end";
    type Job = ChangeJob<&'static str>;
    type Row = GatedRow<ChangeAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>> {
        END.query(jobs)
    }
}

pub(crate) static END: LazyLock<Batched<ChangeJob<&'static str>>> = LazyLock::new(|| {
    let [key, token] = ChangeJob::lease_columns();
    let ending = column!(ChangeJob<&'static str>, "ending" = |j| j.change);
    idempotency::changing([key, token, ending], &[], &[include_str!("sql/end.sql")])
});

pub(crate) static RECONCILED: LazyLock<Batched<ChangeJob<()>>> = LazyLock::new(|| {
    let [key, token] = ChangeJob::lease_columns();
    let audit = [
        column!(
            ChangeJob<()>,
            "request_id" = |j| j.ctx.request_id.as_deref()
        ),
        column!(
            ChangeJob<()>,
            "remote_addr" = |j| j.ctx.remote_addr.as_deref()
        ),
    ];
    idempotency::changing(
        [key, token].into_iter().chain(audit),
        &[],
        &[include_str!("sql/reconciled.sql")],
    )
});

#[derive(Debug)]
pub(crate) struct ReconciledBatch;

impl Kind for ReconciledBatch {
    const NAME: &'static str = "reconciled";
    type Job = ChangeJob<()>;
    type Row = GatedRow<ChangeAnswer>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q Self::Job]) -> QueryAs<'q, Indexed<Self::Row>> {
        RECONCILED.query(jobs)
    }
}
