//! A private PostgreSQL cluster from the machine's binaries, for `serve` without `DATABASE_URL` and
//! for the tests; run as `postgres` (or `nobody`) when we are root. Its tools (`tools.rs`), its
//! data directory (`dir.rs`) and a running server (`lifecycle.rs`) each have a module.

mod dir;
mod lifecycle;
mod tools;

use std::fs;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

use dir::{check_reachable, unprivileged_user};
use tools::PipeToLog;
pub use tools::find_binaries;

const SUPERUSER: &str = "postgres";
const PORT: u16 = 5432;
const MAX_SOCKET_DIR: usize = 107 - ".s.PGSQL.65535".len() - 1;
const PGDATA: &str = "pg";

fn holds_cluster(pgdata: &Path) -> bool {
    pgdata.join("PG_VERSION").is_file()
}

/// Why the embedded cluster could not be started or stopped. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// No PostgreSQL server binaries were found.
    #[error(
        "no PostgreSQL server binaries found (initdb, pg_ctl on PATH or under /usr/lib/postgresql/*/bin). \
         Install them (Debian/Ubuntu: `apt-get install postgresql`), or point snapfence at a running \
         server with DATABASE_URL=postgres://user:pass@host/db"
    )]
    NoBinaries,
    /// Running as root, and no unprivileged user to run PostgreSQL as.
    #[error(
        "PostgreSQL refuses to run as root and there is no `postgres` or `nobody` user to run it as; \
         create one (`useradd postgres`) or run snapfence as an unprivileged user"
    )]
    NoUser,
    /// Running as root, a directory above the data directory is closed to PostgreSQL's user.
    #[error(
        "PostgreSQL refuses to run as root, so snapfence runs it as the `{user}` user, who cannot \
         enter {dir} (mode {mode:o}, owned by {owner}), above --data-dir {data_dir}. Let it \
         search that directory (`chmod o+x {dir}`), or choose a --data-dir that it can reach \
         (as root, the default is /var/lib/snapfence)"
    )]
    Unsearchable {
        /// The first directory on the way that the user cannot search.
        dir: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner's name (or uid).
        owner: String,
        /// The user PostgreSQL runs as.
        user: String,
        /// The data directory asked for.
        data_dir: PathBuf,
    },
    /// The data directory's path is too long for a Unix socket.
    #[error(
        "the data directory {0} is too long for a Unix socket path ({MAX_SOCKET_DIR} bytes at most); \
         choose a shorter --data-dir"
    )]
    PathTooLong(PathBuf),
    /// The data directory holds something that is not a cluster of ours.
    #[error(
        "{0} exists and is not a snapfence data directory; choose another --data-dir or empty it"
    )]
    NotOurs(PathBuf),
    /// A PostgreSQL tool failed.
    #[error("{tool} failed ({status}); see {log} for PostgreSQL's own account")]
    Tool {
        /// The tool.
        tool: &'static str,
        /// Its exit status.
        status: String,
        /// Where its output went.
        log: PathBuf,
    },
    /// A file operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Creating the service's database failed.
    #[error("creating the database in the embedded cluster failed: {0}")]
    Database(#[from] sqlx::Error),
}

type Result<T, E = EmbeddedError> = std::result::Result<T, E>;

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedError {
    let path = path.to_path_buf();
    move |source| EmbeddedError::Io { what, path, source }
}

/// Settings written to the cluster's `snapfence.conf` at every start.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Extra `name = value` lines (values already quoted as PostgreSQL wants them).
    pub extra: Vec<(String, String)>,
    /// Also listen on `127.0.0.1` at this port, for a proxy; the service needs only the socket.
    pub tcp_port: Option<u16>,
}

/// A running embedded cluster.
#[derive(Debug)]
pub struct EmbeddedPostgres {
    dir: PathBuf,
    bin: PathBuf,
    run_as: Option<(Uid, Gid)>,
    tcp_port: Option<u16>,
}

impl EmbeddedPostgres {
    /// Starts (or creates, or adopts) the cluster in `dir`; returns once it accepts connections.
    pub fn start(dir: &Path, settings: &Settings) -> Result<Self> {
        let this = Self::at(dir, settings)?;
        let pgdata = this.pgdata();
        if !holds_cluster(&pgdata) {
            tracing::info!(dir = %this.dir.display(), "creating a PostgreSQL cluster (initdb)");
            this.tool("initdb")
                .arg("-D")
                .arg(&pgdata)
                .args(["-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C"])
                .pipe_to_log(&this)?;
            let conf = pgdata.join("postgresql.conf");
            let mut text = fs::read_to_string(&conf).map_err(io_err("reading", &conf))?;
            text.push_str("\ninclude_if_exists = 'snapfence.conf'\n");
            fs::write(&conf, text).map_err(io_err("writing", &conf))?;
        }
        this.launch(settings)
    }

    /// Makes `dir` a streaming standby of `upstream` with `pg_basebackup -R`, and starts it.
    pub fn start_standby(dir: &Path, upstream: &str, settings: &Settings) -> Result<Self> {
        let this = Self::at(dir, settings)?;
        let pgdata = this.pgdata();
        if !holds_cluster(&pgdata) {
            tracing::info!(dir = %this.dir.display(), "copying a standby (pg_basebackup)");
            this.tool("pg_basebackup")
                .arg("-D")
                .arg(&pgdata)
                .args(["-R", "-X", "stream", "-c", "fast", "-d", upstream])
                .pipe_to_log(&this)?;
        }
        this.launch(settings)
    }

    fn at(dir: &Path, settings: &Settings) -> Result<Self> {
        let bin = find_binaries()?;
        let run_as = unprivileged_user()?;
        if let Some((uid, gid)) = run_as {
            check_reachable(dir, uid, gid)?;
        }
        fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
        let dir = fs::canonicalize(dir).map_err(io_err("resolving", dir))?;
        if dir.as_os_str().len() > MAX_SOCKET_DIR {
            return Err(EmbeddedError::PathTooLong(dir));
        }
        let this = Self {
            dir,
            bin,
            run_as,
            tcp_port: settings.tcp_port,
        };
        this.prepare_dir()?;
        Ok(this)
    }

    /// Whether `dir` holds a cluster, running or not, touching nothing.
    pub fn exists_at(dir: &Path) -> bool {
        holds_cluster(&dir.join(PGDATA))
    }

    /// The cluster of `dir` if a server already runs there, without starting one.
    pub fn running_at(dir: &Path) -> Result<Option<Self>> {
        let this = Self::at(dir, &Settings::default())?;
        Ok(this.running().then_some(this))
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where PostgreSQL logs.
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    fn pgdata(&self) -> PathBuf {
        self.dir.join(PGDATA)
    }

    /// Connection options for `database` as the superuser, over the Unix socket.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.dir)
            .port(self.port())
            .username(SUPERUSER)
            .database(database)
    }

    /// A `postgres://` URL for `database`, for tools such as `psql` and `pgbench`.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@localhost:{}/{database}?host={}",
            self.port(),
            self.dir.display()
        )
    }

    /// A libpq connection string over the Unix socket, as a standby's upstream.
    pub fn conninfo(&self) -> String {
        format!(
            "host={} port={} user={SUPERUSER}",
            self.dir.display(),
            self.port()
        )
    }

    /// The port: the TCP port when there is one, else the number in the socket file's name.
    pub fn port(&self) -> u16 {
        self.tcp_port.unwrap_or(PORT)
    }

    /// Creates `database` unless it exists.
    pub async fn ensure_database(&self, database: &str) -> Result<()> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres")).await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(database)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            let quoted = database.replace('"', "\"\"");
            sqlx::query(&format!("CREATE DATABASE \"{quoted}\""))
                .execute(&mut conn)
                .await?;
        }
        conn.close().await?;
        Ok(())
    }
}
