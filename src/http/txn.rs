//! `POST /v1/txn` (v1.3): the body is checked whole here before the store runs it as one statement.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;

use super::Routes;
use super::error::ApiError;
use super::extract::{
    BodyLimit, Context, FencingTokenHeader, content_length, fencing_key, json_body, read_limited,
};
use crate::domain::{FencingToken, Key, KeyPrefix, TxnAnswer, TxnBody, TxnOp};
use crate::http::AppState;
use crate::store::snapshots::txn::{self, TxnOutcome, TxnRequest};

const TXN_TOO_LARGE: &str = "Send fewer or smaller puts, or raise the server's --max-snapshot-bytes (the bound of a transaction's body too)";

pub(super) fn routes() -> Routes {
    Routes::new().route("/v1/txn", post(run))
}

async fn run(
    State(state): State<AppState>,
    FencingTokenHeader(token): FencingTokenHeader,
    Context(mut ctx, idempotency): Context,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let fence = fencing_key(&headers)?.ok_or_else(|| {
        ApiError::InvalidRequest(
            "a transaction needs the Fencing-Key header: the key of the lease whose namespace holds every key it writes"
                .into(),
        )
    })?;
    let limit = BodyLimit {
        max_bytes: state.rules.max_snapshot_bytes,
        timeout: state.rules.body_timeout,
        hint: TXN_TOO_LARGE,
        budget: state.limits.bodies().clone(),
    };
    let raw = read_limited(body, content_length(&headers), limit).await?;
    let parsed: TxnBody = json_body(&raw)?;
    let req = checked(fence, token, parsed, state.rules.max_txn_ops)?;
    idempotency.attach(
        &mut ctx,
        "txn",
        &req.fence,
        &[&token.get().to_be_bytes(), &raw],
    );
    let done = txn::txn(
        &state.db,
        &req,
        state.rules.keep_versions,
        state.rules.max_txn_prefix_keys,
        &ctx,
    )
    .await;
    let prefix_limit = state.rules.max_txn_prefix_keys;
    idempotency.respond(done, |outcome| match outcome {
        TxnOutcome::Committed(results) => Ok(Json(TxnAnswer {
            token: req.token,
            fencing_key: req.fence.clone(),
            results,
        })
        .into_response()),
        TxnOutcome::Refused(refusal) => Err(ApiError::Refused {
            key: refusal.fence.clone(),
            refusal,
        }),
        TxnOutcome::PreconditionFailed { op_index } => {
            Err(ApiError::OpPreconditionFailed { op_index })
        }
        TxnOutcome::TooManyKeys => Err(ApiError::InvalidRequest(format!(
            "the prefix deletes of this transaction match more than {prefix_limit} snapshots; delete in pages (list the keys with GET /v1/snapshots?prefix=…&limit=…, then delete them in several transactions)"
        ))),
    })
}

/// The body checked: 1..=`max_ops` ops in the fence's namespace, each key once.
fn checked(
    fence: Key,
    token: FencingToken,
    body: TxnBody,
    max_ops: usize,
) -> Result<TxnRequest, ApiError> {
    let invalid = |n: usize, what: String| ApiError::InvalidRequest(format!("ops[{n}]: {what}"));
    if body.ops.is_empty() || body.ops.len() > max_ops {
        return Err(ApiError::InvalidRequest(format!(
            "a transaction has 1 to {max_ops} ops; this one has {}",
            body.ops.len()
        )));
    }
    let outside = |what: &str| {
        format!(
            "{what} is not in the namespace of the Fencing-Key {fence:?} (that key, or keys beginning with \"{fence}/\")"
        )
    };
    let mut ops = Vec::with_capacity(body.ops.len());
    for (n, op) in body.ops.into_iter().enumerate() {
        let op = TxnOp::try_from(op).map_err(|e| invalid(n, e.to_string()))?;
        match &op {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } if !key.in_namespace_of(&fence) => {
                return Err(invalid(n, outside(&format!("key {key:?}"))));
            }
            TxnOp::DeletePrefix { prefix } if !prefix.in_namespace_of(&fence) => {
                return Err(invalid(
                    n,
                    outside(&format!("prefix {:?}", prefix.as_str())),
                ));
            }
            _ => {}
        }
        ops.push(op);
    }
    check_disjoint(&ops)?;
    Ok(TxnRequest { fence, token, ops })
}

fn check_disjoint(ops: &[TxnOp]) -> Result<(), ApiError> {
    let keys: Vec<(usize, &Key)> = ops
        .iter()
        .enumerate()
        .filter_map(|(n, op)| match op {
            TxnOp::Put { key, .. } | TxnOp::Delete { key } => Some((n, key)),
            TxnOp::DeletePrefix { .. } => None,
        })
        .collect();
    let prefixes: Vec<(usize, &KeyPrefix)> = ops
        .iter()
        .enumerate()
        .filter_map(|(n, op)| match op {
            TxnOp::DeletePrefix { prefix } => Some((n, prefix)),
            _ => None,
        })
        .collect();
    let mut seen = std::collections::HashMap::new();
    for &(n, key) in &keys {
        if let Some(first) = seen.insert(key, n) {
            return Err(ApiError::InvalidRequest(format!(
                "ops[{first}] and ops[{n}] both name key {key:?}; a key may appear once in a transaction"
            )));
        }
        if let Some((p, prefix)) = prefixes.iter().find(|(_, p)| p.selects(key)) {
            return Err(ApiError::InvalidRequest(format!(
                "ops[{n}] names key {key:?}, which the delete_prefix of ops[{p}] ({:?}) also deletes; a key may appear once in a transaction",
                prefix.as_str()
            )));
        }
    }
    for (i, &(n, a)) in prefixes.iter().enumerate() {
        for &(m, b) in &prefixes[i + 1..] {
            if a.as_str().starts_with(b.as_str()) || b.as_str().starts_with(a.as_str()) {
                return Err(ApiError::InvalidRequest(format!(
                    "the delete_prefix of ops[{n}] ({:?}) and of ops[{m}] ({:?}) overlap; send the shorter one alone",
                    a.as_str(),
                    b.as_str()
                )));
            }
        }
    }
    Ok(())
}
