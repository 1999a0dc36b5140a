//! The `api_keys` table: creating, listing and revoking keys, and the per-request lookup.
//!
//! The lookup reads the table on every request rather than caching it, so a revocation takes
//! effect on every instance with the next request after its commit.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::{FromRow, PgPool};

use super::Result;
use crate::domain::{KeyName, KeyPrefix, NewSecret, Presented, Principal, Scope, rfc3339_millis};

/// A key as listed: everything but its secret, which is never stored.
#[derive(Debug, Clone, PartialEq, Serialize, FromRow)]
pub struct ApiKey {
    /// The key's id, the number in its token `sf_<id>_…`.
    pub id: i64,
    /// Its name, the principal in the audit log.
    pub name: String,
    /// `read`, `write` or `admin`.
    pub scope: String,
    /// The keys it is confined to ('' for all).
    pub prefix: String,
    /// When it was made.
    #[serde(with = "rfc3339_millis")]
    pub created_at: DateTime<Utc>,
    /// When it was revoked, if it was.
    #[serde(serialize_with = "optional_time")]
    pub revoked_at: Option<DateTime<Utc>>,
}

fn optional_time<S: serde::Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => rfc3339_millis::serialize(t, s),
        None => s.serialize_none(),
    }
}

/// Makes a key and returns it with its bearer token, which is shown this once and never again.
/// A live key of the same name is a unique violation, reported as `Ok(None)`.
pub async fn create(
    pool: &PgPool,
    name: &KeyName,
    scope: Scope,
    prefix: &KeyPrefix,
) -> Result<Option<(ApiKey, String)>> {
    let secret = NewSecret::generate();
    let row: Option<ApiKey> = sqlx::query_as(
        "INSERT INTO api_keys (name, scope, prefix, secret_sha256) VALUES ($1, $2, $3, $4)
         ON CONFLICT (name) WHERE revoked_at IS NULL DO NOTHING
         RETURNING id, name, scope, prefix, created_at, revoked_at",
    )
    .bind(name.as_str())
    .bind(scope.as_str())
    .bind(prefix.as_str())
    .bind(&secret.sha256)
    .fetch_optional(pool)
    .await?;
    Ok(row.map(|key| {
        let token = secret.token(key.id);
        (key, token)
    }))
}

/// Every key, live and revoked, oldest first.
pub async fn list(pool: &PgPool) -> Result<Vec<ApiKey>> {
    Ok(sqlx::query_as(
        "SELECT id, name, scope, prefix, created_at, revoked_at FROM api_keys ORDER BY id",
    )
    .fetch_all(pool)
    .await?)
}

/// Revokes the live key of this name; `false` when there is none.
pub async fn revoke(pool: &PgPool, name: &KeyName) -> Result<bool> {
    let done = sqlx::query(
        "UPDATE api_keys SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
    )
    .bind(name.as_str())
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// What the database says about a request's credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    /// Whether any live key exists (without one, a loopback-only server is open).
    pub any_live: bool,
    /// The presented key, when it exists, is live, and its secret matches.
    pub principal: Option<Principal>,
}

#[derive(FromRow)]
struct LookupRow {
    any_live: bool,
    name: Option<String>,
    scope: Option<String>,
    prefix: Option<String>,
    secret_sha256: Option<Vec<u8>>,
}

/// One statement per request: whether live keys exist, and the presented key if it is live.
/// The secret is compared in Rust, in constant time, never in SQL.
pub async fn authenticate(pool: &PgPool, presented: Option<&Presented>) -> Result<Lookup> {
    let row: LookupRow = sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL) AS any_live,
                k.name, k.scope, k.prefix, k.secret_sha256
         FROM (VALUES (1)) AS one
         LEFT JOIN api_keys k ON k.id = $1 AND k.revoked_at IS NULL",
    )
    .bind(presented.map(|p| p.id))
    .fetch_one(pool)
    .await?;
    let principal = match (
        presented,
        row.name,
        row.scope,
        row.prefix,
        row.secret_sha256,
    ) {
        (Some(p), Some(name), Some(scope), Some(prefix), Some(hash)) if p.matches(&hash) => {
            Some(Principal {
                name,
                scope: Scope::parse(&scope).expect("the table's check constraint"),
                prefix,
            })
        }
        _ => None,
    };
    Ok(Lookup {
        any_live: row.any_live,
        principal,
    })
}

/// Whether any live key exists.
pub async fn any_live(pool: &PgPool) -> Result<bool> {
    Ok(authenticate(pool, None).await?.any_live)
}
