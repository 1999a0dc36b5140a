//! The snapshot calls' batched statements: the fenced statements (a write, with its body bound
//! or uploaded; the check before a body; a delete's first statement) and the read, their
//! requests' columns (assembled by the engine's builder, with the gate and the record of
//! `idempotency` for the fenced ones), their batch kinds and the dispatchers that gather them.

use std::sync::LazyLock;

use bytes::Bytes;

use super::{BodyRow, FencedRow};
use crate::domain::{
    AuditOperation, ETag, EntityTagCondition, FencingToken, Key, KeyPrefix, Metadata, Version,
};
use crate::store::RequestContext;
use crate::store::engine::batch::{Batcher, Indexed, Job, Kind};
use crate::store::engine::conns::{Conns, Effect};
use crate::store::engine::statement::{Batched, Column, QueryAs, column};
use crate::store::idempotency::{self, Change, GatedRow};

/// The fenced statements: each is its requests, the gate, its writes (`sql/writes.sql`, or a
/// transaction's `sql/txn_writes.sql`), the fencing rules and the refusals' audit rows
/// (`sql/fenced.sql`), then its own parts, then the record. What each part locks and why the
/// whole is race-free is written beside it in those files.
pub(crate) struct Fenced {
    /// The write, its body bound (`sql/put.sql`).
    pub(crate) put: Batched<FencedJob>,
    /// The write of a body uploaded beforehand into the connection's upload table (a batch of
    /// one, see `Conns::fetch_one_uploading`) rather than bound (bound NULL, unused); the same
    /// checks, locks and audit otherwise.
    pub(crate) put_uploaded: Batched<FencedJob>,
    /// The check before a body is read (`sql/precheck.sql`).
    pub(crate) precheck: Batched<FencedJob>,
    /// The delete's first statement (`sql/delete.sql`); its versions are removed by a second
    /// statement in the same transaction (see [`delete`]).
    pub(crate) delete_head: Batched<FencedJob>,
    /// A transaction's first statement over its ops (`sql/txn.sql`, after the puts and the
    /// deletes); the versions of the keys it deleted go in a second statement, as a delete's.
    pub(crate) txn: Batched<FencedJob>,
}

/// In `sql/fenced.sql`, what a lower token is stale against: the key's newest granted token.
const STALE_BELOW_NEWEST_GRANT: &str = "w.token < c.token OR";

/// If-Match's strong tags as an array (bound as a JSON array, NULL for `*`).
const TAGS: (&str, &str) = (
    "tags",
    "CASE WHEN r.tags IS NOT NULL THEN ARRAY(SELECT json_array_elements_text(r.tags::json)) END",
);

impl Fenced {
    /// The statements, with `stale_below` deciding what a lower token is stale against.
    fn build(stale_below: &'static str) -> Self {
        const WRITES: &str = include_str!("sql/writes.sql");
        const FENCED: &str = include_str!("sql/fenced.sql");
        const PUT: &str = include_str!("sql/put.sql");
        const DELETE: &str = include_str!("sql/delete.sql");
        let fenced = |parts: &[&'static str], body: Option<&'static str>| {
            let mut fills = vec![("stale_below", stale_below)];
            fills.extend(body.map(|b| ("body", b)));
            idempotency::changing(FencedJob::columns(), &[TAGS], parts, &fills)
        };
        let put_answer = include_str!("sql/put_answer.sql");
        Self {
            put: fenced(&[WRITES, FENCED, PUT, put_answer], Some("w.body")),
            put_uploaded: fenced(
                &[WRITES, FENCED, PUT, put_answer],
                Some("(SELECT body FROM pg_temp.snapfence_upload)"),
            ),
            precheck: fenced(&[WRITES, FENCED, include_str!("sql/precheck.sql")], None),
            delete_head: fenced(
                &[
                    WRITES,
                    FENCED,
                    DELETE,
                    include_str!("sql/delete_answer.sql"),
                ],
                None,
            ),
            txn: fenced(
                &[
                    include_str!("sql/txn_writes.sql"),
                    FENCED,
                    PUT,
                    DELETE,
                    include_str!("sql/txn.sql"),
                ],
                Some("w.body"),
            ),
        }
    }
}

/// The fenced statements the service runs.
pub(crate) static FENCED: LazyLock<Fenced> =
    LazyLock::new(|| Fenced::build(STALE_BELOW_NEWEST_GRANT));

/// The negative control of the fault tests, compiled only with the `fault-controls` feature:
/// the fenced statements with the classic fencing bug of checking a token against the highest
/// token *written* to the key instead of its newest *granted* one, which lets a superseded
/// holder write until its successor first writes. The history checker must find that; see
/// `tests/faults`.
#[cfg(feature = "fault-controls")]
static BROKEN: LazyLock<Fenced> = LazyLock::new(|| {
    Fenced::build(
        "w.token < coalesce((SELECT max(v.token) FROM snapshot_versions v WHERE v.key = w.key), 0) OR",
    )
});

/// The fenced statements this process runs (broken, under the negative control, for the check
/// before a body too, so that the control is not caught early instead).
pub(super) fn fenced() -> &'static Fenced {
    #[cfg(feature = "fault-controls")]
    if super::fencing_broken() {
        return &BROKEN;
    }
    &FENCED
}

/// One fenced request of a batch (a write, a check before a body, a delete): what
/// [`FencedJob::columns`] binds.
#[derive(Debug)]
pub(crate) struct FencedJob {
    /// The key written; for a transaction's delete_prefix, its fence (the key of no write).
    pub(super) key: Key,
    /// The lease whose token fences the write: the key itself, or a key whose namespace holds it.
    pub(super) fence: Key,
    pub(super) token: FencingToken,
    pub(super) if_match: Option<EntityTagCondition>,
    /// Create only: the key must have no current snapshot (a transaction's `if_none_match: "*"`).
    pub(super) if_none_match: bool,
    pub(super) operation: AuditOperation,
    pub(super) op: Op,
    /// For a write, what it stores.
    pub(super) write: Option<Write>,
    pub(super) ctx: RequestContext,
}

/// What a fenced request does to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Op {
    /// Stores a version (a check before a body, too).
    Put,
    /// Removes the current snapshot.
    Delete,
    /// Removes every current snapshot under the prefix in the fence's namespace, at most `limit`.
    DeletePrefix { prefix: KeyPrefix, limit: i64 },
}

/// What a fenced write stores, and the versions its key keeps.
#[derive(Debug)]
pub(super) struct Write {
    pub(super) body: Bytes,
    pub(super) etag: ETag,
    pub(super) content_type: String,
    /// Whether the body is uploaded beforehand rather than bound ([`UPLOAD_FROM`]).
    pub(super) uploaded: bool,
    pub(super) keep_versions: i64,
    /// The version's Snapshot-Metadata, a JSON object.
    pub(super) metadata: Option<Metadata>,
}

impl FencedJob {
    /// The requests' columns of every fenced statement.
    fn columns() -> Vec<Column<Self>> {
        vec![
            column!(Self, "key": "text" = |j| {
                (!matches!(j.op, Op::DeletePrefix { .. })).then(|| j.key.as_str())
            }),
            column!(Self, "fence": "text" = |j| j.fence.as_str()),
            column!(Self, "token": "bigint" = |j| j.token.get()),
            column!(Self, "if_none_match": "boolean" = |j| j.if_none_match),
            column!(Self, "op": "text" = |j| match j.op {
                Op::Put => "put",
                Op::Delete => "delete",
                Op::DeletePrefix { .. } => "delete_prefix",
            }),
            column!(Self, "prefix": "text" = |j| j.prefix().map(KeyPrefix::as_str)),
            column!(Self, "prefix_end": "text" = |j| j.prefix().map(KeyPrefix::upper_bound)),
            column!(Self, "prefix_limit": "bigint" = |j| match j.op {
                Op::DeletePrefix { limit, .. } => Some(limit),
                _ => None,
            }),
            column!(Self, "has_if_match": "boolean" = |j| j.if_match.is_some()),
            // The strong tags as a JSON array, NULL for `*` (req makes it an array).
            column!(Self, "tags": "text" = |j| {
                let tags = j.if_match.as_ref().and_then(EntityTagCondition::strong_tags);
                tags.map(|t| serde_json::Value::from(t).to_string())
            }),
            column!(Self, "request_id": "text" = |j| j.ctx.request_id.as_deref()),
            column!(Self, "remote_addr": "text" = |j| j.ctx.remote_addr.as_deref()),
            column!(Self, "operation": "text" = |j| j.operation.as_str()),
            column!(Self, "etag": "text" = |j| j.write.as_ref().map(|w| w.etag.as_str())),
            column!(Self, "size": "bigint" = |j| {
                j.write.as_ref().map(|w| i64::try_from(w.body.len()).unwrap_or(i64::MAX))
            }),
            column!(Self, "content_type": "text" = |j| {
                j.write.as_ref().map(|w| w.content_type.as_str())
            }),
            column!(Self, "body": "bytea" = |j| {
                j.write.as_ref().filter(|w| !w.uploaded).map(|w| w.body.as_ref())
            }),
            column!(Self, "keep": "bigint" = |j| j.write.as_ref().map_or(0, |w| w.keep_versions)),
            column!(Self, "metadata": "text" = |j| {
                j.write.as_ref().and_then(|w| w.metadata.as_ref()).map(|m| m.as_json().to_string())
            }),
        ]
    }

    /// A delete_prefix's prefix.
    fn prefix(&self) -> Option<&KeyPrefix> {
        match &self.op {
            Op::DeletePrefix { prefix, .. } => Some(prefix),
            _ => None,
        }
    }

    /// The write statement over `jobs`, for a bound or an uploaded body.
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

/// The dispatchers of the snapshot calls' batches ([`super::engine::batch`]); each ends when
/// this is dropped.
#[derive(Debug)]
pub(crate) struct Batches {
    /// Fenced writes with their body bound.
    pub(crate) put: Batcher<PutBatch>,
    /// Checks of a fenced write before its body is read.
    pub(crate) precheck: Batcher<PrecheckBatch>,
    /// Snapshot reads.
    pub(crate) get: Batcher<GetBatch>,
}

impl Batches {
    /// Starts the dispatchers on `conns`.
    pub(crate) fn start(conns: &Conns) -> Self {
        Self {
            put: Batcher::start(conns.clone()),
            precheck: Batcher::start(conns.clone()),
            get: Batcher::start(conns.clone()),
        }
    }

    /// The requests waiting in batches to be sent.
    pub(crate) fn queued(&self) -> usize {
        self.put.queued() + self.precheck.queued() + self.get.queued()
    }
}

/// Fenced writes with their body bound, gathered into batches ([`super::engine::batch`]).
#[derive(Debug)]
pub(crate) struct PutBatch;

impl Kind for PutBatch {
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

/// Checks of fenced writes before their bodies are read, gathered into batches.
#[derive(Debug)]
pub(crate) struct PrecheckBatch;

impl Kind for PrecheckBatch {
    type Job = FencedJob;
    type Row = GatedRow<FencedRow>;
    const EFFECT: Effect = Effect::Changes;

    fn query<'q>(jobs: &[&'q FencedJob]) -> QueryAs<'q, Indexed<Self::Row>> {
        fenced().precheck.query(jobs)
    }
}

/// The snapshot read statement over a batch ([`get`]).
pub(crate) static GET: LazyLock<Batched<GetJob>> = LazyLock::new(|| {
    Batched::builder([
        column!(GetJob, "key": "text" = |j| j.key.as_str()),
        column!(GetJob, "version": "bigint" = |j| j.version.map(Version::get)),
        column!(GetJob, "with_body": "boolean" = |j| j.with_body),
        column!(GetJob, "keep": "bigint" = |j| j.keep_versions),
        column!(GetJob, "unless": "jsonb" = |j| j.unless.as_ref()),
    ])
    .part(include_str!("sql/get.sql"))
    .build()
});

/// One read of a batch.
#[derive(Debug)]
pub(crate) struct GetJob {
    pub(super) key: Key,
    pub(super) version: Option<Version>,
    pub(super) keep_versions: i64,
    pub(super) with_body: bool,
    /// The If-None-Match tags, as get.sql takes them.
    pub(super) unless: Option<serde_json::Value>,
}

impl Job for GetJob {
    fn key(&self) -> &Key {
        &self.key
    }
}

/// Snapshot reads, gathered into batches ([`super::engine::batch`]). Reads claim nothing: two of one
/// key share a batch.
#[derive(Debug)]
pub(crate) struct GetBatch;

impl Kind for GetBatch {
    type Job = GetJob;
    type Row = BodyRow;
    const EFFECT: Effect = Effect::Reads;

    fn query<'q>(jobs: &[&'q GetJob]) -> QueryAs<'q, Indexed<BodyRow>> {
        GET.query(jobs)
    }
}
