//! `snapfence keys …`: API keys managed in the database itself, since the first cannot come through
//! the API.

use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Subcommand};
use sqlx::postgres::PgConnectOptions;

use super::{Exit, Output, current_thread_runtime};
use crate::domain::{KeyName, KeyPrefix, Scope};
use crate::embedded::{EmbeddedPostgres, Settings};
use crate::store::{self, DbSettings, keys};

/// Where the keys live.
#[derive(Debug, Args)]
pub struct KeysArgs {
    /// PostgreSQL of the service. Without it, the embedded cluster in --data-dir.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// PostgreSQL itself when DATABASE_URL is a transaction-mode pooler, as for `serve`: the
    /// keys are managed through it.
    #[arg(
        long,
        global = true,
        env = "DATABASE_DIRECT_URL",
        hide_env_values = true
    )]
    database_direct_url: Option<String>,
    /// The service's embedded data directory (only without --database-url); the default is
    /// ./snapfence-data, or /var/lib/snapfence as root, as for `serve`.
    #[arg(
        long,
        global = true,
        env = "SNAPFENCE_DATA_DIR",
        default_value_os_t = crate::config::default_data_dir(),
        hide_default_value = true
    )]
    data_dir: PathBuf,
    /// What to do.
    #[command(subcommand)]
    command: KeysCommand,
}

/// The key subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a key and print its bearer token (shown this once; only its hash is stored).
    Create {
        /// The key's name: the principal in the audit log.
        #[arg(long)]
        name: String,
        /// What it may do: read < write < admin.
        #[arg(long, value_enum)]
        scope: Scope,
        /// Confine it to keys that start with this.
        #[arg(long, default_value = "")]
        prefix: String,
    },
    /// List every key, live and revoked (never their secrets).
    List,
    /// Revoke the live key of a name, at once on every instance.
    Revoke {
        /// The key's name.
        #[arg(long)]
        name: String,
    },
}

/// Runs a keys subcommand.
pub fn main(args: KeysArgs, output: Output) -> ExitCode {
    let runtime = match current_thread_runtime() {
        Ok(rt) => rt,
        Err(exit) => return exit.into(),
    };
    match runtime.block_on(run(args, output)) {
        Ok(exit) => exit.into(),
        Err(message) => {
            eprintln!("snapfence: {message}");
            Exit::Failure.into()
        }
    }
}

async fn run(mut args: KeysArgs, output: Output) -> Result<Exit, String> {
    if let Some(direct) = args.database_direct_url.take() {
        args.database_url = Some(direct);
    }
    // Only `create` may make the database, so the first key can exist before the service starts.
    let may_make = matches!(args.command, KeysCommand::Create { .. });
    let place = match &args.database_url {
        Some(_) => "the database of DATABASE_URL".to_string(),
        None => format!("the data directory {}", args.data_dir.display()),
    };
    let missing = || {
        format!(
            "{place} holds no snapfence database; point at the service's with --data-dir \
             (SNAPFENCE_DATA_DIR) or DATABASE_URL"
        )
    };
    let (options, started) = match &args.database_url {
        Some(url) => (
            PgConnectOptions::from_str(url)
                .map_err(|e| format!("DATABASE_URL is not a PostgreSQL URL ({e})"))?,
            None,
        ),
        None => {
            if !may_make && !EmbeddedPostgres::exists_at(&args.data_dir) {
                return Err(missing());
            }
            let dir = args.data_dir.clone();
            let (pg, started) =
                tokio::task::spawn_blocking(move || match EmbeddedPostgres::running_at(&dir)? {
                    Some(pg) => Ok((pg, false)),
                    None => {
                        EmbeddedPostgres::start(&dir, &Settings::default()).map(|pg| (pg, true))
                    }
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            pg.ensure_database(super::serve::EMBEDDED_DATABASE)
                .await
                .map_err(|e| e.to_string())?;
            (
                pg.connect_options(super::serve::EMBEDDED_DATABASE),
                started.then_some(pg),
            )
        }
    };
    let pool = store::pool(
        options,
        &DbSettings {
            pool_size: 2,
            ..DbSettings::default()
        },
    );
    let result = async {
        let unreachable = |e: store::StoreError| format!("{e}; is the database reachable?");
        let made = !store::has_schema(&pool).await.map_err(unreachable)?;
        if made && !may_make {
            return Err(missing());
        }
        store::prepare(&pool).await.map_err(unreachable)?;
        if made {
            eprintln!(
                "snapfence: {place} held no snapfence database, so this made one; if your service \
                 uses another, run this again with its --data-dir or DATABASE_URL"
            );
        }
        act(&pool, args.command, output).await
    }
    .await;
    pool.close().await;
    if let Some(pg) = started {
        tokio::task::spawn_blocking(move || pg.stop())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    result
}

async fn act(pool: &sqlx::PgPool, command: KeysCommand, output: Output) -> Result<Exit, String> {
    let name = |raw: String| KeyName::parse(raw).map_err(|e| e.to_string());
    match command {
        KeysCommand::Create {
            name: raw,
            scope,
            prefix,
        } => {
            let prefix = KeyPrefix::parse(prefix).map_err(|e| e.to_string())?;
            let name = name(raw)?;
            let confirmations = listen(pool).await?;
            let Some((key, token, change)) = keys::create(pool, &name, scope, &prefix)
                .await
                .map_err(|e| e.to_string())?
            else {
                eprintln!(
                    "snapfence: a live key of that name exists; revoke it first or choose another --name"
                );
                return Ok(Exit::Failure);
            };
            confirm(
                confirmations,
                change,
                &format!("key {:?} made", name.as_str()),
            )
            .await;
            output.print(&serde_json::json!({ "key": key, "token": token }), |_| {
                format!("{token}\n")
            });
            if matches!(output, Output::Table) {
                eprintln!(
                    "key {:?} (scope {}, prefix {:?}): the token above is shown this once; send it as `Authorization: Bearer <token>` (the CLI: --api-key or SNAPFENCE_API_KEY)",
                    key.name, key.scope, key.prefix
                );
            }
        }
        KeysCommand::List => {
            let all = keys::list(pool).await.map_err(|e| e.to_string())?;
            output.print(&serde_json::json!({ "items": all }), |_| {
                let mut table = format!(
                    "{:<6} {:<24} {:<6} {:<16} STATE\n",
                    "ID", "NAME", "SCOPE", "PREFIX"
                );
                for k in &all {
                    let state = if k.revoked_at.is_some() {
                        "revoked"
                    } else {
                        "live"
                    };
                    table += &format!(
                        "{:<6} {:<24} {:<6} {:<16} {state}\n",
                        k.id, k.name, k.scope, k.prefix
                    );
                }
                table
            });
        }
        KeysCommand::Revoke { name: raw } => {
            let name = name(raw)?;
            let confirmations = listen(pool).await?;
            let Some(change) = keys::revoke(pool, &name).await.map_err(|e| e.to_string())? else {
                eprintln!(
                    "snapfence: no live key is named {:?}; `snapfence keys list` shows them",
                    name.as_str()
                );
                return Ok(Exit::Failure);
            };
            confirm(
                confirmations,
                change,
                &format!("key {:?} revoked", name.as_str()),
            )
            .await;
        }
    }
    Ok(Exit::Success)
}

const CONFIRM_WITHIN: Duration = Duration::from_secs(5);

async fn listen(pool: &sqlx::PgPool) -> Result<keys::Confirmations, String> {
    keys::Confirmations::listen(pool)
        .await
        .map_err(|e| format!("cannot listen for the instances' confirmations: {e}"))
}

/// Waits for the running instances to apply `change` and says on stderr whether all did.
async fn confirm(confirmations: keys::Confirmations, change: keys::Change, done: &str) {
    match confirmations.wait(change, CONFIRM_WITHIN).await {
        Ok(c) if c.following == 0 => eprintln!(
            "{done}: no instance is running on this database yet; every one started on it will \
             enforce it"
        ),
        Ok(c) if c.silent.is_empty() => eprintln!(
            "{done}: in force on every running instance ({} confirmed)",
            c.following
        ),
        Ok(c) => eprintln!(
            "{done}, but {} of {} running instances did not confirm within {CONFIRM_WITHIN:?} \
             (their database backends: {:?}); such an instance checks every request against the \
             table once it notices its lost connection: check its database link, or restart it",
            c.silent.len(),
            c.following,
            c.silent
        ),
        Err(e) => eprintln!(
            "{done}, but could not wait for the running instances to confirm ({e}); \
             `snapfence keys list` shows the table, which every instance follows"
        ),
    }
}
