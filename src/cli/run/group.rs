//! The command's process group: starting, watching without reaping, signalling and stopping it.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitStatus};

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, waitid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};

use super::plan::Plan;
use super::{Ctx, Exit};
use crate::domain::Lease;

/// The exit code of a command that could not start, as a shell has it (127, 126).
pub(super) fn not_started(e: &std::io::Error) -> (Exit, &'static str) {
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

pub(super) fn spawn(ctx: &Ctx, command: &[OsString], lease: &Lease) -> std::io::Result<Child> {
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

/// Resolves once `pid` exits, unreaped (`WNOWAIT`), so its id stays taken until [`reap`].
pub(super) fn watch_exit(pid: Pid) -> oneshot::Receiver<()> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        while let Err(Errno::EINTR) =
            waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT)
        {}
        let _ = tx.send(());
    });
    rx
}

pub(super) fn reap(child: &mut Child) -> ExitStatus {
    child
        .wait()
        .expect("the command is our child and not yet reaped")
}

pub(super) fn send(group: Pid, sig: Signal) {
    match killpg(group, sig) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => eprintln!(
            "snapfence: cannot send {} to the command: {e}",
            sig.as_str()
        ),
    }
}

/// SIGTERM to the group, SIGKILL after the plan's grace; whether the group is gone.
pub(super) async fn stop_group(group: Pid, plan: &Plan) -> bool {
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

/// Whether any group member is alive, zombies aside.
pub(super) fn group_alive(group: Pid) -> bool {
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

/// The group of a `/proc/PID/stat` line unless the process is dead.
fn live_member_of(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    (!matches!(state, "Z" | "X")).then_some(group)
}

pub(super) fn exit_of(status: ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Status(code as u8),
        (None, Some(sig)) => Exit::Status(128 + sig as u8),
        (None, None) => Exit::Failure,
    }
}

pub(super) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
        })
    }

    pub(super) async fn recv(&mut self) -> Signal {
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
