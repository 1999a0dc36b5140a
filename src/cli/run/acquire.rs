//! Acquiring the key for `run`: at once, or with `--wait` in the key's queue on the server.

use std::time::Duration;

use snapfence_client::{AcquireRequest, Error, RetryPolicy};
use tokio::time::{Instant, sleep};

use super::group::Signals;
use super::{Ctx, Exit, RunArgs, output};
use crate::domain::{Lease, LeaseState};

pub(super) enum Granted {
    /// By an acquire that did not wait, sent at `sent`: the server measured the TTL from later.
    AtOnce { lease: Lease, sent: Instant },
    /// By an acquire that waited in the queue: granted at some moment of the wait, unknown here.
    AfterWait(Lease),
}

/// Acquires the key; with `--wait`, once it is found held, waits in the key's queue on the server.
pub(super) async fn acquire(
    ctx: &Ctx,
    args: &RunArgs,
    request: &AcquireRequest,
    signals: &mut Signals,
) -> Result<Granted, Exit> {
    let until = Instant::now() + args.wait.unwrap_or_default();
    let pause = RetryPolicy {
        max_attempts: u32::MAX,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
    };
    let mut attempt = 0;
    let mut announced: Option<(String, Instant)> = None;
    // Wait only once the key was found held, so the first try says who holds it.
    let mut queue = false;
    loop {
        let sent = Instant::now();
        let left = until.saturating_duration_since(sent);
        let attempt_request = if queue && !left.is_zero() {
            request.clone().wait(left.min(MAX_SERVER_WAIT))
        } else {
            request.clone()
        };
        let answer = tokio::select! {
            answer = ctx.client.acquire(&args.key, &attempt_request) => answer,
            // Dropping the call closes its connection, which takes the place out of the queue.
            sig = signals.recv() => {
                eprintln!("snapfence: {} while waiting for {}; giving up", sig.as_str(), args.key);
                return Err(Exit::Status(128 + sig as u8));
            }
        };
        let e = match answer {
            Ok(grant) => {
                if announced.is_some() {
                    eprintln!("snapfence: acquired {}", args.key);
                }
                return Ok(if attempt_request.wait_ms.is_some() {
                    Granted::AfterWait(grant.lease)
                } else {
                    Granted::AtOnce {
                        lease: grant.lease,
                        sent,
                    }
                });
            }
            Err(e) => e,
        };
        // An unknown outcome may have granted a lease whose token nobody knows: stop and say so.
        let worth_waiting =
            matches!(e, Error::LeaseHeld { .. }) || (e.is_transient() && !e.is_indeterminate());
        let now = Instant::now();
        if args.wait.is_none() || !worth_waiting || now >= until {
            match args.wait {
                Some(wait) if worth_waiting => eprintln!(
                    "snapfence: waited {} for {}; giving up (a longer --wait waits longer)",
                    humantime::format_duration(wait),
                    args.key
                ),
                None if matches!(e, Error::LeaseHeld { .. }) => {
                    eprintln!("snapfence: --wait DURATION waits for a held key")
                }
                _ => {}
            }
            let check = format!(
                "Check with `snapfence lease show {}`: a lease granted to you whose token you did not get expires by itself",
                args.key
            );
            return Err(ctx.fail(&e, Some(&check)));
        }
        let what = match &e {
            Error::LeaseHeld {
                state: Some(state),
                waiters,
                ..
            } if *state != LeaseState::Held => format!(
                "{} is free ({}) and goes to {} waiting acquires queued first",
                args.key,
                state.as_str(),
                waiters.map_or_else(|| "the".to_owned(), |n| n.to_string())
            ),
            Error::LeaseHeld { holder, .. } => format!(
                "{} is held by {:?} until {}",
                args.key,
                holder.owner,
                output::time(&holder.expires_at)
            ),
            other => format!("the server is unavailable ({other})"),
        };
        let due = announced
            .as_ref()
            .is_none_or(|(said, at)| *said != what || now >= *at + Duration::from_secs(5));
        if due {
            eprintln!(
                "snapfence: {what}; waiting up to {} more",
                humantime::format_duration(round_to_seconds(until - now))
            );
            announced = Some((what, now));
        }
        // The next try waits on the server, unless its --max-wait cut this one short.
        let asked = attempt_request.wait_ms.unwrap_or(0);
        let cut_short = asked > 0 && now.duration_since(sent) < Duration::from_millis(asked as u64);
        if matches!(e, Error::LeaseHeld { .. }) && (!queue || !cut_short) {
            queue = true;
            attempt = 0;
            continue;
        }
        queue |= matches!(e, Error::LeaseHeld { .. });
        attempt += 1;
        tokio::select! {
            () = sleep(pause.backoff(attempt).min(until - now)) => {}
            sig = signals.recv() => {
                eprintln!("snapfence: {} while waiting for {}; giving up", sig.as_str(), args.key);
                return Err(Exit::Status(128 + sig as u8));
            }
        }
    }
}

/// The contract's bound on one wait; a longer `--wait` asks again.
const MAX_SERVER_WAIT: Duration = Duration::from_millis(crate::domain::MAX_WAIT_MS as u64);

fn round_to_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}
