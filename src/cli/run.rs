//! `snapfence run KEY -- CMD…`: run a command under a lease, and stop it before the lease can
//! lapse.
//!
//! CMD runs in a process group of its own, with its lease in `SNAPFENCE_URL`, `SNAPFENCE_KEY`,
//! `SNAPFENCE_TOKEN` and `SNAPFENCE_OWNER` (and `SNAPFENCE_API_KEY`, `SNAPFENCE_CA_CERT` when
//! `run` was given them, so that CMD's own `snapfence` calls reach the server as `run` does). A
//! [`LeaseKeeper`] renews the lease. The keeper
//! declares the lease lost `grace` + a stop allowance ([`Plan`]) before the latest moment the
//! server can expire it; the whole group then gets SIGTERM, and SIGKILL once `grace` has passed, so every
//! process of the group is gone while the server still holds the lease and no other holder can
//! have started. When CMD exits, whatever it left running in its group is stopped the same way
//! before the lease is released, since the lease covers the group.
//!
//! The group is watched without reaping CMD until every member is gone: an unreaped CMD keeps
//! its process id, which is the group's id, from being reused, so no signal can reach a
//! stranger. A process that leaves the group (`setsid`, `setpgid`) escapes the lease; so does
//! CMD if `run` itself is killed with SIGKILL, since only `run` can stop it.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitStatus};
use std::time::Duration;

use clap::Args;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};

use super::{Ctx, Exit, output};
use crate::domain::{Key, Lease, LeaseState, Metadata, Owner};
use snapfence_client::{
    AcquireRequest, Error, KeeperOptions, LeaseKeeper, LostReason, RetryPolicy,
};

/// Time allowed, beyond `--grace`, between the keeper declaring the lease lost and the server's
/// earliest possible expiry, for SIGKILL to take the group down and for the scheduler: this,
/// or a fifth of the TTL when that is shorter (see [`Plan`]).
const STOP_ALLOWANCE: Duration = Duration::from_secs(1);
/// The least time that `--ttl` must leave for renewing once `--grace` and the stop allowance are
/// reserved, for several renewal attempts: this, or a fifth of the TTL when that is shorter.
const MIN_RENEW_WINDOW: Duration = Duration::from_secs(1);
/// The longest `--grace` when none is given; below three times this, a third of the TTL.
const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// How often the process group is looked at while it is being stopped (less when the stop
/// allowance is short).
const POLL: Duration = Duration::from_millis(10);

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
    let (lease, sent) = match acquire(ctx, &args, &request, &mut signals).await {
        Ok(granted) => granted,
        Err(exit) => return exit,
    };
    let options = KeeperOptions::default().margin(plan.margin());
    let keeper = match LeaseKeeper::start(&ctx.client, lease.clone(), sent, options) {
        Ok(k) => k,
        Err(e) => {
            let exit = ctx.fail(&e, None);
            release_quietly(ctx, &lease).await;
            return exit;
        }
    };
    // Said before the command starts, so that it comes before anything the command prints.
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
            // Nothing ran, so nothing was left to recover: the lease is released plainly.
            finish(ctx, keeper, true, args.crash_recovery).await;
            return exit;
        }
    };
    let group = Pid::from_raw(child.id() as i32);
    let mut exited = watch_exit(group);
    let lost = keeper.lost();
    // The first signal is passed on; a second one means the command did not stop and the
    // person wants it gone: the group is killed, so that no one has to kill `run` itself and
    // leave the command running with nobody renewing its lease.
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
        // Only a lapsing lease can still be live; after lease_lost or a refusal there is
        // nothing left to release, and the keeper's drop sends nothing once `run` returns.
        if let Some(LostReason::Lapsing { .. }) = keeper.lost_reason() {
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

/// How `run` divides a lease's TTL: from the end, the stop allowance (SIGKILL's time to take
/// the group down), before it `grace` (SIGTERM's time), and before that the time to renew in.
/// Both fixed parts shrink with a short TTL, so that every TTL a server accepts works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Plan {
    /// Between SIGTERM and SIGKILL.
    grace: Duration,
    /// After SIGKILL, until the server's earliest possible expiry.
    allowance: Duration,
}

impl Plan {
    /// The plan for `--ttl` and `--grace` (a third of the TTL, at most [`DEFAULT_GRACE`], when
    /// none is given), or what to do when the TTL leaves no time to renew in.
    fn new(ttl: Duration, grace: Option<Duration>) -> Result<Self, String> {
        let plan = Self {
            grace: grace.unwrap_or((ttl / 3).min(DEFAULT_GRACE)),
            allowance: (ttl / 5).min(STOP_ALLOWANCE),
        };
        let renew = (ttl / 5).min(MIN_RENEW_WINDOW);
        if ttl >= plan.margin() + renew {
            return Ok(plan);
        }
        Err(format!(
            "--ttl {} is too short for --grace {}: the command must be stopped before the lease can expire, which takes --grace plus {}, and the lease needs at least {} more to be renewed in. Use --ttl {} or more{}",
            humantime::format_duration(ttl),
            humantime::format_duration(plan.grace),
            humantime::format_duration(plan.allowance),
            humantime::format_duration(renew),
            humantime::format_duration(Self::least_ttl(plan.grace)),
            if plan.grace.is_zero() {
                ""
            } else {
                ", or a shorter --grace (or none: the default fits every --ttl)"
            },
        ))
    }

    /// How long before the deadline the keeper declares the lease lost.
    fn margin(&self) -> Duration {
        self.grace + self.allowance
    }

    /// The shortest TTL that leaves room for `grace`: `grace` plus 2 s, or five thirds of
    /// `grace` when the TTL's fifths are shorter than those seconds.
    fn least_ttl(grace: Duration) -> Duration {
        (grace * 5 / 3).min(grace + STOP_ALLOWANCE + MIN_RENEW_WINDOW)
    }

    /// How often a group being stopped is looked at: often enough to notice within the
    /// allowance.
    fn poll(&self) -> Duration {
        POLL.min(self.allowance / 4)
    }
}

/// The exit code of a command that could not be started, and what to do about it, as a shell
/// tells them apart: 127 when there is no such command, 126 when there is but it cannot be
/// executed (not executable, a file the kernel cannot run (ENOEXEC), a directory), 1 when no
/// process could be made at all.
fn not_started(e: &std::io::Error) -> (Exit, &'static str) {
    match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::ENOENT) => (
            Exit::CommandNotFound,
            "check its name, or give its path, since it is not on PATH",
        ),
        Some(Errno::EAGAIN | Errno::ENOMEM) | None => (
            Exit::Failure,
            "the system could not make a process; try again when it has more to spare",
        ),
        Some(_) => (
            Exit::CannotExecute,
            "check that it is a program you may execute (chmod +x) and that a script starts with a #! line, or run a script through its interpreter (sh SCRIPT)",
        ),
    }
}

/// The lease's metadata: who is running what, for whoever finds the key held.
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

/// Acquires the key; with `--wait`, once it is found held, waits in the key's queue on the
/// server (served in arrival order, woken by the server when the key frees) until the wait is
/// over, and retries while the server is briefly away. Returns the lease and when its acquire
/// was sent.
async fn acquire(
    ctx: &Ctx,
    args: &RunArgs,
    request: &AcquireRequest,
    signals: &mut Signals,
) -> Result<(Lease, Instant), Exit> {
    let until = Instant::now() + args.wait.unwrap_or_default();
    let pause = RetryPolicy {
        max_attempts: u32::MAX,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(1),
    };
    let mut attempt = 0;
    let mut announced: Option<(String, Instant)> = None;
    // Whether the next acquire waits on the server: once the key was found held, so that the
    // first try says who holds it.
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
            // Dropping the call closes its connection: the server takes the place out of
            // the queue.
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
                return Ok((grant.lease, sent));
            }
            Err(e) => e,
        };
        // A write whose outcome is unknown may have granted a lease nobody knows the token of;
        // acquiring again would only find it held, so stop and say so.
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
        // Held: the next try waits in the queue on the server, not here; unless the server
        // waited less than it was asked (its --max-wait is shorter), when the tries are paced
        // as after a failure.
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

/// The longest wait one acquire asks the server for (the contract's bound); a longer `--wait`
/// asks again.
const MAX_SERVER_WAIT: Duration = Duration::from_millis(crate::domain::MAX_WAIT_MS as u64);

fn round_to_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs_f64().round() as u64)
}

/// Starts the command in a process group of its own, with its lease in the environment.
fn spawn(ctx: &Ctx, command: &[OsString], lease: &Lease) -> std::io::Result<Child> {
    std::process::Command::new(&command[0])
        .args(&command[1..])
        .envs(ctx.reach.iter().map(|(name, value)| (name, value)))
        .env("SNAPFENCE_URL", ctx.client.base_url())
        .env("SNAPFENCE_KEY", lease.key.as_str())
        .env("SNAPFENCE_TOKEN", lease.token.to_string())
        .env("SNAPFENCE_OWNER", lease.owner.as_str())
        .process_group(0)
        .spawn()
}

/// Resolves once `pid` has exited, leaving it unreaped (`WNOWAIT`) so that its id, and with it
/// the process group's, stays taken until [`reap`]. `waitid` blocks, so a thread of its own
/// waits; it is not a runtime task, so that the runtime never waits for it at shutdown.
fn watch_exit(pid: Pid) -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        while let Err(Errno::EINTR) =
            waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
        {}
        let _ = tx.send(());
    });
    rx
}

/// Reaps the command once its group is gone, and returns how it ended.
fn reap(child: &mut Child) -> ExitStatus {
    child
        .wait()
        .expect("the command is our child and not yet reaped")
}

/// Sends a signal to every process of the group; a group already gone is fine.
fn send(group: Pid, sig: Signal) {
    match killpg(group, sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => eprintln!(
            "snapfence: cannot send {} to the command: {e}",
            sig.as_str()
        ),
    }
}

/// SIGTERM to the group; SIGKILL to whatever is left of it once the plan's grace has passed.
/// Returns when no process of the group is alive (`true`), or when some outlive SIGKILL for
/// longer than the plan's stop allowance (`false`).
async fn stop_group(group: Pid, plan: &Plan) -> bool {
    send(group, Signal::SIGTERM);
    let kill_at = Instant::now() + plan.grace;
    while group_alive(group) {
        if Instant::now() >= kill_at {
            send(group, Signal::SIGKILL);
            break;
        }
        sleep(plan.poll()).await;
    }
    let give_up = Instant::now() + plan.allowance;
    while group_alive(group) {
        if Instant::now() >= give_up {
            eprintln!(
                "snapfence: processes of the command's group outlived SIGKILL (stuck in the kernel?)"
            );
            return false;
        }
        sleep(plan.poll()).await;
    }
    true
}

/// Whether any process of the group is alive, zombies aside: a dead member whose parent has
/// not reaped it yet (CMD itself, or an orphan under an init that never reaps) does no work.
/// When `/proc` cannot be read the group is taken as alive, which errs towards SIGKILL.
fn group_alive(group: Pid) -> bool {
    if let Err(Errno::ESRCH) = killpg(group, None) {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read_to_string(entry.path().join("stat"))
                .ok()
                .and_then(|stat| live_member_of(&stat))
                == Some(group.as_raw())
    })
}

/// The process group of a `/proc/PID/stat` line, unless the process is a zombie or dead. The
/// command name in parentheses may hold anything, so fields are counted from its last `)`.
fn live_member_of(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    (!matches!(state, "Z" | "X")).then_some(group)
}

/// Ends the lease: release, after require-recovery when `--crash-recovery` asks for a record
/// and the run was not `clean` (the command failed or was stopped; one that succeeded or never
/// started left nothing to recover).
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

/// Releases a lease no keeper holds, reporting nothing: used only when giving up early.
async fn release_quietly(ctx: &Ctx, lease: &Lease) {
    let _ = ctx.client.release(&lease.key, lease.token).await;
}

/// The exit code that passes the command's status on, as a shell would.
fn exit_of(status: ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Status(code as u8),
        (None, Some(sig)) => Exit::Status(128 + sig as u8),
        (None, None) => Exit::Failure,
    }
}

/// The signals `run` passes on to the command instead of dying of them.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_grace_fits_every_ttl() {
        for ms in [1, 7, 100, 999, 1_000, 2_500, 5_000, 15_000, 86_400_000] {
            let ttl = Duration::from_millis(ms);
            let plan = Plan::new(ttl, None).unwrap_or_else(|e| panic!("--ttl {ms}ms: {e}"));
            assert!(plan.grace <= DEFAULT_GRACE, "--ttl {ms}ms: {plan:?}");
        }
    }

    #[test]
    fn the_default_grace_is_a_third_of_the_ttl_up_to_five_seconds() {
        let grace = |s| Plan::new(Duration::from_secs(s), None).unwrap().grace;
        assert_eq!(grace(3), Duration::from_secs(1));
        assert_eq!(grace(15), Duration::from_secs(5));
        assert_eq!(grace(600), Duration::from_secs(5));
    }

    #[test]
    fn the_least_ttl_suggested_for_a_grace_is_accepted_and_a_shorter_one_is_not() {
        for ms in [1, 10, 300, 2_000, 3_000, 5_000, 60_000] {
            let grace = Duration::from_millis(ms);
            let least = Plan::least_ttl(grace);
            assert!(
                Plan::new(least, Some(grace)).is_ok(),
                "{grace:?}: {least:?}"
            );
            let shorter = least - Duration::from_millis(1);
            assert!(
                Plan::new(shorter, Some(grace)).is_err(),
                "{grace:?}: {shorter:?}"
            );
        }
    }

    #[test]
    fn a_missing_or_unexecutable_command_exits_as_a_shell_would() {
        let exit = |errno: Errno| not_started(&std::io::Error::from_raw_os_error(errno as i32)).0;
        assert_eq!(exit(Errno::ENOENT), Exit::CommandNotFound);
        assert_eq!(exit(Errno::ENOEXEC), Exit::CannotExecute);
        assert_eq!(exit(Errno::EACCES), Exit::CannotExecute);
        assert_eq!(exit(Errno::EAGAIN), Exit::Failure);
    }

    #[test]
    fn a_stat_line_gives_the_group_of_live_processes_only() {
        let line = "4242 (sh (weird) name) S 1 4240 4240 0 -1 4194560 0";
        assert_eq!(live_member_of(line), Some(4240));
        assert_eq!(live_member_of("7 (x) Z 1 4240 4240"), None);
        assert_eq!(live_member_of("garbage"), None);
    }
}
