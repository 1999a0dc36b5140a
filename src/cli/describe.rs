//! `--help`, completions and man pages, all from the one clap definition of [`Cli`], so none
//! drifts.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use clap::{Arg, Args, CommandFactory};
use clap_complete::Shell;

use super::{Cli, Exit};

/// `snapfence completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// `snapfence man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write a page for every command (snapfence.1, snapfence-lease-acquire.1, …) into this
    /// directory instead of printing snapfence(1).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The command line as `--help` shows it: [`Cli`], with each option's `[env: NAME=]` replaced by
/// a list of the command's variables after its long help.
pub fn command() -> clap::Command {
    with_env_listed(Cli::command(), &[])
}

/// `cmd` and its subcommands, each listing its variables once.
fn with_env_listed(cmd: clap::Command, inherited: &[Arg]) -> clap::Command {
    let mut reach: Vec<Arg> = inherited.to_vec();
    reach.extend(cmd.get_arguments().cloned());
    let globals: Vec<Arg> = reach
        .iter()
        .filter(|a| a.is_global_set())
        .cloned()
        .collect();
    let mut list = String::new();
    for arg in &reach {
        if let (Some(env), Some(long)) = (arg.get_env(), arg.get_long()) {
            let _ = writeln!(list, "  {:<34} --{long}", env.to_string_lossy());
        }
    }
    let cmd = cmd
        .mut_args(|a| a.hide_env(true))
        .mut_subcommands(|sub| with_env_listed(sub, &globals));
    if list.is_empty() {
        return cmd;
    }
    let env = format!("Environment (each sets its option when the option is not given):\n{list}");
    let after = match cmd.get_after_long_help() {
        Some(existing) => format!("{}\n\n{existing}", env.trim_end()),
        None => env.trim_end().to_owned(),
    };
    cmd.after_long_help(after)
}

/// Prints the completion script for `shell` on stdout.
pub fn completions(args: &CompletionsArgs) -> Exit {
    let mut cmd = command();
    let name = cmd.get_name().to_owned();
    // clap_complete panics when it cannot write, so write to memory first.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, name, &mut script);
    match to_stdout(&script) {
        Ok(()) => Exit::Success,
        Err(e) => {
            eprintln!("snapfence: cannot print the completion script: {e}");
            Exit::Failure
        }
    }
}

/// Prints snapfence(1) on stdout, or writes every command's page into `--dir`. The pages come
/// from [`Cli`] as declared, so each option's page names its environment variable itself.
pub fn man(args: &ManArgs) -> Exit {
    let cmd = Cli::command();
    let written = match &args.dir {
        Some(dir) => clap_mangen::generate_to(cmd, dir).map_err(|e| {
            format!(
                "cannot write the man pages into {}: {e}; create the directory first (mkdir -p) or choose one you may write to",
                dir.display()
            )
        }),
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut page)
                .and_then(|()| to_stdout(&page))
                .map_err(|e| format!("cannot print the man page: {e}"))
        }
    };
    match written {
        Ok(()) => Exit::Success,
        Err(message) => {
            eprintln!("snapfence: {message}");
            Exit::Failure
        }
    }
}

/// Writes to stdout; a reader that stopped (`| head`) is no failure.
fn to_stdout(bytes: &[u8]) -> std::io::Result<()> {
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::command;

    fn long_help(path: &[&str]) -> String {
        let mut cmd = command();
        cmd.build();
        let mut at = &mut cmd;
        for name in path {
            at = at.find_subcommand_mut(name).expect("a subcommand");
        }
        at.render_long_help().to_string()
    }

    #[test]
    fn help_shows_no_env_noise_under_the_options() {
        for path in [
            &[][..],
            &["serve"],
            &["lease", "acquire"],
            &["keys", "create"],
        ] {
            let help = long_help(path);
            assert!(!help.contains("[env:"), "{path:?}:\n{help}");
        }
    }

    #[test]
    fn help_lists_each_variable_once_with_its_option() {
        let help = long_help(&["lease", "acquire"]);
        for (env, flag) in [
            ("SNAPFENCE_URL", "--url"),
            ("SNAPFENCE_API_KEY", "--api-key"),
        ] {
            let lines: Vec<&str> = help.lines().filter(|l| l.contains(env)).collect();
            assert_eq!(lines.len(), 1, "{env}:\n{help}");
            assert!(lines[0].trim_end().ends_with(flag), "{}", lines[0]);
        }
        assert!(long_help(&["serve"]).contains("SNAPFENCE_MAX_CONNECTIONS"));
    }
}
