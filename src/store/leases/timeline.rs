//! No token is issued twice across a failover: a promoted standby may lack acknowledged grants, so
//! every grant draws its token only after `secure_token_timeline()` secured the sequence on the
//! current WAL timeline (moving it past the largest known token plus 10^9 on a change).

use sqlx::PgPool;

use super::{Bounded, Result};

/// Secures the token sequence on the current timeline; the new position if it moved. The
/// migration's guard row lock lets exactly one concurrent caller move it, before any token is
/// drawn.
pub async fn secure(pool: &PgPool) -> Result<Option<i64>> {
    let moved: Option<i64> = sqlx::query_scalar(include_str!("sql/secure_timeline.sql"))
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
