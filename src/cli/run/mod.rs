//! `snapfence run KEY -- CMD…`: run a command under a lease, and stop it before the lease can
//! lapse. CMD runs in its own process group; a [`LeaseKeeper`] renews the lease and declares it
//! lost `grace` + a stop allowance ([`Plan`]) before the server can expire it, and the group then
//! gets SIGTERM, then SIGKILL, so it is gone while the lease still holds. CMD is not reaped until
//! the group is empty, so no signal reaches a stranger reusing its pid.

mod acquire;
mod group;
mod plan;

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use serde_json::json;

use self::acquire::{Granted, acquire};
use self::group::{
    Signals, exit_of, group_alive, not_started, reap, send, spawn, stop_group, watch_exit,
};
use self::plan::Plan;
use super::{Ctx, Exit, output};
use crate::domain::{Key, Lease, Metadata, Owner};
use snapfence_client::{AcquireRequest, Error, KeeperOptions, LeaseKeeper, LostReason};

/// `snapfence run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The key to hold while the command runs.
    pub key: Key,
    /// Who holds the lease [default: USER@HOST].
    #[arg(long)]
    pub owner: Option<Owner>,
    /// The lease's TTL. It must exceed --grace by 2s (1s to stop the command's processes, 1s to
    /// renew in), or by two fifths of itself when that is less.
    #[arg(long, value_parser = super::parse::ttl, default_value = "15s")]
    pub ttl: Duration,
    /// While someone else holds the key, wait up to this long in its queue on the server (served
    /// in arrival order, woken when it frees) [default: fail at once].
    #[arg(long, value_parser = super::parse::duration)]
    pub wait: Option<Duration>,
    /// If the command fails or is stopped, leave a recovery record; also if `run` dies and the
    /// lease expires.
    #[arg(long)]
    pub crash_recovery: bool,
    /// Replace a recovery record left by a previous holder (state that it is dealt with).
    #[arg(long)]
    pub reconciled: bool,
    /// How long the command's processes have between SIGTERM and SIGKILL [default: a third of
    /// --ttl, at most 5s].
    #[arg(long, value_parser = super::parse::duration)]
    pub grace: Option<Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs the command under the lease; see the module docs.
pub async fn main(ctx: &Ctx, args: RunArgs) -> Exit {
    let plan = match Plan::new(args.ttl, args.grace) {
        Ok(plan) => plan,
        Err(message) => {
            eprintln!("snapfence: {message}");
            return Exit::Usage;
        }
    };
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("snapfence: cannot handle signals: {e}");
            return Exit::Failure;
        }
    };
    let owner = args.owner.clone().unwrap_or_else(super::default_owner);
    let request = AcquireRequest::new(owner, args.ttl)
        .crash_recovery(args.crash_recovery)
        .reconciled(args.reconciled)
        .metadata(metadata(&args.command));
    let granted = match acquire(ctx, &args, &request, &mut signals).await {
        Ok(granted) => granted,
        Err(exit) => return exit,
    };
    let options = KeeperOptions::default().margin(plan.margin());
    let (lease, kept) = match granted {
        Granted::AtOnce { lease, sent } => {
            let kept = LeaseKeeper::start(&ctx.client, lease.clone(), sent, options);
            (lease, kept)
        }
        // Granted at some moment of the wait: dated by a renewal sent now.
        Granted::AfterWait(lease) => {
            let kept = LeaseKeeper::adopt(&ctx.client, lease.clone(), options).await;
            (lease, kept)
        }
    };
    let keeper = match kept {
        Ok(k) => k,
        Err(e) => {
            let exit = ctx.fail(&e, None);
            if !matches!(e, Error::LeaseLost { .. }) {
                release_quietly(ctx, &lease).await;
            }
            return exit;
        }
    };
    eprintln!(
        "snapfence: holding {} as {} (token {}, ttl {}); starting {}",
        lease.key,
        lease.owner.as_str(),
        lease.token,
        humantime::format_duration(args.ttl),
        args.command[0].to_string_lossy(),
    );
    let mut child = match spawn(ctx, &args.command, &lease) {
        Ok(child) => child,
        Err(e) => {
            let program = args.command[0].to_string_lossy();
            let (exit, next) = not_started(&e);
            eprintln!("snapfence: cannot start {program}: {e}; {next}");
            finish(ctx, keeper, true, args.crash_recovery).await;
            return exit;
        }
    };
    let group = Pid::from_raw(child.id() as i32);
    let mut exited = watch_exit(group);
    let lost = keeper.lost();
    // The first signal is passed on; a second kills the group.
    let mut signalled = false;
    let lost_first = loop {
        tokio::select! {
            biased;
            () = lost.cancelled() => break true,
            _ = &mut exited => break false,
            sig = signals.recv() => {
                if signalled {
                    eprintln!("snapfence: {} again; killing the command's process group (SIGKILL)", sig.as_str());
                    send(group, Signal::SIGKILL);
                } else {
                    eprintln!("snapfence: passing {} on to the command's process group (send another to kill it)", sig.as_str());
                    send(group, sig);
                    signalled = true;
                }
            }
        }
    };
    if lost_first {
        let reason = keeper
            .lost_reason()
            .map_or_else(|| "the lease was lost".to_owned(), |r| r.to_string());
        eprintln!(
            "snapfence: {reason}; stopping the command (SIGTERM, then SIGKILL after {})",
            humantime::format_duration(plan.grace)
        );
        if stop_group(group, &plan).await {
            reap(&mut child);
        }
        // Only a lapsing lease can still be live; otherwise there is nothing to release.
        if let Some(LostReason::Lapsing { .. } | LostReason::Overdue) = keeper.lost_reason() {
            eprintln!("snapfence: the command was stopped before the lease could expire");
            finish(ctx, keeper, false, args.crash_recovery).await;
        }
        return Exit::Lost;
    }
    if group_alive(group) {
        eprintln!(
            "snapfence: the command exited but left processes in its group; stopping them before releasing"
        );
        stop_group(group, &plan).await;
    }
    let status = reap(&mut child);
    finish(ctx, keeper, status.success(), args.crash_recovery).await;
    exit_of(status)
}

fn metadata(command: &[OsString]) -> Metadata {
    let line: String = command
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(512)
        .collect();
    Metadata::new(json!({"pid": std::process::id(), "command": line}))
        .expect("a small object is valid metadata")
}

/// Ends the lease: release, after require-recovery when `--crash-recovery` asks and the run failed.
async fn finish(ctx: &Ctx, keeper: LeaseKeeper, clean: bool, crash_recovery: bool) {
    let lease = keeper.lease();
    if crash_recovery && !clean {
        match ctx.client.require_recovery(&lease.key, lease.token).await {
            Ok(()) => eprintln!(
                "snapfence: the command did not succeed; {} keeps a recovery record, and the next holder must acquire with --reconciled",
                lease.key
            ),
            Err(e) => {
                output::report(ctx.client.base_url(), &e, None);
            }
        }
    }
    match keeper.release().await {
        Ok(()) | Err(Error::LeaseLost { .. }) => {}
        Err(e) => {
            output::report(ctx.client.base_url(), &e, None);
            eprintln!(
                "snapfence: the lease of {} will expire by itself",
                lease.key
            );
        }
    }
}

async fn release_quietly(ctx: &Ctx, lease: &Lease) {
    let _ = ctx.client.release(&lease.key, lease.token).await;
}
