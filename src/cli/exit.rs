//! The exit codes of `snapfence`, one per outcome a script may tell apart; docs/cli.md mirrors
//! [`EXIT_CODES`].

use std::process::ExitCode;

use snapfence_client::Error;

/// How a `snapfence` command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: done.
    Success,
    /// 1: any failure without a code of its own (not found, invalid input, precondition
    /// failed, an unexpected answer…).
    Failure,
    /// 2: the command line is wrong (clap's own code for usage errors).
    Usage,
    /// 10: someone else holds the key (`lease_held`), or a recovery record blocks it
    /// (`recovery_required`).
    Held,
    /// 11: the lease is not (or no longer) live: `lease_lost`, or `run` stopped its command
    /// because the lease was lost or about to lapse.
    Lost,
    /// 12: a fenced write was refused (`stale_token`, `unknown_token`).
    Stale,
    /// 13: the service or its database cannot be reached, or is at a limit (`503`, `429`, a
    /// network failure), after the client's retries.
    Unavailable,
    /// 14: `watch --since` asked for changes older than the server keeps (`compacted`): read
    /// the state again and watch without `--since`.
    Compacted,
    /// A status passed on: `run`'s command's own exit code, or 128 + the number of the signal
    /// that killed it (or that interrupted `run` while it waited).
    Status(u8),
    /// 126: `run` could not execute the command (not executable, permission denied).
    CannotExecute,
    /// 127: `run` found no such command.
    CommandNotFound,
}

/// The table of exit codes, as `snapfence --help` prints it.
pub const EXIT_CODES: &str = "\
Exit codes:
  0         success
  1         failure without a code of its own: not found, invalid input, precondition failed,
            unauthorized, forbidden, an unexpected answer
  2         usage: the command line is wrong (also `run` with a `--ttl` too short for its `--grace`)
  10        held: `lease_held` or `recovery_required`
  11        lost: `lease_lost`, or `run` stopped its command because the lease was lost or about
            to lapse
  12        stale: `stale_token` or `unknown_token`, a refused fenced write
  13        unavailable: `503`, `429` (a per-key limit), a gateway's 502/504, no connection to
            the server, or no answer within `--timeout`, after the client's retries
  14        compacted: `watch --since` asked for changes older than the server keeps; read the
            state again, then watch without `--since`
  126, 127  `run`: the command cannot be executed / was not found
  other     `run`: the command's own exit code, or 128 + the signal that killed it";

impl Exit {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Failure => 1,
            Self::Usage => 2,
            Self::Held => 10,
            Self::Lost => 11,
            Self::Stale => 12,
            Self::Unavailable => 13,
            Self::Compacted => 14,
            Self::Status(code) => code,
            Self::CannotExecute => 126,
            Self::CommandNotFound => 127,
        }
    }
}

impl From<&Error> for Exit {
    fn from(e: &Error) -> Self {
        match e {
            Error::LeaseHeld { .. } | Error::RecoveryRequired { .. } => Self::Held,
            Error::LeaseLost { .. } => Self::Lost,
            Error::StaleToken { .. } | Error::UnknownToken { .. } => Self::Stale,
            Error::Compacted { .. } => Self::Compacted,
            Error::Unavailable { .. }
            | Error::Indeterminate { .. }
            | Error::Transport { .. }
            | Error::TooManyRequests { .. }
            | Error::RequestInProgress { .. } => Self::Unavailable,
            Error::Unexpected { status, .. } if matches!(status.as_u16(), 502..=504) => {
                Self::Unavailable
            }
            _ => Self::Failure,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e.code())
    }
}

#[cfg(test)]
mod tests {
    use super::EXIT_CODES;

    fn words(text: &str) -> String {
        text.split(|c: char| c.is_whitespace() || c == '|')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn the_help_prints_the_cli_guides_table_of_exit_codes() {
        let guide = include_str!("../../docs/cli.md");
        let section = guide
            .split("## Exit codes")
            .nth(1)
            .expect("docs/cli.md has an Exit codes section");
        let rows: Vec<&str> = section
            .lines()
            .skip_while(|l| !l.starts_with("| 0 "))
            .take_while(|l| l.starts_with('|'))
            .collect();
        assert_eq!(rows.len(), 10, "{rows:?}");
        let help = words(EXIT_CODES.trim_start_matches("Exit codes:"));
        assert_eq!(help, words(&rows.join("\n")));
    }
}
