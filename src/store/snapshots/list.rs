//! The keys that have a snapshot, by prefix, with their current heads (as S3's ListObjectsV2).

use sqlx::{FromRow, PgPool};

use super::VersionRow;
use crate::domain::{Cursor, Key, KeyPrefix, ListOrder, Page, PageLimit, SnapshotMeta};
use crate::store::{Bounded, Result};

/// A page of snapshot keys under `prefix`, after `after`, in key order or reversed.
#[derive(Debug, Clone)]
pub struct SnapshotKeysQuery {
    /// Only keys that start with this.
    pub prefix: KeyPrefix,
    /// Page size.
    pub limit: PageLimit,
    /// Resume after this key, in the order asked for.
    pub after: Option<String>,
    /// Byte order of the keys' UTF-8, or its reverse.
    pub order: ListOrder,
}

/// The listing's statement (`sql/list.sql`), for the test of its plan.
#[doc(hidden)]
pub const STATEMENT: &str = include_str!("sql/list.sql");

#[derive(Debug, FromRow)]
struct KeyedVersionRow {
    key: String,
    #[sqlx(flatten)]
    version: VersionRow,
}

/// Lists the keys with a current snapshot; each page is one committed state.
pub async fn list(pool: &PgPool, q: &SnapshotKeysQuery) -> Result<Page<SnapshotMeta>> {
    let rows: Vec<KeyedVersionRow> = sqlx::query_as(STATEMENT)
        .bind(q.prefix.as_str())
        .bind(q.prefix.upper_bound())
        .bind(q.after.as_deref())
        .bind(q.limit.get() + 1)
        .bind(q.order.as_str())
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    let items = rows
        .into_iter()
        .map(|r| {
            let key = Key::parse(r.key).expect("stored keys are valid");
            r.version.into_meta(Some(&key))
        })
        .collect();
    Ok(Page::from_rows(items, q.limit, |m: &SnapshotMeta| {
        Cursor::after(m.key.as_ref().expect("listed with its key").as_str())
    }))
}
