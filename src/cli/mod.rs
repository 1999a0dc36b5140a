//! The `snapfence` command line: `serve` runs the service, the client commands call it through
//! [`snapfence_client`], `run` runs a command under a lease. Answers go to stdout (a table, or the
//! contract's JSON with `--output json`), errors to stderr, and the exit code tells outcomes apart
//! ([`exit`]).

mod audit;
mod describe;
pub mod exit;
pub mod keys;
mod lease;
mod output;
mod run;
mod serve;
mod snapshot;
mod txn;
mod watch;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, FromArgMatches, Parser, Subcommand};

use crate::config::ServeConfig;
use crate::domain::Owner;
pub use exit::Exit;
pub use output::Output;
use snapfence_client::{Client, Error};

/// snapfence: leases with fencing tokens and fenced snapshots, on PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "snapfence", version, about, after_long_help = exit::EXIT_CODES)]
pub struct Cli {
    /// Options of every command that talks to a server.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options of every command that talks to a server (`serve` ignores them). `--help` shows them
/// under a heading of their own, after the command's own options.
#[derive(Debug, Args)]
#[command(next_help_heading = "Client options")]
pub struct Global {
    /// The snapfence server.
    #[arg(
        long,
        global = true,
        env = "SNAPFENCE_URL",
        default_value = "http://127.0.0.1:7878"
    )]
    pub url: String,
    /// How answers are printed: a table for people, or the contract's JSON for scripts.
    #[arg(long, global = true, value_enum, default_value = "table")]
    pub output: Output,
    /// How long one HTTP request may take.
    #[arg(long, global = true, value_parser = parse::duration, default_value = "10s")]
    pub timeout: Duration,
    /// The API key (`sf_<id>_<secret>`), needed once the server has any.
    #[arg(long, global = true, env = "SNAPFENCE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Also trust the certificates in this PEM file for an https --url (a private CA, or the
    /// server's self-signed certificate).
    #[arg(long, global = true, env = "SNAPFENCE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (with an embedded PostgreSQL unless DATABASE_URL is set).
    ///
    /// Besides the API under /v1, it serves the operator page at /ui
    /// (http://127.0.0.1:7878/ui with the default --listen; the log prints its URL at start): who
    /// holds which key and until when, refused writes over time and the audit log, the recovery
    /// records waiting for a reconciliation, and a key's snapshot versions. Without API keys on
    /// loopback it needs none; otherwise paste a key (`snapfence keys create`) into its key box:
    /// it shows what that key may read, and abandoning a lease takes an admin key.
    // Boxed: the service's configuration is many times the size of every other command's.
    Serve(Box<ServeConfig>),
    /// Manage API keys in the service's database.
    Keys(keys::KeysArgs),
    /// Print the completion script of a shell (bash, zsh, fish, elvish, powershell).
    Completions(describe::CompletionsArgs),
    /// Print the man page snapfence(1), or write every command's page into a directory.
    Man(describe::ManArgs),
    /// The commands that talk to a server.
    #[command(flatten)]
    Client(ClientCommand),
}

/// The subcommands that talk to a server.
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Acquire, renew, release and inspect leases.
    #[command(subcommand)]
    Lease(lease::LeaseCommand),
    /// Write, read and delete fenced snapshots.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Write several snapshots under one lease's fence, all or nothing (a transaction).
    Txn(txn::TxnArgs),
    /// Read the audit log.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Run a command under a lease, and stop it before the lease can lapse.
    Run(run::RunArgs),
    /// Print the changes to keys as they commit, one line each, until interrupted or --count;
    /// resumes by itself, missing none, when the server ends the stream or the connection
    /// breaks.
    Watch(watch::WatchArgs),
}

pub(crate) struct Ctx {
    client: Client,
    output: Output,
    /// How `run`'s command reaches the same server with its own `snapfence` calls.
    reach: Reach,
}

/// Environment variables that tell a command how to reach the server as `run` does.
pub type Reach = Vec<(&'static str, OsString)>;

impl Ctx {
    /// Prints what went wrong and what to do next (with `--output json`, the problem on stdout);
    /// the exit code.
    fn fail(&self, e: &Error, check: Option<&str>) -> Exit {
        if self.output == Output::Json {
            output::print_json(&output::problem(self.client.base_url(), e, check));
        }
        output::report(self.client.base_url(), e, check)
    }
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli =
        Cli::from_arg_matches(&describe::command().get_matches()).unwrap_or_else(|e| e.exit());
    let command = match cli.command {
        Command::Serve(config) => return serve::main(*config),
        Command::Keys(args) => return keys::main(args, cli.global.output),
        Command::Completions(args) => return describe::completions(&args).into(),
        Command::Man(args) => return describe::man(&args).into(),
        Command::Client(command) => command,
    };
    let (client, reach) = match client_of(&cli.global) {
        Ok(made) => made,
        Err(message) => {
            eprintln!("snapfence: {message}");
            return Exit::Usage.into();
        }
    };
    let ctx = Ctx {
        client,
        output: cli.global.output,
        reach,
    };
    let runtime = match current_thread_runtime() {
        Ok(rt) => rt,
        Err(exit) => return exit.into(),
    };
    let exit = runtime.block_on(async {
        match command {
            ClientCommand::Lease(c) => lease::main(&ctx, c).await,
            ClientCommand::Snapshot(c) => snapshot::main(&ctx, c).await,
            ClientCommand::Txn(args) => txn::main(&ctx, args).await,
            ClientCommand::Audit(c) => audit::main(&ctx, c).await,
            ClientCommand::Run(args) => run::main(&ctx, args).await,
            ClientCommand::Watch(args) => watch::main(&ctx, args).await,
        }
    });
    exit.into()
}

/// The client the global options describe, and those options as environment variables.
pub fn client_of(global: &Global) -> Result<(Client, Reach), String> {
    let mut reach = Vec::new();
    let mut builder = Client::builder(global.url.clone())
        .timeout(global.timeout)
        .on_retry(|e, pause| {
            eprintln!(
                "snapfence: {e} (retrying in {})",
                humantime::format_duration(Duration::from_millis(pause.as_millis() as u64))
            );
        });
    if let Some(key) = &global.api_key {
        builder = builder.api_key(key.clone());
        reach.push(("SNAPFENCE_API_KEY", key.into()));
    }
    if let Some(path) = &global.ca_cert {
        let pem = std::fs::read(path)
            .map_err(|e| format!("--ca-cert: cannot read {}: {e}", path.display()))?;
        builder = builder.root_certificates_pem(pem);
        reach.push(("SNAPFENCE_CA_CERT", path.into()));
    }
    let client = builder.build().map_err(|e| format!("{e}"))?;
    Ok((client, reach))
}

/// The default owner, so that `lease_held` says who.
fn default_owner() -> Owner {
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    Owner::parse(format!("{user}@{host}"))
        .unwrap_or_else(|_| Owner::parse("snapfence").expect("a valid owner"))
}

mod parse {
    use chrono::{DateTime, Utc};

    use crate::domain::RefusalReason;
    use crate::domain::{
        ChangeId, EntityTagCondition, FencingToken, InvalidInput, KeyPrefix, LeaseState, Metadata,
        RecoveryReason,
    };

    pub fn token(raw: &str) -> Result<FencingToken, InvalidInput> {
        FencingToken::parse_header(raw).map_err(|_| {
            InvalidInput::new(format!(
                "{raw:?} is not a fencing token: the decimal number (1..=9223372036854775807) that `snapfence lease acquire` or `snapfence run` printed, e.g. --token 17"
            ))
        })
    }

    pub fn metadata(raw: &str) -> Result<Metadata, InvalidInput> {
        let value = serde_json::from_str(raw).map_err(|e| {
            InvalidInput::new(format!("not JSON ({e}); write e.g. '{{\"pid\": 4242}}'"))
        })?;
        Metadata::new(value)
    }

    pub fn prefix(raw: &str) -> Result<KeyPrefix, InvalidInput> {
        KeyPrefix::parse(raw)
    }

    pub fn change_id(raw: &str) -> Result<ChangeId, InvalidInput> {
        ChangeId::parse(raw)
    }

    pub fn state(raw: &str) -> Result<LeaseState, InvalidInput> {
        LeaseState::parse(raw).ok_or_else(|| {
            InvalidInput::new("use one of held, expired, released, recovery_pending")
        })
    }

    pub fn refusal_reason(raw: &str) -> Result<RefusalReason, InvalidInput> {
        RefusalReason::parse(raw)
            .ok_or_else(|| InvalidInput::new("use one of stale_token, unknown_token"))
    }

    pub fn recovery_reason(raw: &str) -> Result<RecoveryReason, InvalidInput> {
        RecoveryReason::parse(raw)
            .ok_or_else(|| InvalidInput::new("use one of abandoned, expired, recovery_required"))
    }

    pub fn condition(raw: &str) -> Result<EntityTagCondition, InvalidInput> {
        EntityTagCondition::parse(raw)
    }

    /// A duration such as `30s`, `1h30m` or `500ms`.
    pub fn duration(raw: &str) -> Result<std::time::Duration, InvalidInput> {
        humantime::parse_duration(raw).map_err(|_| {
            InvalidInput::new(
                "not a duration: write a number and a unit, such as 30s, 1m, 1h30m or 500ms",
            )
        })
    }

    /// A lease TTL: at least a millisecond; the server says its own bounds when one is outside
    /// them.
    pub fn ttl(raw: &str) -> Result<std::time::Duration, InvalidInput> {
        let ttl = duration(raw)?;
        if ttl < std::time::Duration::from_millis(1) {
            return Err(InvalidInput::new(
                "a lease needs a TTL above 0: write e.g. 30s or 1m (the server accepts 100ms to 24h by default)",
            ));
        }
        Ok(ttl)
    }

    /// A server-side wait: a duration of at most 5 minutes (the contract's `wait_ms` bound).
    pub fn wait(raw: &str) -> Result<std::time::Duration, InvalidInput> {
        let wait = duration(raw)?;
        if wait > std::time::Duration::from_millis(crate::domain::MAX_WAIT_MS as u64) {
            return Err(InvalidInput::new(
                "at most 5m, the longest the server waits (snapfence run --wait waits longer)",
            ));
        }
        Ok(wait)
    }

    /// RFC 3339, or an age such as `90s` or `2h` before now (on this machine's clock).
    pub fn time(raw: &str) -> Result<DateTime<Utc>, InvalidInput> {
        if let Ok(t) = DateTime::parse_from_rfc3339(raw) {
            return Ok(t.with_timezone(&Utc));
        }
        let age = humantime::parse_duration(raw).map_err(|_| {
            InvalidInput::new("write an RFC 3339 time (2026-12-02T13:05:00Z) or an age (90s, 2h)")
        })?;
        chrono::Duration::from_std(age)
            .ok()
            .and_then(|age| Utc::now().checked_sub_signed(age))
            .ok_or_else(|| InvalidInput::new("that age reaches before the calendar's start"))
    }
}

pub(crate) fn current_thread_runtime() -> Result<tokio::runtime::Runtime, Exit> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("snapfence: cannot start the async runtime: {e}");
            Exit::Failure
        })
}
