//! `snapfence serve`: start or adopt the database, migrate, serve until SIGTERM or SIGINT, then
//! drain.

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

use crate::config::{LogFormat, ServeConfig};
use crate::embedded::{EmbeddedPostgres, Settings};
use crate::http::AppState;
use crate::{store, telemetry};

pub(super) const EMBEDDED_DATABASE: &str = "snapfence";

/// Runs the service; the exit code is 0 after a clean shutdown, 1 when it could not start.
pub fn main(config: ServeConfig) -> ExitCode {
    let telemetry = telemetry::init(config.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            telemetry.shutdown();
            return ExitCode::FAILURE;
        }
    };
    let log_format = config.log_format;
    let served = runtime.block_on(serve(config));
    drop(runtime);
    telemetry.shutdown();
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            match log_format {
                LogFormat::Plain => eprintln!("snapfence: {message}"),
                LogFormat::Json => tracing::error!("{message}"),
            }
            ExitCode::FAILURE
        }
    }
}

async fn serve(config: ServeConfig) -> Result<(), String> {
    config.check()?;
    let parse = |url: &str, name: &str| {
        PgConnectOptions::from_str(url).map_err(|e| {
            format!("{name} is not a PostgreSQL URL ({e}); write it as postgres://user:pass@host:5432/db")
        })
    };
    let pooled = match (&config.database_url, &config.database_direct_url) {
        (Some(url), Some(_)) => Some(parse(url, "DATABASE_URL")?),
        _ => None,
    };
    let (options, embedded) = match (&config.database_direct_url, &config.database_url) {
        (Some(url), _) => (parse(url, "DATABASE_DIRECT_URL")?, None),
        (None, Some(url)) => (parse(url, "DATABASE_URL")?, None),
        (None, None) => {
            let dir = config.data_dir.clone();
            let pg = tokio::task::spawn_blocking(move || {
                EmbeddedPostgres::start(&dir, &Settings::default())
            })
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
            tracing::info!(
                data_dir = %pg.dir().display(),
                log = %pg.log_path().display(),
                "embedded PostgreSQL is running; its data lives in the data directory and is kept across restarts"
            );
            pg.ensure_database(EMBEDDED_DATABASE)
                .await
                .map_err(|e| e.to_string())?;
            (pg.connect_options(EMBEDDED_DATABASE), Some(pg))
        }
    };
    let result = serve_on(&config, options, pooled).await;
    if let Some(pg) = embedded {
        tracing::info!("stopping the embedded PostgreSQL");
        if let Err(e) = tokio::task::spawn_blocking(move || pg.stop())
            .await
            .map_err(|e| e.to_string())?
        {
            tracing::error!(error = %e, "stopping the embedded PostgreSQL failed");
        }
    }
    result
}

/// Connections to PostgreSQL itself behind a pooler: the hot ones go through the pooler.
const DIRECT_POOL_SIZE: u32 = 4;

async fn serve_on(
    config: &ServeConfig,
    options: PgConnectOptions,
    pooled: Option<PgConnectOptions>,
) -> Result<(), String> {
    let pooler = pooled.map(|p| store::pooler(p, &config.db()));
    let direct = match pooler {
        Some(_) => store::DbSettings {
            pool_size: config.db_pool_size.min(DIRECT_POOL_SIZE),
            ..config.db()
        },
        None => config.db(),
    };
    let url = if pooler.is_some() {
        "DATABASE_DIRECT_URL"
    } else {
        "DATABASE_URL"
    };
    let pool = store::pool(options, &direct);
    let give_up = tokio::time::Instant::now() + config.startup_timeout;
    let mut delay = Duration::from_millis(200);
    loop {
        let ready = match store::prepare(&pool).await {
            Ok(()) => match &pooler {
                Some(p) => store::check_pooler(p)
                    .await
                    .map_err(|e| (e, "DATABASE_URL")),
                None => Ok(()),
            },
            Err(e) => Err((e, url)),
        };
        match ready {
            Ok(()) => break,
            Err((e, _)) if pooler.is_none() && refused_as_a_pooler(&e) => {
                return Err(format!(
                    "{e}; DATABASE_URL looks like a connection pooler, which cannot hold the \
                     sessions snapfence needs (LISTEN, migrations, locks): give PostgreSQL \
                     itself as --database-direct-url (DATABASE_DIRECT_URL) beside the pooler"
                ));
            }
            Err((store::StoreError::Unavailable(e), url))
                if tokio::time::Instant::now() < give_up =>
            {
                tracing::warn!(error = %e, at = url, retry_in = ?delay, "waiting for the database");
                tokio::select! {
                    () = tokio::time::sleep(delay.min(give_up - tokio::time::Instant::now())) => {}
                    () = shutdown_signal() => return Ok(()),
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err((store::StoreError::Unavailable(e), url)) => {
                return Err(format!(
                    "the database stayed unavailable for {} ({e}); check that PostgreSQL runs \
                     at the address in {url} and accepts connections (pg_isready), or \
                     allow longer with --startup-timeout",
                    humantime::format_duration(config.startup_timeout)
                ));
            }
            Err((e, url)) => return Err(format!("{e}; {}", start_up_hint(&e, url))),
        }
    }
    tracing::info!("database migrated");
    check_exposure(config, &pool).await?;
    let listener = TcpListener::bind(config.listen).await.map_err(|e| {
        format!(
            "cannot listen on {}: {e}; choose another --listen address",
            config.listen
        )
    })?;
    tracing::info!(address = %config.listen, tls = config.tls_cert.is_some(), "listening");
    tracing::info!(
        "the operator page (leases, refused writes, recovery records, snapshots) is at {}",
        ui_url(config.listen, config.tls_cert.is_some())
    );
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(crate::tls_config(cert, key).await.map_err(|e| {
            format!("cannot load --tls-cert {} / --tls-key {}: {e}; pass a PEM certificate chain and its PEM private key", cert.display(), key.display())
        })?),
        _ => None,
    };
    let mut rules = config.rules();
    rules.max_connections = connections_within_file_limit(config, rules.max_connections);
    // Through a pooler no connection keeps its plans, so none is opened ahead.
    let warm = match pooler {
        Some(_) => 0,
        None => config.db_pool_warm.min(config.db_pool_size) as usize,
    };
    let db = match pooler {
        Some(p) => store::Db::with_pooler(pool.clone(), p),
        None => store::Db::new(pool.clone()),
    };
    if warm > 0 {
        let db = db.clone();
        // In the background: the instance serves meanwhile.
        tokio::spawn(async move {
            match db.warm(warm).await {
                Ok(w) => {
                    tracing::info!(
                        connections = w.connections,
                        plans = w.plans,
                        "hot connections opened and planned"
                    );
                }
                Err(e) => tracing::warn!(
                    error = %e,
                    "could not open hot connections ahead of load; they open as requests need them"
                ),
            }
        });
    }
    let state = AppState::new(db, rules);
    crate::run(listener, state, tls, shutdown_signal())
        .await
        .map_err(|e| format!("the server failed: {e}"))?;
    tracing::info!("shut down; requests in flight were finished");
    pool.close().await;
    Ok(())
}

/// What to do about a start-up failure that waiting would not mend, by the SQLSTATE it carries.
fn start_up_hint(e: &store::StoreError, url: &str) -> String {
    use sqlx::migrate::MigrateError::{Execute, ExecuteMigration};
    let sql = match e {
        store::StoreError::Internal(e) => Some(e),
        store::StoreError::Migrate(Execute(e) | ExecuteMigration(e, _)) => Some(e),
        _ => None,
    };
    let code = sql.and_then(|e| e.as_database_error()?.code().map(|c| c.into_owned()));
    match code.as_deref() {
        Some("42501") => "this user may not create tables there: connect as the database's owner, \
                          or grant it CREATE on the schema"
            .to_string(),
        Some("3D000") => format!(
            "that database does not exist: create it (createdb NAME) or name another in {url}"
        ),
        Some(c) if c.starts_with("28") => {
            format!("PostgreSQL refused the login: check the user and password in {url}")
        }
        _ if matches!(e, store::StoreError::Migrate(_)) => {
            "the database's migration history does not match this build's (was it migrated by \
             another version of snapfence?)"
                .to_string()
        }
        _ => "see PostgreSQL's log for the cause".to_string(),
    }
}

/// Whether the server refused the startup options as PgBouncer does (`unsupported startup
/// parameter`), so the URL is a pooler's.
fn refused_as_a_pooler(e: &store::StoreError) -> bool {
    e.to_string().contains("unsupported startup parameter")
}

/// The operator page's URL for a browser here: loopback for an unspecified listen address.
fn ui_url(listen: std::net::SocketAddr, tls: bool) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{}/ui", SocketAddr::new(ip, listen.port()))
}

/// Files an instance keeps open besides connections and pools (runtime, logs, pipes, TLS).
const OTHER_FILES: u64 = 128;

/// Raises the soft open-files limit to the hard one, as Go does: every connection is a file.
fn connections_within_file_limit(config: &ServeConfig, wanted: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return wanted;
    };
    // Linux refuses an unlimited soft limit; 2^20 is its usual ceiling.
    let raised = hard.min(1 << 20);
    let files = if raised > soft && setrlimit(Resource::RLIMIT_NOFILE, raised, hard).is_ok() {
        raised
    } else {
        soft
    };
    let reserve = OTHER_FILES + 2 * u64::from(config.db_pool_size) + 1;
    let allowed = connections_allowed(files, reserve, wanted);
    if allowed < wanted {
        tracing::warn!(
            open_file_limit = files,
            max_connections = allowed,
            "the open-file limit leaves room for {allowed} connections, not --max-connections {wanted}; \
             more wait in the listen queue. Raise the limit (ulimit -n, LimitNOFILE=) to serve more"
        );
    }
    allowed
}

fn connections_allowed(files: u64, reserve: u64, wanted: usize) -> usize {
    let room = usize::try_from(files.saturating_sub(reserve)).unwrap_or(usize::MAX);
    wanted.min(room).max(1)
}

async fn shutdown_signal() {
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("installing a SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

/// Refuses a non-loopback address with no live API key unless `--insecure-no-auth`.
async fn check_exposure(config: &ServeConfig, pool: &sqlx::PgPool) -> Result<(), String> {
    if config.listen.ip().is_loopback() {
        return Ok(());
    }
    let keys = store::keys::any_live(pool)
        .await
        .map_err(|e| format!("cannot check for API keys: {e}"))?;
    match (keys, config.insecure_no_auth) {
        (true, _) => Ok(()),
        (false, true) => {
            tracing::warn!(
                address = %config.listen,
                "serving a non-loopback address WITHOUT authentication (--insecure-no-auth): anyone who can reach it may write"
            );
            Ok(())
        }
        (false, false) => Err(format!(
            "refusing to listen on {} without authentication: no API key exists, so anyone who can reach \
             the address could take leases and write. Create a key first (`snapfence keys create --name ops \
             --scope admin`), listen on 127.0.0.1, or pass --insecure-no-auth to accept the risk",
            config.listen
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_below_the_file_limit_less_the_reserve() {
        assert_eq!(connections_allowed(1024, 161, 4096), 863);
        assert_eq!(connections_allowed(1 << 20, 161, 4096), 4096);
        assert_eq!(connections_allowed(100, 161, 4096), 1);
    }

    #[test]
    fn the_operator_page_url_is_one_a_browser_here_can_open() {
        let url = |listen: &str, tls| ui_url(listen.parse().unwrap(), tls);
        assert_eq!(url("127.0.0.1:7878", false), "http://127.0.0.1:7878/ui");
        assert_eq!(url("0.0.0.0:8443", true), "https://127.0.0.1:8443/ui");
        assert_eq!(url("[::]:7878", false), "http://[::1]:7878/ui");
        assert_eq!(url("10.1.2.3:80", false), "http://10.1.2.3:80/ui");
    }
}
