//! The real parts a scenario runs: PostgreSQL clusters (a primary, a streaming standby) started
//! from the local binaries in throwaway directories, and `snapfence serve` processes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;
use snapfence::embedded::{EmbeddedPostgres, Settings};

/// The database the services keep their tables in.
pub const DATABASE: &str = "snapfence";

/// How long a service waits for the database before it answers 503: short, so that outages
/// show as answers rather than as client timeouts.
pub const DB_TIMEOUT: &str = "1s";

/// Every snapshot version is kept, so that the checker can tell a superseded write from a lost
/// one; no scenario writes this many times to one key.
pub const KEEP_VERSIONS: i64 = 10_000;

pub use snapfence_testkit::harness::free_port;

/// A scenario's scratch directory (short: it holds Unix sockets), removed when dropped.
pub fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sf-faults-")
        .tempdir_in("/tmp")
        .expect("a scratch directory")
}

/// Runs blocking work (a PostgreSQL tool) without stalling the workload's tasks.
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// How a cluster is set up.
pub struct ClusterSpec {
    /// Listen on a loopback TCP port too (needed behind a proxy).
    pub tcp: bool,
    /// Extra `postgresql.conf` lines.
    pub extra: Vec<(&'static str, String)>,
}

impl ClusterSpec {
    fn settings(&self) -> Settings {
        let mut extra = vec![
            // A crash here is `pg_ctl stop -m immediate`: processes die, the kernel keeps what
            // they wrote, so fsync adds nothing the scenarios test (power loss is not one).
            ("fsync".to_owned(), "off".to_owned()),
            ("max_connections".to_owned(), "100".to_owned()),
            ("shared_buffers".to_owned(), "'32MB'".to_owned()),
        ];
        extra.extend(self.extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        Settings {
            extra,
            tcp_port: self.tcp.then(free_port),
        }
    }
}

/// A PostgreSQL cluster in its own directory. Dropping it stops the server at once; a watchdog
/// does the same if the test process dies first.
pub struct Cluster {
    /// The server.
    pub pg: EmbeddedPostgres,
    settings: Settings,
}

impl Cluster {
    /// A new primary with the service's database created.
    pub async fn primary(dir: &Path, spec: &ClusterSpec) -> Self {
        let settings = spec.settings();
        let pg = blocking(|| EmbeddedPostgres::start(dir, &settings)).expect("starting a cluster");
        // Owned before anything else can fail, so that a failure stops the server on drop.
        let cluster = Self { pg, settings };
        cluster
            .pg
            .remove_when_process_exits(std::process::id())
            .expect("a watchdog for the cluster");
        cluster
            .pg
            .ensure_database(DATABASE)
            .await
            .expect("creating the database");
        cluster
    }

    /// A streaming standby of whatever server `upstream` (a libpq connection string) reaches.
    pub fn standby(dir: &Path, upstream: &str, spec: &ClusterSpec) -> Self {
        let settings = spec.settings();
        let pg = blocking(|| EmbeddedPostgres::start_standby(dir, upstream, &settings))
            .expect("starting a standby");
        let cluster = Self { pg, settings };
        cluster
            .pg
            .remove_when_process_exits(std::process::id())
            .expect("a watchdog for the standby");
        cluster
    }

    /// The TCP address (the cluster must have been made with `tcp`).
    pub fn tcp_addr(&self) -> SocketAddr {
        let port = self.settings.tcp_port.expect("a cluster with a TCP port");
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// The service's database over the Unix socket.
    pub fn url(&self) -> String {
        self.pg.url(DATABASE)
    }

    /// `pg_ctl stop -m immediate`: a crash.
    pub fn crash(&self) {
        blocking(|| self.pg.stop_immediately()).expect("stopping the cluster");
    }

    /// Starts the server again after a crash; it recovers from its WAL.
    pub fn restart(&mut self) {
        let dir = self.pg.dir().to_path_buf();
        self.pg = blocking(|| EmbeddedPostgres::start(&dir, &self.settings))
            .expect("restarting the cluster");
    }

    /// Promotes a standby; returns once it accepts writes.
    pub fn promote(&self) {
        blocking(|| self.pg.promote()).expect("promoting the standby");
    }

    async fn connect(&self) -> sqlx::PgConnection {
        use sqlx::Connection;
        sqlx::PgConnection::connect_with(&self.pg.connect_options(DATABASE))
            .await
            .expect("connecting to the cluster")
    }

    /// SIGSTOP to the postmaster and every process it forked (each session's backend, the
    /// background workers): the whole server freezes, with whatever statements and commits it
    /// has in flight, as on a stalled disk or a paused VM. The postmaster cannot fork while
    /// stopped, so no process escapes.
    pub fn freeze(&self) {
        self.signal_all(Signal::SIGSTOP);
    }

    /// SIGCONT to the same processes: the server goes on where it stood.
    pub fn thaw(&self) {
        self.signal_all(Signal::SIGCONT);
    }

    fn signal_all(&self, signal: Signal) {
        signal_server(self.pg.pid().expect("a running cluster"), signal);
    }

    /// One value of a query on the service's database, straight from the server.
    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&mut self.connect().await)
            .await
            .expect("the query")
    }

    /// Runs one statement on the service's database, straight on the server.
    pub async fn execute(&self, sql: &str) {
        use sqlx::Executor;
        self.connect()
            .await
            .execute(sql)
            .await
            .expect("the statement");
    }
}

impl Drop for Cluster {
    // Never panics: a drop runs while a failed scenario unwinds too, and a second panic would
    // abort the whole binary.
    fn drop(&mut self) {
        // A frozen server would take the stop only after pg_ctl's wait ran out.
        if let Some(postmaster) = self.pg.pid() {
            try_signal_server(postmaster, Signal::SIGCONT).ok();
        }
        self.pg.stop_immediately().ok();
    }
}

/// Sends `signal` to a PostgreSQL server: its postmaster, then every process it forked. With
/// SIGSTOP the postmaster stops first, so that it cannot fork a process that escapes. Panics if
/// the postmaster is gone; cleanup uses [`try_signal_server`].
pub fn signal_server(postmaster: i32, signal: Signal) {
    try_signal_server(postmaster, signal)
        .unwrap_or_else(|e| panic!("signalling the postmaster {postmaster} with {signal}: {e}"));
}

/// [`signal_server`], with the postmaster's failure returned (ESRCH once it has exited).
pub fn try_signal_server(postmaster: i32, signal: Signal) -> nix::Result<()> {
    kill(Pid::from_raw(postmaster), signal)?;
    for child in children_of(postmaster) {
        // A backend may have exited since it was listed.
        kill(Pid::from_raw(child), signal).ok();
    }
    Ok(())
}

/// The processes whose parent is `parent`, from `/proc`.
pub fn children_of(parent: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so the fields
            // are counted from the last `)`.
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

/// A PostgreSQL URL of the service's database at a TCP address (a proxy, usually).
pub fn tcp_url(addr: SocketAddr) -> String {
    format!("postgres://postgres@{addr}/{DATABASE}")
}

/// A `snapfence serve` process on a fixed loopback port, so that it can be killed and started
/// again where its clients expect it.
pub struct Service {
    child: Option<Child>,
    port: u16,
    url: String,
    log: PathBuf,
    broken_fencing: bool,
    /// Arguments added to `serve`'s, on every start.
    args: Vec<String>,
}

impl Service {
    /// Starts the binary on `url` and waits until it is ready. `broken_fencing` turns on the
    /// negative control (the `fault-controls` feature, which the test builds have; see
    /// `store::snapshots::fencing_broken`).
    pub async fn start(url: &str, dir: &Path, broken_fencing: bool) -> Self {
        Self::start_with(url, dir, broken_fencing, &[]).await
    }

    /// [`start`](Self::start) with `args` added to `serve`'s.
    pub async fn start_with(url: &str, dir: &Path, broken_fencing: bool, args: &[&str]) -> Self {
        let port = free_port();
        let mut service = Self {
            child: None,
            port,
            url: url.to_owned(),
            log: dir.join(format!("serve-{port}.log")),
            broken_fencing,
            args: args.iter().map(|&a| a.to_owned()).collect(),
        };
        service.spawn().await;
        service
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the service's log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_snapfence"));
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--database-url", &self.url])
            .args(["--db-timeout", DB_TIMEOUT, "--db-pool-size", "8"])
            .args(["--min-ttl", "10ms"])
            .args(["--keep-versions", &KEEP_VERSIONS.to_string()])
            .args(&self.args)
            .env("RUST_LOG", "warn")
            .env_remove("SNAPFENCE_BREAK_FENCING")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        if self.broken_fencing {
            cmd.env("SNAPFENCE_BREAK_FENCING", "written-token");
        }
        let child = cmd.spawn().expect("starting snapfence serve");
        watch_over(child.id());
        self.child = Some(child);
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let http = reqwest::Client::new();
        loop {
            let ready = http
                .get(format!("{}/readyz", self.base()))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if ready.is_ok_and(|r| r.status() == StatusCode::OK) {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                // Reaped: its number may be reused, so no later signal may go to it.
                self.child = None;
                panic!(
                    "snapfence serve exited ({status}): {}",
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "snapfence serve did not get ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends `signal` to the process; `Err` (ESRCH) once it has exited and been reaped.
    fn signal(&self, signal: Signal) -> nix::Result<()> {
        match &self.child {
            Some(child) => kill(Pid::from_raw(child.id() as i32), signal),
            None => Ok(()),
        }
    }

    /// SIGSTOP: the process freezes with whatever requests it has in flight.
    pub fn pause(&self) {
        self.signal(Signal::SIGSTOP)
            .unwrap_or_else(|e| panic!("pausing the service: {e}; see {}", self.log.display()));
    }

    /// SIGCONT: the frozen requests go on.
    pub fn resume(&self) {
        self.signal(Signal::SIGCONT)
            .unwrap_or_else(|e| panic!("resuming the service: {e}; see {}", self.log.display()));
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }

    /// Starts the binary again on the same port.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

/// A detached shell that kills the service `pid` once the test process has exited, however it
/// exits: [`Drop`] does it when the test ends, this when the process is killed first. The
/// service's command name is checked, since its number may have been reused by then.
fn watch_over(pid: u32) {
    detached_watchdog(
        &format!(
            "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
             [ \"$(cat /proc/{pid}/comm 2>/dev/null)\" = snapfence ] && kill -CONT {pid} && kill -KILL {pid}",
            me = std::process::id()
        ),
        "the service's watchdog",
    );
}

/// Runs the shell `script` detached from the test (its own process group, no stdio), so that
/// it outlives a test process that is killed: what [`watch_over`] and the Patroni stack's
/// watchdog stop their processes with.
#[allow(
    clippy::zombie_processes,
    reason = "the watchdog must outlive this process; init reaps it"
)]
pub fn detached_watchdog(script: &str, what: &str) {
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
}

impl Drop for Service {
    // Never panics (see `Cluster`'s drop): a process that is gone is already stopped.
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT).ok();
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_whose_process_was_reaped_drops_without_panicking() {
        let mut child = Command::new("true").spawn().expect("running `true`");
        child.wait().expect("reaping it");
        let service = Service {
            child: Some(child),
            port: free_port(),
            url: String::new(),
            log: PathBuf::from("/dev/null"),
            broken_fencing: false,
            args: Vec::new(),
        };
        assert!(
            service.signal(Signal::SIGCONT).is_err(),
            "a reaped process takes no signal"
        );
        drop(service);
    }
}
