//! The `api_keys` table: creating, listing and revoking keys, and the per-request lookup.
//!
//! Each instance keeps the live keys in memory ([`KeyCache`]), so a request costs no extra
//! round trip to authenticate. The cache follows the table through `LISTEN`: a trigger notifies
//! every change, and the cache reloads on each notification, so a creation or revocation
//! reaches every instance within the delivery of one notification (well under a second on a
//! healthy database). While the cache is not known to be current (before its first load,
//! after its listening connection broke and until it is back), every request is checked
//! against the table instead. A key the cache does not know is always looked up, so a key
//! works on every instance as soon as `snapfence keys create` has printed it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgListener;
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

/// Authenticates a request from the cache when it is current and knows the key, else with one
/// statement ([`lookup`]). The secret is compared in Rust, in constant time, never in SQL.
pub async fn authenticate(
    pool: &PgPool,
    cache: &KeyCache,
    presented: Option<&Presented>,
) -> Result<Lookup> {
    if let Some(live) = cache.current() {
        let known = presented.map(|p| live.get(&p.id).map(|k| (p, k)));
        match known {
            None => {
                return Ok(Lookup {
                    any_live: !live.is_empty(),
                    principal: None,
                });
            }
            Some(Some((p, key))) => {
                return Ok(Lookup {
                    any_live: true,
                    principal: p.matches(&key.secret_sha256).then(|| key.principal.clone()),
                });
            }
            // Perhaps created since the last notification arrived: ask the table.
            Some(None) => {}
        }
    }
    lookup(pool, presented).await
}

/// One statement: whether live keys exist, and the presented key if it is live.
async fn lookup(pool: &PgPool, presented: Option<&Presented>) -> Result<Lookup> {
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
    Ok(lookup(pool, None).await?.any_live)
}

/// The channel the `api_keys` trigger notifies on every change (see the migration).
const CHANNEL: &str = "snapfence_api_keys";
/// The pause before listening again after the listening connection failed.
const RELISTEN_AFTER: Duration = Duration::from_secs(1);

/// A live key as the cache holds it.
#[derive(Debug)]
struct LiveKey {
    principal: Principal,
    secret_sha256: Vec<u8>,
}

/// The live keys by id.
type LiveKeys = HashMap<i64, LiveKey>;

/// One instance's copy of the live keys, kept current by a task that listens for changes; see
/// the module docs. Cheap to clone; the task stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct KeyCache {
    live: Arc<RwLock<Option<Arc<LiveKeys>>>>,
    _listener: Arc<AbortOnDrop>,
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl KeyCache {
    /// Starts following the table of `pool`'s database. Must be called within a Tokio runtime.
    pub fn follow(pool: PgPool) -> Self {
        let live = Arc::new(RwLock::new(None));
        let task = tokio::spawn(listen(pool, live.clone()));
        Self {
            live,
            _listener: Arc::new(AbortOnDrop(task)),
        }
    }

    /// The live keys, if the copy is current.
    fn current(&self) -> Option<Arc<LiveKeys>> {
        self.live.read().expect("never poisoned").clone()
    }
}

/// Listens, loads, and reloads on every notification; on any failure forgets the copy (so
/// requests go to the table) and starts again. `LISTEN` comes before the load, so no change
/// committed after the load can go unnoticed.
async fn listen(pool: PgPool, live: Arc<RwLock<Option<Arc<LiveKeys>>>>) {
    let set = |keys: Option<LiveKeys>| *live.write().expect("never poisoned") = keys.map(Arc::new);
    loop {
        let failure = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(CHANNEL).await?;
            loop {
                set(Some(load(&pool).await?));
                // `None`: the connection was lost, and notifications with it.
                if listener.try_recv().await?.is_none() {
                    return Ok::<(), sqlx::Error>(());
                }
            }
        }
        .await;
        set(None);
        if let Err(e) = failure {
            tracing::warn!(error = %e, "cannot follow the API keys; checking each request against the table until this recovers");
        }
        tokio::time::sleep(RELISTEN_AFTER).await;
    }
}

#[derive(FromRow)]
struct LiveRow {
    id: i64,
    name: String,
    scope: String,
    prefix: String,
    secret_sha256: Vec<u8>,
}

/// Every live key.
async fn load(pool: &PgPool) -> sqlx::Result<LiveKeys> {
    let rows: Vec<LiveRow> = sqlx::query_as(
        "SELECT id, name, scope, prefix, secret_sha256 FROM api_keys WHERE revoked_at IS NULL",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let principal = Principal {
                name: r.name,
                scope: Scope::parse(&r.scope).expect("the table's check constraint"),
                prefix: r.prefix,
            };
            (
                r.id,
                LiveKey {
                    principal,
                    secret_sha256: r.secret_sha256,
                },
            )
        })
        .collect())
}
