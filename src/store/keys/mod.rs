//! The `api_keys` table. Each instance keeps the live keys in memory ([`KeyCache`]), reloading on
//! every notification on its listening connection and confirming each load with its snapshot;
//! `keys create` and `keys revoke` wait until every instance's copy holds the change
//! ([`Confirmations`]). Until its copy is known current, an instance checks the table.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::{BoxFuture, FutureExt};
use serde::Serialize;
use sqlx::postgres::PgListener;
use sqlx::{FromRow, PgPool, Row};

use super::engine::listen::Subscriber;
use super::{Bounded, Engine, Result};
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

/// A committed change to the keys: its transaction id, as the trigger notifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change(i64);

/// Makes a key with its bearer token (shown once); `Ok(None)` when the name is live already.
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

/// Revokes the live key of this name; `None` when there is none.
pub async fn revoke(pool: &PgPool, name: &KeyName) -> Result<Option<Change>> {
    Ok(sqlx::query_scalar(include_str!("sql/revoke.sql"))
        .bind(name.as_str())
        .fetch_optional(pool)
        .await?
        .map(Change))
}

const FOLLOWER: &str = "snapfence-key-follower";
const APPLIED: &str = "snapfence_api_keys_applied";

/// Listens for the instances' confirmations; made before the change, so none comes unheard.
pub struct Confirmations {
    listener: PgListener,
}

/// How many of the instances that follow the table confirmed a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirmed {
    /// The instances following the table once the change committed.
    pub following: usize,
    /// Backend pids of listening connections that did not confirm in time.
    pub silent: Vec<i32>,
}

impl Confirmations {
    /// Listens on the confirmations' channel.
    pub async fn listen(pool: &PgPool) -> Result<Self> {
        let mut listener = PgListener::connect_with(pool).await?;
        listener.listen(APPLIED).await?;
        Ok(Self { listener })
    }

    /// Waits up to `within` for every instance following the table once `change` committed to
    /// load a copy that holds it. Each confirms with the snapshot of its load, so an instance
    /// that started, or loaded for another reason, after the commit confirms as well as one that
    /// was told of it; one whose connection is gone has no copy left to confirm.
    pub async fn wait(mut self, change: Change, within: Duration) -> Result<Confirmed> {
        let mut silent: HashSet<i32> = self.followers().await?.into_iter().collect();
        let following = silent.len();
        let deadline = tokio::time::Instant::now() + within;
        let mut recount = tokio::time::interval(Duration::from_millis(500));
        recount.tick().await;
        while !silent.is_empty() {
            let heard = tokio::select! {
                heard = tokio::time::timeout_at(deadline, self.listener.try_recv()) => heard,
                _ = recount.tick() => {
                    let live: HashSet<i32> = self.followers().await?.into_iter().collect();
                    silent.retain(|pid| live.contains(pid));
                    continue;
                }
            };
            match heard {
                Err(_) | Ok(Ok(None)) => break,
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(Some(n))) => {
                    let pid = n.process_id() as i32;
                    if silent.contains(&pid) && self.holds(change, n.payload()).await? {
                        silent.remove(&pid);
                    }
                }
            }
        }
        let mut silent: Vec<i32> = silent.into_iter().collect();
        silent.sort_unstable();
        Ok(Confirmed { following, silent })
    }

    async fn followers(&mut self) -> Result<Vec<i32>> {
        Ok(sqlx::query_scalar(include_str!("sql/followers.sql"))
            .bind(FOLLOWER)
            .fetch_all(&mut self.listener)
            .await?)
    }

    /// Whether a confirmation's snapshot sees `change` (an older instance confirms by its id).
    async fn holds(&mut self, change: Change, seen: &str) -> Result<bool> {
        if seen.parse::<i64>().is_ok() {
            return Ok(seen == change.0.to_string());
        }
        Ok(sqlx::query_scalar(include_str!("sql/holds.sql"))
            .bind(change.0)
            .bind(seen)
            .fetch_one(&mut self.listener)
            .await?)
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

/// Authenticates from the cache when it can, else by `lookup`; secrets are compared in Rust.
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
            Some((_, None)) => {}
        }
    }
    lookup(pool, presented).await
}

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

async fn is_live(pool: &PgPool, id: i64) -> Result<bool> {
    sqlx::query_scalar(include_str!("sql/is_live.sql"))
        .bind(id)
        .fetch_one(pool)
        .bounded(pool)
        .await
}

/// Whether any live key exists.
pub async fn any_live(pool: &PgPool) -> Result<bool> {
    Ok(lookup(pool, None).await?.any_live)
}

const CHANNEL: &str = "snapfence_api_keys";
#[derive(Debug)]
struct LiveKey {
    principal: Principal,
    secret_sha256: Vec<u8>,
}

type LiveKeys = HashMap<i64, LiveKey>;

/// One instance's copy of the live keys, kept current by its subscription. Cheap to clone.
#[derive(Debug, Clone)]
pub struct KeyCache(Arc<Cache>);

#[derive(Debug)]
struct Cache {
    live: RwLock<Option<Arc<LiveKeys>>>,
    /// What a revoked key's streams wait on: bumped at every load, before its change is confirmed.
    loads: tokio::sync::watch::Sender<u64>,
}

impl KeyCache {
    /// Starts following the table on the instance's listening connection; needs a Tokio runtime.
    pub fn follow(db: &impl AsRef<Engine>) -> Self {
        let db: &Engine = db.as_ref();
        let cache = Arc::new(Cache {
            live: RwLock::new(None),
            loads: tokio::sync::watch::Sender::new(0),
        });
        db.hub().subscribe(Arc::new(Follower {
            cache: Arc::downgrade(&cache),
        }));
        Self(cache)
    }

    /// Resolves once key `id` is no longer live, before this instance confirms the revocation.
    pub async fn revoked(&self, pool: &PgPool, id: i64) -> Result<()> {
        let mut loads = self.0.loads.subscribe();
        // A load lacking the key may predate the subscription, or the key be newer: ask the table.
        if self.current().is_some_and(|live| !live.contains_key(&id)) && !is_live(pool, id).await? {
            return Ok(());
        }
        loop {
            if loads.changed().await.is_err() {
                return std::future::pending().await;
            }
            if self.current().is_some_and(|live| !live.contains_key(&id)) {
                return Ok(());
            }
        }
    }

    fn current(&self) -> Option<Arc<LiveKeys>> {
        self.0.live.read().expect("never poisoned").clone()
    }
}

/// The cache's subscription: loads once the connection listens (so no later change goes
/// unnoticed), and at each notification forgets, reloads and confirms on the same connection.
/// Without a connection it forgets, so each request is checked against the table.
struct Follower {
    cache: Weak<Cache>,
}

impl Follower {
    fn set(&self, keys: Option<LiveKeys>) {
        let Some(cache) = self.cache.upgrade() else {
            return;
        };
        let loaded = keys.is_some();
        *cache.live.write().expect("never poisoned") = keys.map(Arc::new);
        if loaded {
            cache.loads.send_modify(|n| *n += 1);
        }
    }

    /// Loads the live keys and confirms with a snapshot read just before, which says which
    /// changes the copy holds at least.
    async fn reload(&self, conn: &mut PgListener) -> sqlx::Result<()> {
        self.set(None);
        let seen: String = sqlx::query_scalar(include_str!("sql/seen.sql"))
            .fetch_one(&mut *conn)
            .await?;
        self.set(Some(load(conn).await?));
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(APPLIED)
            .bind(seen)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}

impl Subscriber for Follower {
    fn channel(&self) -> &'static str {
        CHANNEL
    }

    fn gone(&self) -> bool {
        self.cache.strong_count() == 0
    }

    fn listening<'a>(&'a self, conn: &'a mut PgListener) -> BoxFuture<'a, sqlx::Result<()>> {
        async move {
            sqlx::query("SELECT set_config('application_name', $1, false)")
                .bind(FOLLOWER)
                .execute(&mut *conn)
                .await?;
            self.reload(conn).await
        }
        .boxed()
    }

    fn heard<'a>(
        &'a self,
        _payload: &'a str,
        conn: &'a mut PgListener,
    ) -> BoxFuture<'a, sqlx::Result<()>> {
        self.reload(conn).boxed()
    }

    fn lost(&self, error: Option<&sqlx::Error>) {
        self.set(None);
        if let Some(e) = error {
            tracing::warn!(error = %e, "cannot follow the API keys; checking each request against the table until this recovers");
        }
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

/// Read on the listening connection, which never waits for the pool.
async fn load(conn: &mut PgListener) -> sqlx::Result<LiveKeys> {
    let rows: Vec<LiveRow> = sqlx::query_as(include_str!("sql/live.sql"))
        .fetch_all(conn)
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
