//! The snapshot calls' batched statements, their requests' columns and their batch kinds.

use std::sync::LazyLock;

use bytes::Bytes;

use super::txn::TxnBatch;
use super::{BodyRow, FencedRow};
use crate::domain::{
    AuditOperation, ETag, EntityTagCondition, FencingToken, Key, KeyPrefix, Metadata, Version,
};
use crate::store::RequestContext;
use crate::store::engine::batch::{Batcher, Indexed, Job, Kind};
use crate::store::engine::conns::{Conns, Effect};
use crate::store::engine::statement::{Batched, Column, QueryAs, column};
use crate::store::idempotency::{self, Change, GatedRow};

/// The fenced statements; `sql/fenced.sql` holds the rules and their locks.
pub(crate) struct Fenced {
    pub(crate) put: Batched<FencedJob>,
    pub(crate) put_uploaded: Batched<FencedJob>,
    pub(crate) precheck: Batched<FencedJob>,
    pub(crate) delete_head: Batched<FencedJob>,
    pub(crate) txn: Batched<FencedJob>,
}

/// Rule (1)'s bound is the fence's newest token (fenced.sql), unless `stale_below` says otherwise.
const STALE_BELOW_NEWEST_GRANT: &str = "NULL::bigint";

const TAGS: (&str, &str) = (
    "tags",
    "CASE WHEN r.tags IS NOT NULL THEN ARRAY(SELECT json_array_elements_text(r.tags::json)) END",
);

impl Fenced {
    fn build(stale_below: &'static str) -> Self {
        const WRITES: &str = include_str!("sql/writes.sql");
        const FENCED: &str = include_str!("sql/fenced.sql");
        const PUT: &str = include_str!("sql/put.sql");
        const DELETE: &str = include_str!("sql/delete.sql");
        const PUT_ANSWER: &str = include_str!("sql/put_answer.sql");
        let bound = [TAGS, ("stale_below", stale_below)];
        // An upload's body is read where the connection copied it (engine/conns.rs), not bound.
        let uploaded = [
            bound[0],
            bound[1],
            ("body", "ARRAY[(SELECT body FROM pg_temp.snapfence_upload)]"),
        ];
        let statement = |parts: &[&'static str], derived: &[_], groups: bool| {
            let mut columns = FencedJob::columns();
            columns.extend(groups.then(FencedJob::group_column));
            idempotency::changing(columns, derived, parts)
        };
        Self {
            put: statement(&[WRITES, FENCED, PUT, PUT_ANSWER], &bound, false),
            put_uploaded: statement(&[WRITES, FENCED, PUT, PUT_ANSWER], &uploaded, false),
            precheck: statement(
                &[WRITES, FENCED, include_str!("sql/precheck.sql")],
                &bound,
                false,
            ),
            delete_head: statement(
                &[
                    WRITES,
                    FENCED,
                    DELETE,
                    include_str!("sql/delete_answer.sql"),
                ],
                &bound,
                false,
            ),
            txn: statement(
                &[
                    include_str!("sql/txn_writes.sql"),
                    FENCED,
                    PUT,
                    DELETE,
                    include_str!("sql/txn.sql"),
                ],
                &bound,
                true,
            ),
        }
    }
}

pub(crate) static FENCED: LazyLock<Fenced> =
    LazyLock::new(|| Fenced::build(STALE_BELOW_NEWEST_GRANT));

/// The fault tests' negative control (`fault-controls` only): checks a token against the highest
/// *written* instead of the newest *granted*, so a superseded holder writes until its successor
/// does. The history checker must find it.
#[cfg(feature = "fault-controls")]
static BROKEN: LazyLock<Fenced> = LazyLock::new(|| {
    Fenced::build("coalesce((SELECT max(v.token) FROM snapshot_versions v WHERE v.key = r.key), 0)")
});

pub(super) fn fenced() -> &'static Fenced {
    #[cfg(feature = "fault-controls")]
    if super::fencing_broken() {
        return &BROKEN;
    }
    &FENCED
}

#[derive(Debug, Clone)]
pub(crate) struct FencedJob {
    pub(super) key: Key,
    pub(super) fence: Key,
    pub(super) token: FencingToken,
    pub(super) if_match: Option<EntityTagCondition>,
    pub(super) if_none_match: bool,
    pub(super) operation: AuditOperation,
    pub(super) op: Op,
    pub(super) write: Option<Write>,
    pub(super) ctx: RequestContext,
    /// Whether it is the first write of its group (a request, or a transaction's first op).
    pub(super) opens_group: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Op {
    Put,
    Delete,
    DeletePrefix { prefix: KeyPrefix, limit: i64 },
}

#[derive(Debug, Clone)]
pub(super) struct Write {
    pub(super) body: Bytes,
    pub(super) etag: ETag,
    pub(super) content_type: String,
    pub(super) uploaded: bool,
    pub(super) keep_versions: i64,
    pub(super) metadata: Option<Metadata>,
}

impl FencedJob {
    fn columns() -> Vec<Column<Self>> {
        vec![
            column!(
                Self,
                "key" = |j| { (!matches!(j.op, Op::DeletePrefix { .. })).then(|| j.key.as_str()) }
            ),
            column!(Self, "fence" = |j| j.fence.as_str()),
            column!(Self, "token" = |j| j.token.get()),
            column!(Self, "if_none_match" = |j| j.if_none_match),
            column!(
                Self,
                "op" = |j| match j.op {
                    Op::Put => "put",
                    Op::Delete => "delete",
                    Op::DeletePrefix { .. } => "delete_prefix",
                }
            ),
            column!(Self, "prefix" = |j| j.prefix().map(KeyPrefix::as_str)),
            column!(
                Self,
                "prefix_end" = |j| j.prefix().map(KeyPrefix::upper_bound)
            ),
            column!(
                Self,
                "prefix_limit" = |j| match j.op {
                    Op::DeletePrefix { limit, .. } => Some(limit),
                    _ => None,
                }
            ),
            column!(Self, "has_if_match" = |j| j.if_match.is_some()),
            column!(
                Self,
                "tags" = |j| {
                    let tags = j
                        .if_match
                        .as_ref()
                        .and_then(EntityTagCondition::strong_tags);
                    tags.map(|t| serde_json::Value::from(t).to_string())
                }
            ),
            column!(Self, "request_id" = |j| j.ctx.request_id.as_deref()),
            column!(Self, "remote_addr" = |j| j.ctx.remote_addr.as_deref()),
            column!(Self, "operation" = |j| j.operation.as_str()),
            column!(Self, "etag" = |j| j.write.as_ref().map(|w| w.etag.as_str())),
            column!(
                Self,
                "size" = |j| {
                    j.write
                        .as_ref()
                        .map(|w| i64::try_from(w.body.len()).unwrap_or(i64::MAX))
                }
            ),
            column!(
                Self,
                "content_type" = |j| { j.write.as_ref().map(|w| w.content_type.as_str()) }
            ),
            column!(
                Self,
                "body" = |j| {
                    j.write
                        .as_ref()
                        .filter(|w| !w.uploaded)
                        .map(|w| w.body.as_ref())
                }
            )
            .positional(),
            column!(
                Self,
                "keep" = |j| j.write.as_ref().map_or(0, |w| w.keep_versions)
            ),
            column!(
                Self,
                "metadata" = |j| {
                    j.write
                        .as_ref()
                        .and_then(|w| w.metadata.as_ref())
                        .map(|m| m.as_json().to_string())
                }
            ),
        ]
    }

    /// `gi`: the position of the first write of each write's group, whose gate decides it.
    fn group_column() -> Column<Self> {
        Column::new(
            "gi",
            <i64 as sqlx::Type<sqlx::Postgres>>::type_info,
            |args, jobs| {
                let mut gi = 0_i64;
                let groups: Vec<i64> = (1..)
                    .zip(jobs)
                    .map(|(i, j)| {
                        if j.opens_group {
                            gi = i;
                        }
                        gi
                    })
                    .collect();
                sqlx::Arguments::add(args, groups)
            },
        )
    }

    fn prefix(&self) -> Option<&KeyPrefix> {
        match &self.op {
            Op::DeletePrefix { prefix, .. } => Some(prefix),
            _ => None,
        }
    }

    pub(super) fn put<'q>(jobs: &[&'q Self]) -> QueryAs<'q, Indexed<GatedRow<FencedRow>>> {
        let uploaded = jobs
            .iter()
            .any(|j| j.write.as_ref().is_some_and(|w| w.uploaded));
        let statements = fenced();
        if uploaded {
            statements.put_uploaded.query(jobs)
        } else {
            statements.put.query(jobs)
        }
    }
}

impl Change for FencedJob {
    fn key(&self) -> &Key {
        &self.key
    }

    fn ctx(&self) -> &RequestContext {
        &self.ctx
    }
}

#[derive(Debug)]
/// The snapshot calls' batches, and the hot connections for the calls that run alone.
pub struct Batches {
    pub(crate) conns: Conns,
    pub(crate) put: Batcher<PutBatch>,
    pub(crate) precheck: Batcher<PrecheckBatch>,
    pub(crate) get: Batcher<GetBatch>,
    pub(crate) txn: Batcher<TxnBatch>,
}

impl Batches {
    pub(crate) fn start(conns: &Conns) -> Self {
        Self {
            put: Batcher::start(conns.clone()),
            precheck: Batcher::start(conns.clone()),
            get: Batcher::start(conns.clone()),
            txn: Batcher::start(conns.clone()),
            conns: conns.clone(),
        }
    }

    pub(crate) fn queued(&self) -> usize {
        self.put.queued() + self.precheck.queued() + self.get.queued() + self.txn.queued()
    }
}

#[derive(Debug)]
pub(crate) struct PutBatch;

impl Kind for PutBatch {
    const NAME: &'static str = "put";
    type Job = FencedJob;
    type Row = GatedRow<FencedRow>;
    const EFFECT: Effect = Effect::Changes;

    fn bytes(job: &FencedJob) -> usize {
        job.write.as_ref().map_or(0, |w| w.body.len())
    }

    fn query<'q>(jobs: &[&'q FencedJob]) -> QueryAs<'q, Indexed<Self::Row>> {
        FencedJob::put(jobs)
    }
}

#[derive(Debug)]
pub(crate) struct PrecheckBatch;

impl Kind for PrecheckBatch {
    const NAME: &'static str = "precheck";
    type Job = FencedJob;
    type Row = GatedRow<FencedRow>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q FencedJob]) -> QueryAs<'q, Indexed<Self::Row>> {
        fenced().precheck.query(jobs)
    }
}

pub(crate) static GET: LazyLock<Batched<GetJob>> = LazyLock::new(|| {
    Batched::builder([
        column!(GetJob, "key" = |j| j.key.as_str()),
        column!(GetJob, "version" = |j| j.version.map(Version::get)),
        column!(GetJob, "with_body" = |j| j.with_body),
        column!(GetJob, "keep" = |j| j.keep_versions),
        column!(GetJob, "unless" = |j| j.unless.as_ref()),
    ])
    .part(include_str!("sql/get.sql"))
    .build()
});

#[derive(Debug)]
pub(crate) struct GetJob {
    pub(super) key: Key,
    pub(super) version: Option<Version>,
    pub(super) keep_versions: i64,
    pub(super) with_body: bool,
    pub(super) unless: Option<serde_json::Value>,
}

impl Job for GetJob {
    fn key(&self) -> &Key {
        &self.key
    }
}

#[derive(Debug)]
pub(crate) struct GetBatch;

impl Kind for GetBatch {
    const NAME: &'static str = "get";
    type Job = GetJob;
    type Row = BodyRow;
    const EFFECT: Effect = Effect::Reads;

    fn query<'q>(jobs: &[&'q GetJob]) -> QueryAs<'q, Indexed<BodyRow>> {
        GET.query(jobs)
    }
}
