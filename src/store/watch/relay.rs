//! The relay: one instance on the database gives the committed changes their ids, an epoch at a
//! time, reports expiries (`sql/expire.sql`) and drops old history (`sql/prune.sql`). The role
//! is a lease by the database clock in `change_relay`, kept by the same statement that records
//! an epoch (`sql/turn.sql`), so an instance that was paused and lost it numbers nothing; and
//! two relays could not number the same changes anyway, since their epochs would start at the
//! same id.

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

/// One turn: keep or take the role, number what committed since the last epoch.
pub(super) const TURN: &str = include_str!("sql/turn.sql");
/// The report of due expiries.
pub(super) const EXPIRE: &str = include_str!("sql/expire.sql");
/// The leases of a report that are still to expire.
pub(super) const PENDING: &str = include_str!("sql/pending.sql");

/// How often the relay looks for new changes and due expiries while there were none at its
/// last turn: the delay a watcher sees of the first change after a quiet spell, well inside
/// the contract's second for expiries.
const RELAY_TICK: Duration = Duration::from_millis(50);
/// How soon it looks again after a turn that numbered or reported something: under a steady
/// stream of changes, the delay a watcher sees.
const BUSY_TICK: Duration = Duration::from_millis(10);
/// How long the relay role lasts without being kept (database clock): how long the changes stop
/// when a relay dies, before another instance takes over.
const ROLE_MS: i64 = 3000;
/// How often the relay keeps its role while it has nothing else to do.
const KEEP_EVERY: Duration = Duration::from_secs(1);
/// How often an instance that is not the relay tries to take the role.
const CLAIM_EVERY: Duration = Duration::from_secs(1);
/// How often the relay drops history older than the retention (or as often as the retention
/// itself, when that is shorter), and how many epochs at a time.
const PRUNE_EVERY: Duration = Duration::from_secs(10);
const PRUNE_EPOCHS: i64 = 1000;
/// The most expiries one report takes on (its share locks make acquires of those keys wait until
/// it commits): more are left for the next turn, 10 ms later, so that a burst of expiries never
/// makes one long statement, nor a turn long enough to lose the role.
const EXPIRE_BATCH: usize = 500;
/// How long a relay transaction may take before the relay gives it up (and rereads the
/// leases' expiry times, since it cannot tell what it committed).
const RELAY_BOUND: Duration = Duration::from_secs(5);

/// The relay's own state, while it holds the role.
struct Relay {
    /// The live leases by expiry time (database clock), soonest first.
    expiries: BinaryHeap<Reverse<(DateTime<Utc>, String, i64)>>,
    /// The database clock less this host's, at the last transaction.
    offset: chrono::TimeDelta,
    /// Whether `expiries` may have missed something (a transaction whose outcome is unknown):
    /// reread at the next transaction.
    stale: bool,
    kept: Instant,
    pruned: Instant,
    /// Whether the last turn numbered or reported something: then the next goes straight to
    /// work, since under a steady stream of changes a check for them would always say yes.
    busy: bool,
}

impl Relay {
    /// Whether an expiry is due by the database clock, as this host estimates it.
    fn expiry_due(&self) -> bool {
        self.expiries
            .peek()
            .is_some_and(|Reverse((at, _, _))| *at <= Utc::now() + self.offset)
    }

    /// Takes out the leases whose expiry has passed at `clock`, [`EXPIRE_BATCH`] at most.
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

/// A lease whose expiry is still to be reported.
#[derive(FromRow)]
struct PendingExpiry {
    key: String,
    token: i64,
    expires_at: DateTime<Utc>,
}

/// A row of a turn the relay took with the role (`sql/turn.sql`): the database clock and, when
/// the turn made an epoch, the epoch and one of its changes.
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

/// The grants of `epoch`, whose expiries the relay expects.
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

/// While the relay's turn is in flight: the epoch it makes comes to the reader through
/// `Inner::relayed` rather than from the database. Ended (and the reader woken) when dropped,
/// however the turn ended.
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

/// Holds, or tries to take, the relay role, and does the relay's work while it holds it.
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

/// One turn of the relay: keeps (or takes) the role and records an epoch of the changes
/// committed since the last, in one statement; then now and then prunes, and reports the due
/// expiries. How long to pause before the next turn.
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
    // Until the turn's outcome is known, which grants' expiries to expect is not known either.
    let whole = role.as_ref().is_some_and(|r| !r.stale);
    if let Some(r) = role.as_mut() {
        r.stale = true;
    }
    let turning = Turning::start(i);
    let rows: Vec<TurnRow> = sqlx::query_as(TURN)
        .bind(&i.name)
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
    // A turn makes one epoch at most.
    let epoch = Read::from_rows(rows.into_iter().filter_map(|r| r.epoch))
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
        // Kept, and nothing missed before: whole once this turn's grants are added.
        Some(r) if whole => r,
        _ => {
            if role.is_none() {
                tracing::info!("this instance relays changes");
            }
            // Read after the turn: every unreported lease granted before this read is in it,
            // and every later grant comes in a later epoch (one read and an epoch may both
            // bring a lease; expire.sql reports it once).
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

/// Reports the leases whose expiry passed by `clock` (`sql/expire.sql`), in a statement of its
/// own (its share locks last one statement), and keeps expecting the ones that are not over
/// after all (renewed meanwhile, or skipped while a hot statement held them). Whether it
/// reported any (their events wait for the next epoch).
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
    // Each lease reported is over, so when all were (the rule under load), none is left to
    // expect, and the second statement would find nothing.
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

/// Whether any change committed since the last epoch (`sql/waiting.sql`): the relay's check
/// while it has nothing else to do.
async fn changes_waiting(pool: &PgPool) -> Result<bool> {
    sqlx::query_scalar(include_str!("sql/waiting.sql"))
        .fetch_one(pool)
        .bounded(pool)
        .await
}
