//! The waiting acquires' queues as operators read them (`GET /v1/leases/{key}/waiters`).

use chrono::{DateTime, Utc};
use sqlx::{FromRow, PgPool};

use crate::domain::{Cursor, Key, Page, PageLimit, Waiter};
use crate::store::{Bounded, Result};

#[derive(Debug, FromRow)]
struct WaiterRow {
    id: i64,
    position: i64,
    owner: Option<String>,
    since: DateTime<Utc>,
}

/// A page of `key`'s queue in grant order after waiter `after`; one plain read.
pub async fn waiters(
    pool: &PgPool,
    key: &Key,
    limit: PageLimit,
    after: Option<i64>,
) -> Result<Page<Waiter>> {
    let rows: Vec<WaiterRow> = sqlx::query_as(include_str!("sql/waiters_list.sql"))
        .bind(key.as_str())
        .bind(after.unwrap_or(0))
        .bind(limit.get() + 1)
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    let page = Page::from_rows(rows, limit, |r: &WaiterRow| Cursor::after_id(r.id));
    Ok(Page {
        items: page
            .items
            .into_iter()
            .map(|r| Waiter {
                position: r.position,
                owner: r.owner,
                since: r.since,
            })
            .collect(),
        next_cursor: page.next_cursor,
    })
}
