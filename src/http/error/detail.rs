//! The `detail` texts of the variants that depend on their fields: what happened and what to do.

use super::{ApiError, Unavailability};
use crate::domain::RefusalReason;
use crate::domain::{Holder, Key, LeaseState};
use crate::store::StoreError;
use crate::store::snapshots::Refusal;

pub(super) fn uri_detail(size: Option<usize>, limit: usize) -> String {
    let size = size.map_or_else(String::new, |n| format!("{n} bytes, "));
    format!(
        "the request target is {size}over this server's limit of {limit} bytes; a key is at most 512 bytes (1536 percent-encoded), so send a shorter path and query"
    )
}

pub(super) fn database_detail(e: &StoreError) -> String {
    match e {
        StoreError::Unavailable(_) => ApiError::Unavailable(Unavailability::Database).to_string(),
        StoreError::Indeterminate(_) => format!("{INDETERMINATE_OUTCOME}. {INDETERMINATE_NEXT}"),
        StoreError::Internal(_) | StoreError::Migrate(_) => ApiError::Internal.to_string(),
    }
}

pub(super) const INDETERMINATE_OUTCOME: &str = "the request reached the database, but its answer did not \
    come back in time (the link broke, or the deadline passed): it may or may not have taken effect";

const INDETERMINATE_NEXT: &str = "Read the key (GET its lease or snapshot) to see what happened \
    before you retry, or send changing calls with an Idempotency-Key, which makes a retry safe";

pub(super) fn held_detail(
    key: &Key,
    holder: &Holder,
    state: LeaseState,
    waiters: Option<i64>,
) -> String {
    let ended = match state {
        LeaseState::Held => {
            return format!(
                "key {key:?} is held by {:?} until {}; retry once it expires or is released",
                holder.owner,
                holder
                    .expires_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            );
        }
        LeaseState::Released => "was released",
        LeaseState::Expired => "expired",
        LeaseState::RecoveryPending => "has no live lease",
    };
    let to = match waiters {
        Some(1) => "the waiting acquire queued before this request".to_owned(),
        Some(n) => format!("the first of the {n} waiting acquires queued before this request"),
        None => "a waiting acquire queued before this request".to_owned(),
    };
    format!(
        "key {key:?} {ended} (last held by {:?}), and goes to {to}: send wait_ms to queue behind them",
        holder.owner
    )
}

pub(super) fn refusal_detail(key: &Key, r: &Refusal) -> String {
    let highest = r.highest.map_or_else(
        || "none (the key never had a lease)".to_owned(),
        |t| t.to_string(),
    );
    let fence = if &r.fence == key {
        format!("key {key:?}")
    } else {
        format!("key {key:?} under the fence {:?}", r.fence)
    };
    match r.reason {
        RefusalReason::StaleToken => format!(
            "token {} is stale for {fence} (newest token {highest}, or its lease was released or abandoned, \
             or a newer token wrote the key): this holder was superseded. Stop writing and acquire the \
             key again; the refusal is audit row {}",
            r.presented, r.audit_id
        ),
        RefusalReason::UnknownToken => format!(
            "token {} was never issued for {fence} (newest token {highest}): write with the token of \
             your own grant; the refusal is audit row {}",
            r.presented, r.audit_id
        ),
    }
}
