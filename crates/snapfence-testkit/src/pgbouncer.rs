//! A real PgBouncer (Debian's `pgbouncer`, `/usr/sbin/pgbouncer`) in transaction pooling mode,
//! on a free loopback port in front of the test cluster: what production puts between the
//! service and PostgreSQL, for the tests that go through it and for its fault scenario
//! ([`PgBouncer::restart`] kills it under load).
//!
//! Every database name passes through to the upstream cluster (`[databases] * = …`); clients
//! log in as the upstream's user without a password (`auth_type = trust`), and PgBouncer logs in
//! to the cluster as that user, with the password of [`upstream_password`] if the cluster asks.
//!
//! In transaction mode a client has a server connection only for the length of a transaction:
//! what it does must not outlive one. Through sqlx that means statements that are not prepared
//! for keeps (`.persistent(false)`; PgBouncer 1.18 does not track prepared statements), and an
//! explicit transaction around a statement that the extended protocol sends in more than one
//! round trip.
//!
//! The process is killed (SIGKILL) and its scratch directory removed when the value is dropped,
//! and by a watchdog ([`PgBouncer::kill_when_process_exits`]) if the test process dies first.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::unistd::{Gid, Uid, User};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::{ConnectOptions, Connection, Executor, PgConnection};
use tempfile::TempDir;

use crate::harness::{enc, free_port};

/// Server connections PgBouncer keeps at most per database and user (`default_pool_size`),
/// opened only as clients need them. With a database per test, a pool is one test's: the test
/// cluster's `max_connections` (400) has room for many at once beside the tests' direct
/// connections.
pub const POOL_SIZE: usize = 20;

/// Client connections one PgBouncer accepts (`max_client_conn`).
pub const MAX_CLIENTS: usize = 2000;

/// How long PgBouncer may take to accept a connection after it was started: it does in
/// milliseconds, however loaded the machine.
const STARTUP: Duration = Duration::from_secs(10);

/// A running PgBouncer; killed, and its directory removed, when dropped.
pub struct PgBouncer {
    /// The scratch directory: configuration, user list, log, and the process id the watchdog
    /// reads.
    dir: TempDir,
    port: u16,
    user: String,
    password: Option<String>,
    /// The database the readiness check connects to.
    probe: String,
    run_as: Option<(Uid, Gid)>,
    child: Option<Child>,
}

impl PgBouncer {
    /// Starts PgBouncer in front of the cluster of `upstream` (its Unix socket directory, or
    /// host, and port, and its user; the database is any the client names), and waits until a
    /// client gets through it to the cluster. Fails, with PgBouncer's log, if none does within
    /// 10 s.
    ///
    /// Blocking (the check runs on a thread of its own, so an async caller's runtime does not
    /// wait on itself). [`Drop`] stops the process; for a PgBouncer that is never dropped (a
    /// static's) or a test process that is killed, a watchdog is started first that stops it
    /// once this process exits (see [`PgBouncer::kill_when_process_exits`]).
    pub fn start(upstream: &PgConnectOptions) -> io::Result<Self> {
        let bin = binary()?;
        let run_as = run_as()?;
        let dir = tempfile::Builder::new().prefix("sf-pgbouncer-").tempdir()?;
        let user = upstream.get_username().to_string();
        let password = upstream_password();
        let port = free_port();
        // Unix sockets are off (`unix_socket_dir` empty): clients come over TCP, and the
        // upstream's socket directory is named in full as its host.
        let server = upstream.get_socket().map_or_else(
            || upstream.get_host().to_string(),
            |s| s.display().to_string(),
        );
        let config = format!(
            ";; Written by snapfence-testkit (pgbouncer.rs) for one test.\n\
             [databases]\n\
             * = host={server} port={upstream_port}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             pool_mode = transaction\n\
             auth_type = trust\n\
             auth_file = {auth_file}\n\
             ignore_startup_parameters = extra_float_digits\n\
             max_client_conn = {MAX_CLIENTS}\n\
             default_pool_size = {POOL_SIZE}\n",
            server = conn_value(&server),
            upstream_port = upstream.get_port(),
            auth_file = dir.path().join("userlist.txt").display(),
        );
        // Even with `auth_type = trust`, PgBouncer knows only the users of its `auth_file`; the
        // password there is what it logs in to the server with.
        let users = format!(
            "{} {}\n",
            quoted(&user),
            quoted(password.as_deref().unwrap_or(""))
        );
        for (name, text) in [("pgbouncer.ini", config), ("userlist.txt", users)] {
            let path = dir.path().join(name);
            fs::write(&path, text)?;
            own(&path, run_as, 0o600)?;
        }
        own(dir.path(), run_as, 0o700)?;
        let mut this = Self {
            probe: upstream.get_database().unwrap_or("postgres").to_string(),
            dir,
            port,
            user,
            password,
            run_as,
            child: None,
        };
        // Before the process, so that no moment goes unwatched.
        this.kill_when_process_exits(std::process::id())?;
        this.spawn(&bin)?;
        this.until_accepting()?;
        Ok(this)
    }

    /// Kills PgBouncer (SIGKILL: every client connection breaks, and every transaction in
    /// flight through it is rolled back by the server) and starts it again on the same port
    /// with the same configuration; returns once a client gets through it again. Blocking, as
    /// [`PgBouncer::start`] is.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn(&binary()?)?;
        self.until_accepting()
    }

    /// Starts a detached watchdog that kills PgBouncer (whichever process runs it then, after
    /// any restart) and removes its directory once process `pid` (the test process) has exited,
    /// however it exits: what [`Drop`] does, for when it cannot. The watchdog ends by itself
    /// once the directory is gone. [`PgBouncer::start`] has started one for this process; this
    /// is for another (a parent that outlives it, say).
    pub fn kill_when_process_exits(&self, pid: u32) -> io::Result<()> {
        let dir = self.dir.path().display().to_string().replace('\'', r"'\''");
        let script = format!(
            "while kill -0 {pid} 2>/dev/null && [ -d '{dir}' ]; do sleep 0.5; done; \
             [ -d '{dir}' ] || exit 0; \
             p=$(cat '{dir}/pid' 2>/dev/null); \
             if [ -n \"$p\" ] && [ \"$(cat /proc/$p/comm 2>/dev/null)\" = pgbouncer ]; then \
               kill -KILL \"$p\"; \
             fi; \
             rm -rf '{dir}'"
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map(drop)
    }

    /// Connection options for `database` through PgBouncer, as the upstream's user.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username(&self.user)
            .database(database)
            .ssl_mode(PgSslMode::Disable)
            .disable_statement_logging();
        match &self.password {
            Some(password) => options.password(password),
            None => options,
        }
    }

    /// A `postgres://` URL for `database` through PgBouncer (without the password: a client
    /// logs in to PgBouncer without one).
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{database}?sslmode=disable",
            enc(&self.user),
            self.port
        )
    }

    /// The loopback port PgBouncer listens on (the same across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id of the running PgBouncer (another after a restart).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The scratch directory (configuration, user list, log), removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// What PgBouncer has logged, over every start.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_else(|e| format!("(no log: {e})"))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("pgbouncer.log")
    }

    /// Starts the process, in the foreground (its process id is the one started here), its
    /// output appended to the log.
    fn spawn(&mut self, bin: &Path) -> io::Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new(bin);
        cmd.arg(self.dir.path().join("pgbouncer.ini"))
            // Where the unprivileged user may be: not necessarily the tests' own directory.
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        let child = cmd
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("starting {}: {e}", bin.display())))?;
        // The watchdog kills whichever process this file names.
        fs::write(self.dir.path().join("pid"), child.id().to_string())?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until a client gets through PgBouncer to the server and back: a connection and a
    /// query, tried every 50 ms for at most [`STARTUP`], on a thread and a runtime of its own.
    fn until_accepting(&mut self) -> io::Result<()> {
        let options = self.connect_options(&self.probe);
        let port = self.port;
        let Some(child) = self.child.as_mut() else {
            return Err(io::Error::other("PgBouncer is not running"));
        };
        let outcome = std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| format!("a runtime to wait for PgBouncer: {e}"))?;
                    runtime.block_on(accepting(child, &options, port))
                })
                .join()
                .unwrap_or_else(|_| Err("the wait for PgBouncer panicked".into()))
        });
        outcome.map_err(|what| self.failed(&what))
    }

    /// An error saying what failed, with PgBouncer's configuration and log.
    fn failed(&self, what: &str) -> io::Error {
        let config = fs::read_to_string(self.dir.path().join("pgbouncer.ini")).unwrap_or_default();
        io::Error::other(format!(
            "{what}\n--- pgbouncer.ini:\n{config}--- pgbouncer.log:\n{}",
            self.log()
        ))
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // The directory goes with `dir`, after this.
        self.kill();
    }
}

/// Waits until a client gets through PgBouncer on `port`, or it exits, or [`STARTUP`] passes.
async fn accepting(child: &mut Child, options: &PgConnectOptions, port: u16) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + STARTUP;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("PgBouncer exited ({status})"));
        }
        let attempt = tokio::time::timeout(Duration::from_secs(2), async {
            let mut conn = PgConnection::connect_with(options).await?;
            conn.execute("SELECT 1").await?;
            conn.close().await
        })
        .await;
        let last = match attempt {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer within 2 s".to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "PgBouncer did not let a client through on 127.0.0.1:{port} within {STARTUP:?} \
                 (the last attempt: {last})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The password PgBouncer logs in to the upstream with, if it asks for one, as sqlx finds it
/// for the harness's cluster: the one in `DATABASE_URL` (an external test cluster's), else
/// `PGPASSWORD`. (sqlx's options keep theirs to themselves.)
pub fn upstream_password() -> Option<String> {
    let in_url = std::env::var("DATABASE_URL")
        .ok()
        .and_then(|url| reqwest::Url::parse(&url).ok())
        .and_then(|url| url.password().map(decode));
    in_url.or_else(|| std::env::var("PGPASSWORD").ok())
}

/// PgBouncer's binary: on `PATH`, or in the `sbin` directories a non-root `PATH` may lack.
fn binary() -> io::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("pgbouncer"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "pgbouncer not found (on PATH or in /usr/sbin): the tests through a pooler run \
                 Debian's pgbouncer. Install it: `apt-get install -y pgbouncer`, which \
                 `scripts/test --packages` does as root",
            )
        })
}

/// The user PgBouncer runs as: `postgres` when the tests run as root (PgBouncer refuses root),
/// else the tests' own user.
fn run_as() -> io::Result<Option<(Uid, Gid)>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let user = User::from_name("postgres").ok().flatten().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "running as root, PgBouncer is run as the `postgres` user (it refuses root), and \
             there is none: `useradd --system postgres` (which `scripts/test` does)",
        )
    })?;
    Ok(Some((user.uid, user.gid)))
}

/// Gives `path` to the user PgBouncer runs as, with `mode`.
fn own(path: &Path, run_as: Option<(Uid, Gid)>, mode: u32) -> io::Result<()> {
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(path, Some(uid.as_raw()), Some(gid.as_raw()))?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// A field of PgBouncer's `auth_file`: in double quotes, a double quote doubled.
fn quoted(field: &str) -> String {
    format!("\"{}\"", field.replace('"', "\"\""))
}

/// A value of a `[databases]` connection string, quoted if it needs to be (PgBouncer's quotes
/// are single, a quote in them doubled).
fn conn_value(value: &str) -> String {
    if !value.is_empty() && !value.contains([' ', '\'']) {
        return value.to_string();
    }
    format!("'{}'", value.replace('\'', "''"))
}

/// Percent-decodes a URL's password.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_password_is_percent_decoded() {
        assert_eq!(decode("p%40ss%2Fw%25rd"), "p@ss/w%rd");
        assert_eq!(decode("plain%zz%4"), "plain%zz%4");
    }

    #[test]
    fn auth_file_fields_and_connection_values_are_quoted() {
        assert_eq!(quoted(r#"a"b"#), r#""a""b""#);
        assert_eq!(conn_value("/tmp/sf-test-x"), "/tmp/sf-test-x");
        assert_eq!(conn_value("/tmp/a b"), "'/tmp/a b'");
        assert_eq!(conn_value("it's"), "'it''s'");
    }
}
