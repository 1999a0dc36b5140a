//! Hand-off runs: how long after a holder lets a key go its first waiter has it.
//!
//! Each of `--rounds` rounds takes a key of its own: a holder acquires it, then a waiter asks
//! for it with a wait (etcd: blocks in `Lock`, holding a lease of its own), and
//! - `--op handoff`: once the waiter is queued, the holder releases (etcd: `Unlock`). Timed
//!   from just before the release is sent to the waiter's grant received, on this machine's
//!   monotonic clock.
//! - `--op expiry`: the holder's lease runs out. Timed from the expiry to the waiter's grant
//!   received. snapfence's expiry is the lease's `expires_at` by the database clock, brought to
//!   this machine's wall clock by the offset between the two that the grants' own times bound
//!   ([`Offset`]). etcd's is its lease's TTL (whole seconds) counted from the middle of the
//!   grant's round trip, since etcd starts the TTL when it applies the grant, somewhere in it.
//!
//! The rounds run one after another, so no round's work delays another's; an expiry round
//! starts after a random pause, so the expiries fall at random points of the server's loops. Every grant is
//! checked: it goes to the waiter, with a newer token than the holder's (etcd: the waiter's own
//! lock key), and an expiry's not before the holder's lease expired.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use snapfence_client::{AcquireRequest, Client, Key, Owner};
use tokio::time::Instant;

use super::report::{Errors, Histogram, Report, Timing};
use super::target::{Target, WRONG_ANSWER, check, code};
use super::{BenchArgs, Op, prefixed};

/// How long a waiter is given to take its place in the queue before the holder releases: the
/// service shows no client its queue, so the round waits this long, and a waiter answered
/// within it (granted while the key was held) fails the round; etcd's queue is looked at too.
/// It is more than etcd's 100 ms loop that brings a new watch up to date (its `Lock` waits on a
/// watch of the key ahead): a waiter queued less than that before the release waits for that
/// loop as well (tens of ms), and this measures a waiter that was already waiting.
const QUEUE_AFTER: Duration = Duration::from_millis(150);
/// The holder's lease in a `handoff` round, and the waiter's: never expires during a round.
const HOLD_TTL: Duration = Duration::from_secs(30);
/// The holder's lease in an `expiry` round: long enough for the waiter to queue first.
const EXPIRY_TTL: Duration = Duration::from_millis(250);
/// The span of the random pause before an expiry round (see [`run`]): etcd's expiry loop's.
const PHASES_MS: u64 = 500;
/// The longest a waiter waits.
const WAIT: Duration = Duration::from_secs(10);
/// etcd's lease TTL for a holder that releases and for every waiter, in seconds.
#[cfg(feature = "etcd-grpc")]
const ETCD_HOLD_TTL: i64 = 60;
/// etcd's lease TTL for a holder that lets it expire: etcd raises it to its minimum (2 s with
/// the default election timeout) and says so in the grant's answer, which the round uses.
#[cfg(feature = "etcd-grpc")]
const ETCD_EXPIRY_TTL: i64 = 1;

/// One round's hand-off time in microseconds, signed (an expiry's may come out a little below
/// zero within its error), and how far off it may be.
struct Sample {
    micros: i64,
    error_micros: i64,
    /// Whether it runs from a database-clock time, so the clock offset applies.
    db_clock: bool,
}

/// Times `args.rounds` hand-offs on `target`.
pub(super) async fn run(args: &BenchArgs, target: &Target, prefix: &str) -> Result<Report, String> {
    let expiry = args.op == Op::Expiry;
    let keys = (0..args.rounds)
        .map(|i| prefixed(prefix, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut offset = Offset::default();
    let mut samples = Vec::with_capacity(keys.len());
    let mut errors = Errors::new();
    let started = Instant::now();
    let mut rng = SmallRng::from_os_rng();
    for key in &keys {
        if expiry {
            // Each round starts at a random point of any periodic loop of the server's (etcd
            // looks for expired leases every 500 ms): back to back, every lease would be granted
            // just after such a look, expire at the same point of the loop, and measure one
            // fixed delay instead of its spread.
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..PHASES_MS))).await;
        }
        let round = match target {
            Target::Snapfence(client) => snapfence_round(client, key, expiry, &mut offset).await,
            #[cfg(feature = "etcd-grpc")]
            Target::EtcdGrpc(etcd) => etcd_round(etcd, key.as_str(), expiry).await,
            Target::Etcd { .. } => unreachable!("the JSON gateway target refuses hand-off runs"),
        };
        match round {
            Ok(sample) => samples.push(sample),
            Err(code) => *errors.entry(code).or_default() += 1,
        }
    }
    let elapsed = started.elapsed();

    let (shift, shift_error) = if samples.iter().any(|s| s.db_clock) {
        offset.estimate()?
    } else {
        (0, 0)
    };
    let mut latency = Histogram::new();
    for s in &samples {
        let (micros, error) = match s.db_clock {
            true => (s.micros + shift, s.error_micros + shift_error),
            false => (s.micros, s.error_micros),
        };
        if micros < -error {
            // Granted before the holder's lease expired, by more than the clocks can be off.
            *errors.entry(WRONG_ANSWER.to_owned()).or_default() += 1;
        } else {
            latency.record(Duration::from_micros(micros.max(0) as u64));
        }
    }
    let mut report = Report::new(args, prefix, elapsed, &latency, &errors, Ok(()));
    (report.concurrency, report.keys) = (1, keys.len());
    let most_error = samples.iter().map(|s| s.error_micros).max().unwrap_or(0);
    report.timing = Some(match (target, expiry) {
        (Target::Snapfence(_), false) => Timing {
            from_to: "the holder's DELETE sent to the waiter's 201 received (this machine's \
                monotonic clock)",
            ..Timing::default()
        },
        (Target::Snapfence(_), true) => Timing {
            from_to: "the holder's expires_at (database clock, moved to this machine's by the \
                offset below) to the waiter's 201 received (this machine's wall clock)",
            clock_offset_ms: Some(shift as f64 / 1000.0),
            clock_offset_error_ms: Some(shift_error as f64 / 1000.0),
            ..Timing::default()
        },
        (_, false) => Timing {
            from_to: "the holder's Unlock sent to the waiter's Lock answered (this machine's \
                monotonic clock)",
            ..Timing::default()
        },
        (_, true) => Timing {
            from_to: "the holder's lease run out (the middle of its grant's round trip plus the \
                granted TTL) to the waiter's Lock answered (this machine's monotonic clock, so \
                no offset; the error is half the slowest grant's round trip)",
            clock_offset_ms: Some(0.0),
            clock_offset_error_ms: Some(most_error as f64 / 1000.0),
            ..Timing::default()
        },
    });
    Ok(report)
}

/// This machine's wall clock, in microseconds since the epoch.
fn wall_micros() -> i64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    now.map_or(0, |d| d.as_micros() as i64)
}

/// The database clock minus this machine's wall clock, in microseconds, bounded by grants: a
/// grant's `acquired_at` (database clock, cut to the millisecond) was read between the acquire's
/// sending and its answer (this machine's clock), so the offset lies within
/// `[acquired_at - answered, acquired_at + 1 ms - sent]`, and each grant narrows that range.
/// (On one machine both read the same system clock, so it holds 0 unless an assumption is off.)
#[derive(Default)]
struct Offset {
    low: Option<i64>,
    high: Option<i64>,
}

impl Offset {
    fn bound(&mut self, sent: i64, answered: i64, acquired_at: i64) {
        let (low, high) = (acquired_at - answered, acquired_at + 1000 - sent);
        self.low = Some(self.low.map_or(low, |l| l.max(low)));
        self.high = Some(self.high.map_or(high, |h| h.min(high)));
    }

    /// The middle of the range and half its width.
    fn estimate(&self) -> Result<(i64, i64), String> {
        match (self.low, self.high) {
            (Some(low), Some(high)) if low <= high => Ok(((low + high) / 2, (high - low) / 2)),
            (Some(low), Some(high)) => Err(format!(
                "the grants' times disagree with this machine's clock (the database clock would \
                 be at least {low} µs and at most {high} µs ahead): did a clock step?"
            )),
            _ => Err("no grant to measure the database clock by".to_owned()),
        }
    }
}

/// One snapfence round on `key`.
async fn snapfence_round(
    client: &Client,
    key: &Key,
    expiry: bool,
    offset: &mut Offset,
) -> Result<Sample, String> {
    let owner = |who: &str| Owner::parse(format!("bench-{who}")).expect("a valid owner");
    let ttl = if expiry { EXPIRY_TTL } else { HOLD_TTL };
    let sent = wall_micros();
    let holder = client
        .acquire(key, &AcquireRequest::new(owner("holder"), ttl))
        .await
        .map_err(|e| code(&e))?
        .lease;
    offset.bound(sent, wall_micros(), holder.acquired_at.timestamp_micros());
    let mut waiter = tokio::spawn({
        let (client, key) = (client.clone(), key.clone());
        let request = AcquireRequest::new(owner("waiter"), HOLD_TTL).wait(WAIT);
        async move {
            let grant = client.acquire(&key, &request).await;
            (grant, Instant::now(), wall_micros())
        }
    });
    let released = if expiry {
        None
    } else {
        let early = tokio::time::timeout(QUEUE_AFTER, &mut waiter).await.is_ok();
        if early {
            return Err(WRONG_ANSWER.to_owned());
        }
        let at = Instant::now();
        let done = client.release(key, holder.token).await;
        if let Err(e) = done {
            waiter.abort();
            return Err(code(&e));
        }
        Some(at)
    };
    let (grant, granted, granted_wall) =
        waiter.await.map_err(|e| format!("a waiter crashed: {e}"))?;
    let grant = grant.map_err(|e| code(&e))?.lease;
    client
        .release(key, grant.token)
        .await
        .map_err(|e| code(&e))?;
    check(
        grant.owner == owner("waiter")
            && grant.token > holder.token
            && (!expiry || grant.acquired_at >= holder.expires_at),
    )?;
    Ok(match released {
        Some(at) => Sample {
            micros: granted.duration_since(at).as_micros() as i64,
            error_micros: 0,
            db_clock: false,
        },
        None => Sample {
            micros: granted_wall - holder.expires_at.timestamp_micros(),
            error_micros: 0,
            db_clock: true,
        },
    })
}

/// One etcd round on the lock `name`, whose keys are `{name}/{lease id in hex}`.
#[cfg(feature = "etcd-grpc")]
async fn etcd_round(
    etcd: &etcd_client::Client,
    name: &str,
    expiry: bool,
) -> Result<Sample, String> {
    use super::target::grpc_code;
    use etcd_client::{GetOptions, LockOptions};

    let mut etcd = etcd.clone();
    let asked = Instant::now();
    let ttl = if expiry {
        ETCD_EXPIRY_TTL
    } else {
        ETCD_HOLD_TTL
    };
    let holder_lease = etcd.lease_grant(ttl, None).await.map_err(grpc_code)?;
    let half_trip = asked.elapsed() / 2;
    let expires = asked + half_trip + Duration::from_secs(holder_lease.ttl().max(0) as u64);
    let waiter_lease = etcd
        .lease_grant(ETCD_HOLD_TTL, None)
        .await
        .map_err(grpc_code)?
        .id();
    let lock = |lease: i64| Some(LockOptions::new().with_lease(lease));
    let held = etcd
        .lock(name, lock(holder_lease.id()))
        .await
        .map_err(grpc_code)?;
    let mut waiter = tokio::spawn({
        let (mut etcd, name, options) = (etcd.clone(), name.to_owned(), lock(waiter_lease));
        async move {
            let got = etcd.lock(name, options).await;
            (got, Instant::now())
        }
    });
    let from = if expiry {
        expires
    } else {
        let early = tokio::time::timeout(QUEUE_AFTER, &mut waiter).await.is_ok();
        let queued = etcd
            .get(
                format!("{name}/"),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await
            .map_err(grpc_code)?
            .count();
        if early || queued != 2 {
            waiter.abort();
            return Err(WRONG_ANSWER.to_owned());
        }
        let at = Instant::now();
        etcd.unlock(held.key()).await.map_err(grpc_code)?;
        at
    };
    let (got, granted) = waiter.await.map_err(|e| format!("a waiter crashed: {e}"))?;
    let got = got.map_err(grpc_code)?;
    // Revoking the leases deletes the lock keys; the expired holder's is gone already.
    etcd.lease_revoke(waiter_lease).await.map_err(grpc_code)?;
    if !expiry {
        etcd.lease_revoke(holder_lease.id())
            .await
            .map_err(grpc_code)?;
    }
    check(got.key() == format!("{name}/{waiter_lease:x}").as_bytes())?;
    let micros = match granted.checked_duration_since(from) {
        Some(after) => after.as_micros() as i64,
        None => -(from.duration_since(granted).as_micros() as i64),
    };
    Ok(Sample {
        micros,
        error_micros: if expiry {
            half_trip.as_micros() as i64
        } else {
            0
        },
        db_clock: false,
    })
}
