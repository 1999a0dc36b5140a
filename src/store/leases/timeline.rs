//! The timeline guard of the token sequence: no token is issued twice across a failover.
//!
//! A standby promoted after asynchronous replication may lack grants that its old primary
//! acknowledged, together with the sequence positions they drew; its sequence would hand those
//! tokens out again. Every grant therefore draws its token only after `secure_token_timeline()`
//! (the migration `token_timeline`; the acquire statement runs it once per batch, before any
//! `nextval`) has secured the sequence on the server's current WAL timeline: on a timeline
//! change (a promotion, a point-in-time restore) it moves the sequence past the largest token it
//! knows of plus a safety gap of 10^9, more than an old primary can have issued unseen.
//! [`secure`] runs the same check at start, so the log says when it moved.

use sqlx::PgPool;

use super::{Bounded, Result};

/// Secures the token sequence on the database's current timeline; returns the new position when
/// the timeline had changed since it was last secured.
///
/// One call of `secure_token_timeline()`, whose race-freedom argument is in the migration: the
/// guard row is locked and re-read before the sequence moves, so of concurrent callers (grants
/// or other instances starting) exactly one moves it, and none draws a token before that is
/// committed. A database in recovery (a standby) answers `read_only_sql_transaction`, which is
/// [`Unavailable`](crate::store::StoreError::Unavailable): the service waits for a primary.
pub async fn secure(pool: &PgPool) -> Result<Option<i64>> {
    let moved: Option<i64> = sqlx::query_scalar("SELECT secure_token_timeline()")
        .fetch_one(pool)
        .bounded_change(pool)
        .await?;
    if let Some(position) = moved {
        tracing::warn!(
            position,
            "the database is on a new timeline (a promoted standby or a restore): moved the token \
             sequence past every token the old timeline can have issued"
        );
    }
    Ok(moved)
}
