//! Transactions (`POST /v1/txn`): puts and deletes under one fence, all or nothing, checked by
//! `sql/fenced.sql`. Transactions that arrive together go as one batch, one statement in one short
//! transaction; each is decided by its own first op's gate, so none waits on another's verdict.

use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use tokio::time::Instant;

use super::Batches;
use super::Refusal;
use super::batches::{FencedJob, Op, PutBatch, Write, fenced};
use crate::domain::{
    AuditOperation, DEFAULT_CONTENT_TYPE, ETag, FencingToken, Key, RefusalReason, SnapshotMeta,
    TxnOp, TxnOpResult, Version,
};
use crate::store::engine::batch::{Indexed, Job, Kind};
use crate::store::engine::conns::{Conns, Effect};
use crate::store::engine::statement::QueryAs;
use crate::store::engine::{rolled_back_race, timeout_at};
use crate::store::idempotency::{self, Gated, GatedRow};
use crate::store::{RequestContext, Result, StoreError};

/// A transaction: its ops, fenced by `token` of the lease on `fence`.
#[derive(Debug, Clone)]
pub struct TxnRequest {
    /// The lease whose namespace holds every key of the ops.
    pub fence: Key,
    /// The token presented.
    pub token: FencingToken,
    /// The ops, in order; each key at most once, checked by the caller.
    pub ops: Vec<TxnOp>,
}

/// How a transaction ended; nothing was written unless it committed.
#[derive(Debug, Clone, PartialEq)]
pub enum TxnOutcome {
    /// Every op was done; their results in order.
    Committed(Vec<TxnOpResult>),
    /// A fencing rule refused it; the refusal is recorded.
    Refused(Refusal),
    /// The precondition of this op (from 0) did not hold.
    PreconditionFailed {
        /// The op.
        op_index: usize,
    },
    /// Its prefix deletes match more keys than a transaction may delete.
    TooManyKeys,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TxnRow {
    outcome: String,
    highest_token: Option<i64>,
    audit_id: Option<i64>,
    op_index: Option<usize>,
    results: Option<Vec<OpRow>>,
    deleted_keys: Option<Vec<String>>,
    settled: bool,
}

#[derive(Debug, Deserialize)]
struct OpRow {
    version: Option<i64>,
    updated_at: Option<DateTime<Utc>>,
    created: Option<bool>,
    deleted: Option<serde_json::Value>,
}

/// Runs a transaction; `prefix_limit` bounds the keys its prefix deletes may remove together.
#[tracing::instrument(level = "debug", skip_all, fields(fence = %req.fence, ops = req.ops.len()))]
pub async fn txn(
    db: &impl AsRef<Batches>,
    req: &TxnRequest,
    keep_versions: i64,
    prefix_limit: i64,
    ctx: &RequestContext,
) -> Result<Gated<TxnOutcome>> {
    let job = TxnJob {
        fence: req.fence.clone(),
        ops: jobs(req, keep_versions, prefix_limit, ctx).into(),
    };
    // A batch keeps two requests from sharing a key by their claims, and a prefix delete's keys
    // are known only to the statement: such a transaction runs alone.
    let alone = req
        .ops
        .iter()
        .any(|op| matches!(op, TxnOp::DeletePrefix { .. }));
    let gated = idempotency::gated(ctx, || async {
        if alone {
            let conns = &db.as_ref().conns;
            let rows = run(conns, conns.deadline(), &[&job]).await?;
            rows.into_iter().next().map(|r| r.row).ok_or_else(|| {
                StoreError::Internal(sqlx::Error::Protocol(
                    "a transaction's statement answered no row for it".into(),
                ))
            })
        } else {
            db.as_ref().txn.answer(job.clone()).await
        }
    })
    .await?;
    Ok(gated.map(|row| outcome(req, &job.ops, row)))
}

/// A transaction as a batch holds it: its ops, each key claimed, and its fence, which the watch
/// tells a batch's transactions apart by. The ops are shared with the caller, who answers from them.
#[derive(Debug, Clone)]
pub(crate) struct TxnJob {
    fence: Key,
    ops: Arc<[FencedJob]>,
}

impl Job for TxnJob {
    fn key(&self) -> &Key {
        &self.fence
    }

    fn claims(&self) -> Vec<String> {
        let fence = format!("fence\0{}", self.fence.as_str());
        self.ops
            .iter()
            .flat_map(Job::claims)
            .chain([fence])
            .collect()
    }
}

/// Transactions in one batch: a batch of them costs PostgreSQL ~0.7 ms a transaction on one
/// backend, so smaller batches, several in flight, keep more than one core at work.
const TXN_BATCH: usize = 8;

#[derive(Debug)]
pub(crate) struct TxnBatch;

impl Kind for TxnBatch {
    const NAME: &'static str = "txn";
    type Job = TxnJob;
    type Row = GatedRow<TxnRow>;
    const EFFECT: Effect = Effect::Changes;
    const MAX_JOBS: usize = TXN_BATCH;

    fn bytes(job: &TxnJob) -> usize {
        job.ops.iter().map(PutBatch::bytes).sum()
    }

    fn query<'q>(jobs: &[&'q TxnJob]) -> QueryAs<'q, Indexed<Self::Row>> {
        let ops: Vec<&FencedJob> = jobs.iter().flat_map(|t| t.ops.iter()).collect();
        fenced().txn.query(&ops)
    }

    fn run<'a>(
        conns: &'a Conns,
        deadline: Instant,
        jobs: &'a [&'a TxnJob],
    ) -> impl Future<Output = Result<Vec<Indexed<Self::Row>>>> + Send + 'a {
        run(conns, deadline, jobs)
    }
}

/// Runs transactions by `deadline` as one statement, then the versions of the keys they deleted
/// (`sql/delete_versions.sql`), in one short transaction: again from the start if a put lost the
/// race to create its head (its transaction would be half written) or a race rolled it back.
async fn run(
    conns: &Conns,
    deadline: Instant,
    txns: &[&TxnJob],
) -> Result<Vec<Indexed<GatedRow<TxnRow>>>> {
    let mut fresh = false;
    loop {
        let mut committing = false;
        let attempt = timeout_at(deadline, attempt(conns, deadline, txns, &mut committing)).await;
        let failed = match attempt {
            Ok(Ok(Some(rows))) => return Ok(rows),
            Ok(Ok(None)) => continue,
            Ok(Err(e)) => e,
            Err(_) => conns.timed_out(),
        };
        let before_deadline = Instant::now() < deadline;
        match failed {
            e if committing => return Err(e.after_sending()),
            e if rolled_back_race(&e) && before_deadline => continue,
            // A connection the server had closed fails before anything was sent: once more.
            StoreError::Unavailable(_) if !fresh && before_deadline => fresh = true,
            e => return Err(e),
        }
    }
}

/// One try of [`run`]: each transaction's answer, or `None` when one is not settled.
async fn attempt(
    conns: &Conns,
    deadline: Instant,
    txns: &[&TxnJob],
    committing: &mut bool,
) -> Result<Option<Vec<Indexed<GatedRow<TxnRow>>>>> {
    let ops: Vec<&FencedJob> = txns.iter().flat_map(|t| t.ops.iter()).collect();
    let firsts: Vec<i64> = txns
        .iter()
        .scan(1, |at, t| {
            let first = *at;
            *at += i64::try_from(t.ops.len()).expect("at most max_txn_ops");
            Some(first)
        })
        .collect();
    let mut tx = conns.begin(deadline).await?;
    let rows: Vec<Indexed<GatedRow<TxnRow>>> = fenced()
        .txn
        .query(&ops)
        .persistent(tx.persistent())
        .fetch_all(tx.conn())
        .await?;
    let mut answers: Vec<Indexed<GatedRow<TxnRow>>> = Vec::with_capacity(txns.len());
    let mut deleted = Vec::new();
    for answer in rows {
        let Ok(n) = firsts.binary_search(&answer.position()) else {
            continue;
        };
        if let Some(ran) = answer.row.ran()? {
            if !ran.settled {
                tx.rollback().await?;
                return Ok(None);
            }
            deleted.extend(ran.deleted_keys.into_iter().flatten());
        }
        answers.push(Indexed::new(n as i64 + 1, answer.row));
    }
    if !deleted.is_empty() {
        sqlx::query(include_str!("sql/delete_versions.sql"))
            .bind(deleted)
            .persistent(tx.persistent())
            .execute(tx.conn())
            .await?;
    }
    *committing = true;
    tx.commit().await?;
    Ok(Some(answers))
}

/// One request per op; the Idempotency-Key on the first alone, whose gate decides the transaction.
fn jobs(
    req: &TxnRequest,
    keep_versions: i64,
    prefix_limit: i64,
    ctx: &RequestContext,
) -> Vec<FencedJob> {
    req.ops
        .iter()
        .enumerate()
        .map(|(n, op)| {
            let mut ctx = ctx.clone();
            if n > 0 {
                ctx.idempotency = None;
            }
            let (key, op, write, if_match, if_none_match) = match op {
                TxnOp::Put {
                    key,
                    body,
                    content_type,
                    metadata,
                    if_match,
                    create_only,
                } => (
                    key.clone(),
                    Op::Put,
                    Some(Write {
                        body: body.clone(),
                        etag: ETag::of(body),
                        content_type: content_type
                            .clone()
                            .unwrap_or_else(|| DEFAULT_CONTENT_TYPE.to_owned()),
                        uploaded: false,
                        keep_versions,
                        metadata: metadata.clone(),
                    }),
                    if_match.clone(),
                    *create_only,
                ),
                TxnOp::Delete { key } => (key.clone(), Op::Delete, None, None, false),
                TxnOp::DeletePrefix { prefix } => (
                    req.fence.clone(),
                    Op::DeletePrefix {
                        prefix: prefix.clone(),
                        limit: prefix_limit,
                    },
                    None,
                    None,
                    false,
                ),
            };
            FencedJob {
                key,
                fence: req.fence.clone(),
                token: req.token,
                if_match,
                if_none_match,
                operation: AuditOperation::Txn,
                op,
                write,
                ctx,
                opens_group: n == 0,
            }
        })
        .collect()
}

fn outcome(req: &TxnRequest, jobs: &[FencedJob], row: TxnRow) -> TxnOutcome {
    let token = |t: i64| FencingToken::new(t).expect("stored tokens are positive");
    match row.outcome.as_str() {
        "accepted" => {
            let results = row.results.unwrap_or_default();
            TxnOutcome::Committed(
                req.ops
                    .iter()
                    .zip(jobs)
                    .zip(results)
                    .map(|((op, job), r)| result(req, op, job, r))
                    .collect(),
            )
        }
        "precondition_failed" => TxnOutcome::PreconditionFailed {
            op_index: row.op_index.expect("a failed precondition names its op"),
        },
        "too_many_keys" => TxnOutcome::TooManyKeys,
        reason => TxnOutcome::Refused(Refusal {
            reason: RefusalReason::parse(reason).expect("fenced verdicts"),
            presented: req.token,
            highest: row.highest_token.map(token),
            audit_id: row.audit_id.expect("a refusal has its audit row"),
            fence: req.fence.clone(),
        }),
    }
}

/// One op's result, from its job (what it wrote) and its row of the answer.
fn result(req: &TxnRequest, op: &TxnOp, job: &FencedJob, r: OpRow) -> TxnOpResult {
    match (op, &job.write) {
        (TxnOp::Put { key, metadata, .. }, Some(write)) => TxnOpResult::Put {
            created: r.created.unwrap_or(true),
            meta: SnapshotMeta {
                key: Some(key.clone()),
                version: Version::from_stored(r.version.expect("a put's version")),
                token: req.token,
                etag: write.etag.clone(),
                size: write.body.len() as i64,
                content_type: write.content_type.clone(),
                updated_at: r.updated_at.expect("a put's time"),
                fencing_key: Some(req.fence.clone()),
                metadata: metadata.clone(),
            },
        },
        (TxnOp::Delete { key }, _) => TxnOpResult::Delete {
            key: key.clone(),
            deleted: r.deleted.and_then(|d| d.as_bool()).unwrap_or(false),
        },
        (TxnOp::DeletePrefix { prefix }, _) => TxnOpResult::DeletePrefix {
            prefix: prefix.as_str().to_owned(),
            deleted: r.deleted.and_then(|d| d.as_u64()).unwrap_or(0),
        },
        (TxnOp::Put { .. }, None) => unreachable!("a put's job writes"),
    }
}
