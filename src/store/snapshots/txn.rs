//! Transactions (`POST /v1/txn`): puts and deletes under one fence, all or nothing, checked by
//! `sql/fenced.sql`; run again if a put lost the race to create its head.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use sqlx::PgPool;

use super::Refusal;
use super::batches::{FencedJob, Op, Write, fenced};
use crate::domain::{
    AuditOperation, DEFAULT_CONTENT_TYPE, ETag, FencingToken, Key, RefusalReason, SnapshotMeta,
    TxnOp, TxnOpResult, Version,
};
use crate::store::engine::batch::Indexed;
use crate::store::idempotency::{self, Gated, GatedRow};
use crate::store::{Bounded, RequestContext, Result};

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
struct TxnRow {
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
    pool: &PgPool,
    req: &TxnRequest,
    keep_versions: i64,
    prefix_limit: i64,
    ctx: &RequestContext,
) -> Result<Gated<TxnOutcome>> {
    let jobs = jobs(req, keep_versions, prefix_limit, ctx);
    let refs: Vec<&FencedJob> = jobs.iter().collect();
    let gated = loop {
        let gated = idempotency::gated(ctx, || async {
            let mut tx = pool.begin().bounded(pool).await?;
            let rows: Vec<Indexed<GatedRow<TxnRow>>> = fenced()
                .txn
                .query(&refs)
                .fetch_all(&mut *tx)
                .bounded(pool)
                .await?;
            let first = rows
                .into_iter()
                .find(|r| r.position() == 1)
                .expect("a transaction's statement answers on its first op's row")
                .row;
            match first.ran()? {
                Some(TxnRow { settled: false, .. }) => {
                    tx.rollback().bounded(pool).await?;
                    return Ok(first);
                }
                Some(TxnRow {
                    deleted_keys: Some(keys),
                    ..
                }) if !keys.is_empty() => {
                    sqlx::query(include_str!("sql/delete_versions.sql"))
                        .bind(keys)
                        .execute(&mut *tx)
                        .bounded(pool)
                        .await?;
                }
                _ => {}
            }
            tx.commit().bounded_change(pool).await?;
            Ok(first)
        })
        .await?;
        match gated {
            Gated::Ran(TxnRow { settled: false, .. }) => continue,
            gated => break gated,
        }
    };
    Ok(gated.map(|row| outcome(req, &jobs, row)))
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
