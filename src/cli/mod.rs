//! The `snapfence` command line: `serve` runs the service.

mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::ServeConfig;

/// snapfence: leases with fencing tokens and fenced snapshots, on PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "snapfence", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service (with an embedded PostgreSQL unless DATABASE_URL is set).
    Serve(ServeConfig),
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(config) => serve::main(config),
    }
}
