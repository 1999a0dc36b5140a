//! The relay: one instance numbers committed changes in epochs, reports expiries and prunes; its
//! role is a lease by the database clock, kept by the statement that records an epoch, and free at
//! once when its holder's liveness lock is (the instance died).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool, Row};
use tokio::time::Instant;

use super::Inner;
use super::history::{Epoch, Read, ReadRow};
use crate::domain::ChangeKind;
use crate::store::{Bounded, Result};

pub(super) const TURN: &str = include_str!("sql/turn.sql");
pub(super) const EXPIRE: &str = include_str!("sql/expire.sql");
pub(super) const PENDING: &str = include_str!("sql/pending.sql");

/// How often an idle relay looks for changes and due expiries: the delay after a quiet spell.
const RELAY_TICK: Duration = Duration::from_millis(50);
const BUSY_TICK: Duration = Duration::from_millis(10);
/// How long the role lasts unkept: the pause in changes when a relay dies.
const ROLE_MS: i64 = 3000;
const KEEP_EVERY: Duration = Duration::from_secs(1);
/// How often an instance without the role looks whether it is free: a dead holder's is at once.
const CLAIM_EVERY: Duration = Duration::from_millis(250);
/// How often the relay prunes (at most the retention), and how many epochs at a time.
const PRUNE_EVERY: Duration = Duration::from_secs(10);
const PRUNE_EPOCHS: i64 = 1000;
/// The most expiries one report takes: its share locks hold up acquires.
const EXPIRE_BATCH: usize = 500;
const RELAY_BOUND: Duration = Duration::from_secs(5);

struct Relay {
    expiries: BinaryHeap<Reverse<(DateTime<Utc>, String, i64)>>,
    offset: chrono::TimeDelta,
    stale: bool,
    kept: Instant,
    pruned: Instant,
    busy: bool,
}

impl Relay {
    fn expiry_due(&self) -> bool {
        self.expiries
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= Utc::now() + self.offset)
    }

    fn take_due(&mut self, clock: DateTime<Utc>) -> (Vec<String>, Vec<i64>) {
        let (mut keys, mut tokens) = (Vec::new(), Vec::new());
        while let Some(Reverse((at, _, _))) = self.expiries.peek() {
            if *at > clock || keys.len() == EXPIRE_BATCH {
                break;
            }
            let Reverse((_, key, token)) = self.expiries.pop().expect("peeked");
            keys.push(key);
            tokens.push(token);
        }
        (keys, tokens)
    }

    fn expect(&mut self, leases: impl IntoIterator<Item = PendingExpiry>) {
        self.expiries.extend(
            leases
                .into_iter()
                .map(|l| Reverse((l.expires_at, l.key, l.token))),
        );
    }
}

#[derive(FromRow)]
struct PendingExpiry {
    key: String,
    token: i64,
    expires_at: DateTime<Utc>,
}

struct TurnRow {
    clock: DateTime<Utc>,
    epoch: Option<ReadRow>,
}

impl<'r> FromRow<'r, PgRow> for TurnRow {
    fn from_row(row: &'r PgRow) -> sqlx::Result<Self> {
        let made: Option<i64> = row.try_get("last_id")?;
        Ok(Self {
            clock: row.try_get("clock")?,
            epoch: made.map(|_| ReadRow::from_row(row)).transpose()?,
        })
    }
}

fn grants(epoch: &Epoch) -> impl Iterator<Item = PendingExpiry> + '_ {
    epoch.changes.iter().filter_map(|c| {
        let expires_at = c.data.expires_at?;
        (c.event == ChangeKind::LeaseGranted).then(|| PendingExpiry {
            key: c.data.key.as_str().to_owned(),
            token: c.data.token.get(),
            expires_at,
        })
    })
}

/// While a turn is in flight its epoch reaches the reader through `Inner::relayed`.
struct Turning<'a>(&'a Inner);

impl<'a> Turning<'a> {
    fn start(i: &'a Inner) -> Self {
        i.turning.store(true, Ordering::Release);
        Self(i)
    }
}

impl Drop for Turning<'_> {
    fn drop(&mut self) {
        self.0.turning.store(false, Ordering::Release);
        self.0.fresh.notify_one();
    }
}

pub(super) async fn relay(inner: Weak<Inner>) {
    let mut role: Option<Relay> = None;
    let mut last_claim: Option<Instant> = None;
    loop {
        let Some(i) = inner.upgrade() else {
            return;
        };
        let pause = if role.is_none() && last_claim.is_some_and(|t| t.elapsed() < CLAIM_EVERY) {
            CLAIM_EVERY.saturating_sub(last_claim.map_or(Duration::ZERO, |t| t.elapsed()))
        } else {
            if role.is_none() {
                last_claim = Some(Instant::now());
            }
            match tokio::time::timeout(RELAY_BOUND, relay_once(&i, &mut role)).await {
                Ok(Ok(pause)) => pause,
                failed => {
                    if let Ok(Err(e)) = failed {
                        tracing::warn!(error = %e, "the change relay's transaction failed; trying again");
                    } else {
                        tracing::warn!(
                            "the change relay's transaction took too long; trying again"
                        );
                    }
                    if let Some(r) = role.as_mut() {
                        r.stale = true;
                    }
                    RELAY_TICK
                }
            }
        };
        drop(i);
        tokio::time::sleep(pause).await;
    }
}

/// One turn: keep or take the role and record an epoch, then prune and report; the pause after.
async fn relay_once(i: &Inner, role: &mut Option<Relay>) -> Result<Duration> {
    if let Some(r) = role.as_ref() {
        let idle = !r.stale
            && !r.busy
            && r.kept.elapsed() < KEEP_EVERY
            && !r.expiry_due()
            && !changes_waiting(&i.pool).await?;
        if idle {
            return Ok(RELAY_TICK);
        }
    }
    let whole = role.as_ref().is_some_and(|r| !r.stale);
    if let Some(r) = role.as_mut() {
        r.stale = true;
    }
    let instance = i.instance.load(Ordering::Relaxed);
    if instance == 0 {
        // Not listening yet: without its liveness lock, no instance could tell it died.
        return Ok(RELAY_TICK);
    }
    if role.is_none() {
        sqlx::query(include_str!("sql/free_dead.sql"))
            .bind(instance.to_string())
            .execute(&i.pool)
            .bounded(&i.pool)
            .await?;
    }
    let turning = Turning::start(i);
    let rows: Vec<TurnRow> = sqlx::query_as(TURN)
        .bind(instance.to_string())
        .bind(role.is_some())
        .bind(ROLE_MS)
        .fetch_all(&i.pool)
        .bounded(&i.pool)
        .await?;
    let Some(clock) = rows.first().map(|r| r.clock) else {
        drop(turning);
        if role.take().is_some() {
            tracing::warn!(
                "this instance no longer relays changes: its role lapsed (more than {ROLE_MS} ms between its turns); another instance, or this one, takes it over"
            );
        }
        return Ok(RELAY_TICK);
    };
    let epoch = Read::from_rows(rows.into_iter().filter_map(|r| r.epoch), 0)
        .epochs
        .pop();
    if let Some(epoch) = &epoch {
        i.relayed
            .lock()
            .expect("never poisoned")
            .push_back(epoch.clone());
    }
    drop(turning);
    let relay = match role {
        Some(r) if whole => r,
        _ => {
            if role.is_none() {
                tracing::info!("this instance relays changes");
            }
            // Leases granted before this read are in it, later ones in later epochs.
            let live: Vec<PendingExpiry> = sqlx::query_as(include_str!("sql/live.sql"))
                .fetch_all(&i.pool)
                .bounded(&i.pool)
                .await?;
            let mut fresh = Relay {
                expiries: BinaryHeap::new(),
                offset: chrono::TimeDelta::zero(),
                stale: false,
                kept: Instant::now(),
                pruned: Instant::now() - PRUNE_EVERY,
                busy: false,
            };
            fresh.expect(live);
            role.insert(fresh)
        }
    };
    relay.stale = false;
    relay.offset = clock - Utc::now();
    relay.kept = Instant::now();
    let numbered = epoch.is_some();
    if let Some(epoch) = &epoch {
        relay.expect(grants(epoch));
    }
    if relay.pruned.elapsed() >= PRUNE_EVERY.min(i.retention) {
        let retention = i64::try_from(i.retention.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(include_str!("sql/prune.sql"))
            .bind(retention)
            .bind(PRUNE_EPOCHS)
            .execute(&i.pool)
            .bounded(&i.pool)
            .await?;
        relay.pruned = Instant::now();
    }
    relay.stale = true;
    let reported = report_expiries(&i.pool, relay, clock).await?;
    relay.stale = false;
    relay.busy = numbered || reported;
    Ok(if relay.busy { BUSY_TICK } else { RELAY_TICK })
}

/// Reports expiries due by `clock` and keeps expecting those renewed or skipped.
async fn report_expiries(pool: &PgPool, relay: &mut Relay, clock: DateTime<Utc>) -> Result<bool> {
    let (keys, tokens) = relay.take_due(clock);
    if keys.is_empty() {
        return Ok(false);
    }
    let reported = sqlx::query(EXPIRE)
        .bind(&keys)
        .bind(&tokens)
        .execute(pool)
        .bounded(pool)
        .await?
        .rows_affected();
    let distinct = keys.iter().zip(&tokens).collect::<HashSet<_>>().len();
    if usize::try_from(reported).is_ok_and(|r| r == distinct) {
        return Ok(true);
    }
    let pending: Vec<PendingExpiry> = sqlx::query_as(PENDING)
        .bind(&keys)
        .bind(&tokens)
        .fetch_all(pool)
        .bounded(pool)
        .await?;
    relay.expect(pending);
    Ok(reported > 0)
}

async fn changes_waiting(pool: &PgPool) -> Result<bool> {
    sqlx::query_scalar(include_str!("sql/waiting.sql"))
        .fetch_one(pool)
        .bounded(pool)
        .await
}
