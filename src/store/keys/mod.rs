//! The `api_keys` table: creating, listing and revoking keys, and the per-request lookup.
//!
//! Each instance keeps the live keys in memory ([`KeyCache`]), so a request with a key costs no
//! extra round trip to authenticate. The cache follows the table through `LISTEN`: a trigger
//! notifies every change at commit with the changing transaction's id; an instance stops
//! trusting its copy the moment a notification arrives, reloads it, and then confirms the
//! change on a second channel. `snapfence keys create` and `keys revoke` wait for the
//! confirmation of every instance that follows the table ([`Confirmations`]), so when they
//! return the change is in force on every instance. While the copy is not known to be current
//! (before its first load, between a notification and the reload, after its listening
//! connection broke and until it is back), every request is checked against the table
//! instead. A key the copy does not know is always looked up, so a key also works on an
//! instance that has not yet confirmed it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::postgres::PgListener;
use sqlx::{FromRow, PgPool, Row};

use super::{Bounded, Result};
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

/// A committed change to the keys: the id of the transaction that made it, as the table's
/// trigger notifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change(i64);

/// Makes a key and returns it with its bearer token, which is shown this once and never again,
/// and the change to confirm. A live key of the same name is a unique violation, reported as
/// `Ok(None)`.
pub async fn create(
    pool: &PgPool,
    name: &KeyName,
    scope: Scope,
    prefix: &KeyPrefix,
) -> Result<Option<(ApiKey, String, Change)>> {
    let secret = NewSecret::generate();
    let row = sqlx::query(include_str!("sql/create.sql"))
        .bind(name.as_str())
        .bind(scope.as_str())
        .bind(prefix.as_str())
        .bind(&secret.sha256)
        .fetch_optional(pool)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let key = ApiKey::from_row(&row)?;
    let token = secret.token(key.id);
    Ok(Some((key, token, Change(row.try_get("change")?))))
}

/// Every key, live and revoked, oldest first.
pub async fn list(pool: &PgPool) -> Result<Vec<ApiKey>> {
    Ok(sqlx::query_as(include_str!("sql/list.sql"))
        .fetch_all(pool)
        .await?)
}

/// Revokes the live key of this name and returns the change to confirm; `None` when there is
/// no live key of that name.
pub async fn revoke(pool: &PgPool, name: &KeyName) -> Result<Option<Change>> {
    Ok(sqlx::query_scalar(include_str!("sql/revoke.sql"))
        .bind(name.as_str())
        .fetch_optional(pool)
        .await?
        .map(Change))
}

/// The `application_name` each instance gives its listening connection once it listens, by
/// which [`Confirmations`] finds the instances that follow the table.
const FOLLOWER: &str = "snapfence-key-follower";
/// The channel on which an instance confirms that it applied a change.
const APPLIED: &str = "snapfence_api_keys_applied";

/// Listens for the instances' confirmations of a change to the keys. Made before the change,
/// so that every instance it expects was listening before the change committed, and no
/// confirmation can come before it listens.
pub struct Confirmations {
    listener: PgListener,
    followers: Vec<i32>,
}

/// How many of the instances that follow the table confirmed a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The instances following the table before the change committed.
    pub following: usize,
    /// The backend pids of the listening connections that did not confirm in time.
    pub silent: Vec<i32>,
}

impl Confirmations {
    /// Starts listening for confirmations, and finds the instances that follow the table (an
    /// instance that starts to follow it later reads the table after the change).
    pub async fn listen(pool: &PgPool) -> Result<Self> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(APPLIED).await?;
        let followers = sqlx::query_scalar(include_str!("sql/followers.sql"))
            .bind(FOLLOWER)
            .fetch_all(pool)
            .bounded(pool)
            .await?;
        Ok(Self {
            listener,
            followers,
        })
    }

    /// Waits up to `within` until every instance that followed the table has applied `change`.
    /// An instance whose listening connection breaks meanwhile does not confirm; it checks every
    /// request against the table once it notices.
    pub async fn wait(mut self, change: Change, within: Duration) -> Result<Confirmed> {
        let following = self.followers.len();
        let mut silent: HashSet<i32> = self.followers.into_iter().collect();
        let payload = change.0.to_string();
        let deadline = tokio::time::Instant::now() + within;
        while !silent.is_empty() {
            match tokio::time::timeout_at(deadline, self.listener.try_recv()).await {
                Err(_) | Ok(Ok(None)) => break,
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(Some(n))) if n.payload() == payload => {
                    silent.remove(&(n.process_id() as i32));
                }
                Ok(Ok(Some(_))) => {}
            }
        }
        let mut silent: Vec<i32> = silent.into_iter().collect();
        silent.sort_unstable();
        Ok(Confirmed { following, silent })
    }
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
/// statement (`lookup`). The secret is compared in Rust, in constant time, never in SQL.
pub async fn authenticate(
    pool: &PgPool,
    cache: &KeyCache,
    presented: Option<&Presented>,
) -> Result<Lookup> {
    if let Some(live) = cache.current() {
        match presented.map(|p| (p, live.get(&p.id))) {
            None => {
                return Ok(Lookup {
                    any_live: !live.is_empty(),
                    principal: None,
                });
            }
            Some((p, Some(key))) => {
                return Ok(Lookup {
                    any_live: true,
                    principal: p.matches(&key.secret_sha256).then(|| key.principal.clone()),
                });
            }
            // Perhaps made since the copy was loaded: ask the table.
            Some((_, None)) => {}
        }
    }
    lookup(pool, presented).await
}

/// One statement: whether live keys exist, and the presented key if it is live.
async fn lookup(pool: &PgPool, presented: Option<&Presented>) -> Result<Lookup> {
    let row: LookupRow = sqlx::query_as(include_str!("sql/lookup.sql"))
        .bind(presented.map(|p| p.id))
        .fetch_one(pool)
        .bounded(pool)
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
                id: p.id,
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

/// Whether the key of id `id` is live, by the table.
async fn is_live(pool: &PgPool, id: i64) -> Result<bool> {
    sqlx::query_scalar("SELECT EXISTS (SELECT FROM api_keys WHERE id = $1 AND revoked_at IS NULL)")
        .bind(id)
        .fetch_one(pool)
        .bounded(pool)
        .await
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
    /// Bumped at every load of the copy, before the change that caused it is confirmed: what
    /// the open watch streams of a revoked key wait on ([`KeyCache::revoked`]).
    loads: tokio::sync::watch::Sender<u64>,
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
        let loads = tokio::sync::watch::Sender::new(0);
        let task = tokio::spawn(listen(pool, live.clone(), loads.clone()));
        Self {
            live,
            loads,
            _listener: Arc::new(AbortOnDrop(task)),
        }
    }

    /// Resolves once the key of id `id` is no longer live: at the first load of the copy that
    /// lacks it, which comes before this instance confirms the revocation (so when `keys revoke`
    /// returns, every instance has woken its streams of the key). A key revoked before this is
    /// called resolves it at once. Never resolves for a live key.
    pub async fn revoked(&self, pool: &PgPool, id: i64) -> Result<()> {
        let mut loads = self.loads.subscribe();
        // The key was live when its request was authenticated; a load since then that lacks it
        // may have come before the subscription. The copy lacks a key made after its load too,
        // so only the table can tell those apart.
        if self.current().is_some_and(|live| !live.contains_key(&id)) && !is_live(pool, id).await? {
            return Ok(());
        }
        loop {
            if loads.changed().await.is_err() {
                // The follower stopped (its instance is going away): nothing more to learn.
                return std::future::pending().await;
            }
            // Loaded after the change it follows: a key it lacks is not live.
            if self.current().is_some_and(|live| !live.contains_key(&id)) {
                return Ok(());
            }
        }
    }

    /// The live keys, if the copy is current.
    fn current(&self) -> Option<Arc<LiveKeys>> {
        self.live.read().expect("never poisoned").clone()
    }
}

/// Listens, loads, and on every notification forgets the copy, reloads it and confirms the
/// change; on any failure forgets the copy (so requests go to the table) and starts again.
/// `LISTEN` comes before the load, so no change committed after the load can go unnoticed.
async fn listen(
    pool: PgPool,
    live: Arc<RwLock<Option<Arc<LiveKeys>>>>,
    loads: tokio::sync::watch::Sender<u64>,
) {
    let set = |keys: Option<LiveKeys>| {
        let loaded = keys.is_some();
        *live.write().expect("never poisoned") = keys.map(Arc::new);
        if loaded {
            loads.send_modify(|n| *n += 1);
        }
    };
    let own = super::listening_pool(&pool);
    loop {
        let failure = async {
            let mut listener = PgListener::connect_with(&own).await?;
            listener.listen(CHANNEL).await?;
            // Named only once it listens: every instance `Confirmations` counts will confirm.
            sqlx::query("SELECT set_config('application_name', $1, false)")
                .bind(FOLLOWER)
                .execute(&mut listener)
                .await?;
            set(Some(load(&pool).await?));
            // `None`: the connection was lost, and notifications with it.
            while let Some(change) = listener.try_recv().await? {
                set(None);
                set(Some(load(&pool).await?));
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(APPLIED)
                    .bind(change.payload())
                    .execute(&mut listener)
                    .await?;
            }
            Ok::<(), sqlx::Error>(())
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
    let rows: Vec<LiveRow> = sqlx::query_as(include_str!("sql/live.sql"))
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let principal = Principal {
                id: r.id,
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
