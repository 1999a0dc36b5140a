//! Every option of `snapfence serve` as a flag and variable; docs/operations.md's table mirrors it.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::domain::TtlBounds;
use crate::http::extract::MAX_JSON_BYTES;
use crate::rules::{RateLimit, Rules};
use crate::store::DbSettings;

/// The shortest `--idempotency-retention`: an answer must outlive every retry of its call.
pub const MIN_IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(300);

/// The embedded PostgreSQL's default data directory: `./snapfence-data`, or `/var/lib/snapfence`
/// for root, since the `postgres` user cannot reach a private home.
pub fn default_data_dir() -> PathBuf {
    if nix::unistd::Uid::effective().is_root() {
        PathBuf::from("/var/lib/snapfence")
    } else {
        PathBuf::from("./snapfence-data")
    }
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// `snapfence serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "SNAPFENCE_LISTEN", default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,

    /// PostgreSQL to use. Without it, snapfence runs a private PostgreSQL in --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// PostgreSQL itself, when --database-url is a transaction-mode pooler (PgBouncer, Supavisor,
    /// RDS Proxy): LISTEN, migrations, locks and the statements off the hot paths use it.
    #[arg(
        long,
        env = "DATABASE_DIRECT_URL",
        hide_env_values = true,
        requires = "database_url"
    )]
    pub database_direct_url: Option<String>,

    /// Where the embedded PostgreSQL keeps its data (only without --database-url); the default
    /// is ./snapfence-data, or /var/lib/snapfence as root.
    #[arg(long, env = "SNAPFENCE_DATA_DIR", default_value_os_t = default_data_dir(), hide_default_value = true)]
    pub data_dir: PathBuf,

    /// PEM certificate chain to serve HTTPS with (together with --tls-key).
    #[arg(long, env = "SNAPFENCE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "SNAPFENCE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Log format.
    #[arg(
        long,
        env = "SNAPFENCE_LOG_FORMAT",
        value_enum,
        default_value = "plain"
    )]
    pub log_format: LogFormat,

    /// Shortest lease TTL accepted.
    #[arg(long, env = "SNAPFENCE_MIN_TTL", value_parser = humantime::parse_duration, default_value = "100ms")]
    pub min_ttl: Duration,

    /// Longest lease TTL accepted.
    #[arg(long, env = "SNAPFENCE_MAX_TTL", value_parser = humantime::parse_duration, default_value = "24h")]
    pub max_ttl: Duration,

    /// Snapshot versions kept per key, the current one included.
    #[arg(long, env = "SNAPFENCE_KEEP_VERSIONS", default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub keep_versions: i64,

    /// Largest snapshot body in bytes; larger uploads are cut off with 413.
    #[arg(long, env = "SNAPFENCE_MAX_SNAPSHOT_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_snapshot_bytes: usize,

    /// The most ops one transaction (POST /v1/txn) may have.
    #[arg(long, env = "SNAPFENCE_MAX_TXN_OPS", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_txn_ops: u32,

    /// The most snapshots the prefix deletes of one transaction may remove together; past it
    /// the transaction is refused with 400 and the client deletes in pages.
    #[arg(long, env = "SNAPFENCE_MAX_TXN_PREFIX_KEYS", default_value_t = 10_000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub max_txn_prefix_keys: i64,

    /// How long audit rows are kept before the background pruner deletes them.
    #[arg(long, env = "SNAPFENCE_AUDIT_RETENTION", value_parser = humantime::parse_duration, default_value = "30days")]
    pub audit_retention: Duration,

    /// How long the answer of a changing call sent with an Idempotency-Key is kept (and so how
    /// long a retry with the same key finds it); at least this long, pruned soon after. At
    /// least 5 minutes, longer than any client keeps retrying one call.
    #[arg(long, env = "SNAPFENCE_IDEMPOTENCY_RETENTION", value_parser = humantime::parse_duration, default_value = "24h")]
    pub idempotency_retention: Duration,

    /// The longest an acquire waits in a key's queue (its `wait_ms`, up to the contract's 5
    /// minutes, is cut to this): then it is answered 409 lease_held. 0 makes every acquire one
    /// that does not wait.
    #[arg(long, env = "SNAPFENCE_MAX_WAIT", value_parser = max_wait, default_value = "5m")]
    pub max_wait: Duration,

    /// How long the history of changes is kept: a watch resumed from an older change is
    /// answered 410 compacted.
    #[arg(long, env = "SNAPFENCE_WATCH_RETENTION", value_parser = positive_duration, default_value = "24h")]
    pub watch_retention: Duration,

    /// How often an idle watch stream is sent a comment line, so that proxies and clients keep
    /// it open; at most the contract's 15 seconds.
    #[arg(long, env = "SNAPFENCE_WATCH_HEARTBEAT", value_parser = heartbeat, default_value = "10s")]
    pub watch_heartbeat: Duration,

    /// How long one watch stream lasts before the service ends it; the client resumes it with
    /// `Last-Event-ID` and misses nothing. Bounds what a forgotten stream holds.
    #[arg(long, env = "SNAPFENCE_MAX_WATCH", value_parser = positive_duration, default_value = "5m")]
    pub max_watch: Duration,

    /// Watch streams one API key may have open on one instance; one more is answered 429 with
    /// Retry-After. Each open stream also counts against --max-in-flight-per-key.
    #[arg(long, env = "SNAPFENCE_MAX_WATCHES_PER_KEY", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_watches_per_key: u32,

    /// Watch streams one instance serves at once, with an API key or without; one more is
    /// answered 429 with Retry-After. Keep it well below --max-connections, so that streams
    /// never take every connection.
    #[arg(long, env = "SNAPFENCE_MAX_WATCHES", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_watches: u32,

    /// How long an instance may go without saying it is alive (it says so four times as often)
    /// before its waiting acquires are passed over: a key released while its first waiter's
    /// instance is frozen goes to the next waiter after this. At least 100ms.
    #[arg(long, env = "SNAPFENCE_WAITER_STALL_BOUND", value_parser = stall_bound, default_value = "1s")]
    pub waiter_stall_bound: Duration,

    /// Waiting acquires of one key one instance holds; one more is answered 429 with
    /// Retry-After, and waits nowhere.
    #[arg(long, env = "SNAPFENCE_MAX_WAITERS_PER_KEY", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters_per_key: u32,

    /// Waiting acquires one instance holds, whatever their keys; one more is answered 429 with
    /// Retry-After and its connection closed. A waiter holds a connection but not a place among
    /// --max-concurrent-requests: keep this well below --max-connections.
    #[arg(long, env = "SNAPFENCE_MAX_WAITERS", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_waiters: u32,

    /// How long a request body may take to arrive before the request is answered 408.
    #[arg(long, env = "SNAPFENCE_BODY_TIMEOUT", value_parser = humantime::parse_duration, default_value = "30s")]
    pub body_timeout: Duration,

    /// Requests one instance serves at once; more are shed at once with 503 and Retry-After.
    #[arg(long, env = "SNAPFENCE_MAX_CONCURRENT_REQUESTS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_requests: u32,

    /// Largest total size of a request's headers in bytes; larger is answered 431.
    #[arg(long, env = "SNAPFENCE_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,

    /// How long a request's head (request line and headers) may take to arrive, counted from
    /// the connection's accept (TLS handshake included) or from the first byte of a later
    /// request on a keep-alive connection; a head that has not arrived by then has its
    /// connection closed.
    #[arg(long, env = "SNAPFENCE_HEAD_TIMEOUT", value_parser = positive_duration, default_value = "10s")]
    pub head_timeout: Duration,

    /// How long a keep-alive connection may idle (no request in flight, nothing sent or
    /// received) before it is closed; also how long a watch stream whose client stopped reading
    /// is kept with nothing sent before it is closed, between two events.
    #[arg(long, env = "SNAPFENCE_IDLE_TIMEOUT", value_parser = positive_duration, default_value = "60s")]
    pub idle_timeout: Duration,

    /// Connections one instance keeps open at once; one more waits in the listen queue, not
    /// accepted, until another closes (lowered at start to what the open-file limit allows).
    #[arg(long, env = "SNAPFENCE_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Requests one API key may have in flight on one instance; one more is answered 429 at
    /// once (never queued). Requests without a key are bounded by --max-concurrent-requests.
    #[arg(long, env = "SNAPFENCE_MAX_IN_FLIGHT_PER_KEY", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight_per_key: u32,

    /// Requests a second one API key may send to one instance, on average (may be below one:
    /// 0.1 is one every 10 s); more are answered 429 with the seconds until the next is allowed.
    /// Off unless set.
    #[arg(long, env = "SNAPFENCE_RATE_LIMIT_PER_KEY", value_parser = positive_rate)]
    pub rate_limit_per_key: Option<f64>,

    /// Requests one API key may send at once after a quiet spell, with --rate-limit-per-key;
    /// without it, one second's worth of the rate (at least one).
    #[arg(
        long,
        env = "SNAPFENCE_RATE_LIMIT_BURST",
        requires = "rate_limit_per_key"
    )]
    pub rate_limit_burst: Option<NonZeroU32>,

    /// Bytes of request bodies one instance holds at once, from their arrival until they are
    /// stored; a body that would pass it is answered 503 (nothing changed) before it is read, or
    /// as it arrives when it announces no length. At least --max-snapshot-bytes.
    #[arg(long, env = "SNAPFENCE_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = 256 * 1024 * 1024)]
    pub max_body_bytes_in_flight: usize,

    /// Serve requests without an API key on a non-loopback address while no key exists.
    #[arg(long, env = "SNAPFENCE_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,

    /// How long start-up waits for the database while it cannot be reached (connections refused
    /// or dropped, a standby not yet promoted), retrying with backoff, before it gives up.
    #[arg(long, env = "SNAPFENCE_STARTUP_TIMEOUT", value_parser = positive_duration, default_value = "2m")]
    pub startup_timeout: Duration,

    /// Database connections per instance.
    #[arg(long, env = "SNAPFENCE_DB_POOL_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub db_pool_size: u32,

    /// Hot connections opened as the instance starts, each with every hot statement planned, so
    /// that a burst right after start does not wait for connections and plans (0: opened as load
    /// needs them). At most --db-pool-size; through a pooler none are opened ahead.
    #[arg(long, env = "SNAPFENCE_DB_POOL_WARM", default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub db_pool_warm: u32,

    /// The bound on a request's database work in all, from its arrival (from its body's, for one
    /// with a body): then it is answered 503. PostgreSQL's own statement and lock timeouts are a
    /// fifth shorter, at most a second, so that it cancels (and says so) first.
    #[arg(long, env = "SNAPFENCE_DB_TIMEOUT", value_parser = humantime::parse_duration, default_value = "5s")]
    pub db_timeout: Duration,
}

impl ServeConfig {
    /// The rules the HTTP layer enforces.
    pub fn rules(&self) -> Rules {
        Rules {
            ttl_bounds: TtlBounds {
                min: self.min_ttl,
                max: self.max_ttl,
            },
            keep_versions: self.keep_versions,
            max_snapshot_bytes: self.max_snapshot_bytes,
            max_txn_ops: self.max_txn_ops as usize,
            max_txn_prefix_keys: self.max_txn_prefix_keys,
            audit_retention: self.audit_retention,
            idempotency_retention: self.idempotency_retention,
            body_timeout: self.body_timeout,
            max_wait: self.max_wait,
            watch_retention: self.watch_retention,
            watch_heartbeat: self.watch_heartbeat,
            max_watch: self.max_watch,
            max_watches_per_key: self.max_watches_per_key as usize,
            max_watches: self.max_watches as usize,
            waiter_stall_bound: self.waiter_stall_bound,
            max_waiters_per_key: self.max_waiters_per_key as usize,
            max_waiters: self.max_waiters as usize,
            max_concurrent_requests: self.max_concurrent_requests as usize,
            max_header_bytes: self.max_header_bytes,
            head_timeout: self.head_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections as usize,
            anonymous_without_keys: self.listen.ip().is_loopback() || self.insecure_no_auth,
            max_in_flight_per_key: self.max_in_flight_per_key as usize,
            rate_limit_per_key: self.rate_limit_per_key.map(|per_second| RateLimit {
                per_second,
                burst: self
                    .rate_limit_burst
                    .unwrap_or_else(|| one_seconds_worth(per_second)),
            }),
            max_body_bytes_in_flight: self.max_body_bytes_in_flight,
        }
    }

    /// Refuses options that contradict each other, saying which to change.
    pub fn check(&self) -> Result<(), String> {
        let largest = self.max_snapshot_bytes.max(MAX_JSON_BYTES);
        if self.max_body_bytes_in_flight < largest {
            return Err(format!(
                "--max-body-bytes-in-flight {} is below the largest body a request may send ({largest} bytes, from --max-snapshot-bytes or a lease request's limit), which could then never be received; raise it, or lower --max-snapshot-bytes",
                self.max_body_bytes_in_flight
            ));
        }
        if self.idempotency_retention < MIN_IDEMPOTENCY_RETENTION {
            return Err(format!(
                "--idempotency-retention {} is below {}: a client still retrying a call would find its answer gone and the change done again; keep it at least that long (the default is 24h)",
                humantime::format_duration(self.idempotency_retention),
                humantime::format_duration(MIN_IDEMPOTENCY_RETENTION)
            ));
        }
        Ok(())
    }

    /// How the store talks to the database.
    pub fn db(&self) -> DbSettings {
        DbSettings {
            pool_size: self.db_pool_size,
            timeout: self.db_timeout,
        }
    }
}

const MAX_RATE: f64 = 1e9;

fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate > 0.0 && rate <= MAX_RATE => Ok(rate),
        Ok(_) => Err(format!(
            "must be above 0 and at most {MAX_RATE} (leave the option out for no limit)"
        )),
        Err(e) => Err(format!(
            "{e}: write a number of requests a second, like 50 or 0.5"
        )),
    }
}

fn one_seconds_worth(per_second: f64) -> NonZeroU32 {
    NonZeroU32::new(per_second.ceil() as u32).unwrap_or(NonZeroU32::MIN)
}

/// A zero head or idle timeout would close every connection at once.
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d.is_zero() => Err("must be above zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

fn heartbeat(text: &str) -> Result<Duration, String> {
    let d = positive_duration(text)?;
    if d > Duration::from_secs(15) {
        return Err(
            "must be at most 15s, the longest the contract lets a watch stay silent".into(),
        );
    }
    Ok(d)
}

/// At least 100 ms, so an instance's heartbeat (a quarter of it) stays cheap.
fn stall_bound(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(100) {
        return Err("must be at least 100ms".into());
    }
    Ok(d)
}

fn max_wait(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d > Duration::from_millis(snapfence_types::MAX_WAIT_MS as u64) {
        return Err("must be at most 5m, the longest wait the contract allows".into());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use clap::{ArgAction, Args, Command};

    use super::ServeConfig;

    fn table_row(flag: &str) -> Option<&'static str> {
        let guide = include_str!("../docs/operations.md");
        let name = format!("`--{flag}`");
        guide
            .lines()
            .filter(|l| l.starts_with("| `--"))
            .find(|l| l.split(" | ").next().is_some_and(|f| f.contains(&name)))
    }

    #[test]
    fn every_serve_option_is_in_the_configuration_table_with_its_default() {
        let command = ServeConfig::augment_args(Command::new("serve"));
        for arg in command.get_arguments() {
            let Some(flag) = arg.get_long() else { continue };
            let row = table_row(flag)
                .unwrap_or_else(|| panic!("--{flag} is not in the table of docs/operations.md"));
            if arg.is_hide_default_value_set() || matches!(arg.get_action(), ArgAction::SetTrue) {
                continue;
            }
            for default in arg.get_default_values() {
                let default = format!("`{}`", default.to_string_lossy());
                assert!(row.contains(&default), "--{flag}: {default} not in {row}");
            }
        }
    }
}
