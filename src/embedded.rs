//! A private PostgreSQL cluster from the machine's binaries, for `serve` without `DATABASE_URL` and
//! for the tests; run as `postgres` (or `nobody`) when we are root.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::unistd::{Gid, Uid, User};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection};

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

/// The directory of `initdb` and `pg_ctl`: on `PATH`, else the newest in `/usr/lib/postgresql`.
pub fn find_binaries() -> Result<PathBuf> {
    let has_tools = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|t| dir.join(t).is_file())
    };
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|d| has_tools(d)) {
            let real = fs::canonicalize(dir.join("initdb"))
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf))
                .filter(|d| has_tools(d));
            return Ok(real.unwrap_or(dir));
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse().ok()?;
            Some((major, e.path().join("bin")))
        })
        .filter(|(_, bin)| has_tools(bin))
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or(EmbeddedError::NoBinaries)
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

    fn launch(self, settings: &Settings) -> Result<Self> {
        let pgdata = self.pgdata();
        self.write_settings(settings)?;
        if self.running() {
            tracing::warn!(dir = %self.dir.display(), "adopting a PostgreSQL server left running by an earlier process");
        } else {
            self.tool("pg_ctl")
                .arg("-D")
                .arg(&pgdata)
                .arg("-l")
                .arg(self.log_path())
                .args(["-w", "-t", "120", "start"])
                .pipe_to_log(&self)?;
        }
        Ok(self)
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

    /// Stops the server in `fast` mode: nothing committed is lost.
    pub fn stop(&self) -> Result<()> {
        self.stop_in("fast")
    }

    /// Stops the server as a crash would (`immediate`); the next start recovers from the WAL.
    pub fn stop_immediately(&self) -> Result<()> {
        self.stop_in("immediate")
    }

    fn stop_in(&self, mode: &str) -> Result<()> {
        if !self.running() {
            return Ok(());
        }
        self.tool("pg_ctl")
            .arg("-D")
            .arg(self.pgdata())
            .args(["-m", mode, "-w", "-t", "120", "stop"])
            .pipe_to_log(self)
    }

    /// Promotes a standby to a primary on a new timeline; blocks until it accepts writes.
    pub fn promote(&self) -> Result<()> {
        self.tool("pg_ctl")
            .arg("-D")
            .arg(self.pgdata())
            .args(["-w", "-t", "120", "promote"])
            .pipe_to_log(self)
    }

    /// For throwaway clusters: once `pid` exits, a detached watchdog stops this server and then
    /// removes the data directory; it signals the `postmaster.pid` process only if it is
    /// `postgres`.
    #[allow(
        clippy::zombie_processes,
        reason = "the watchdog must outlive this process; init reaps it"
    )]
    pub fn remove_when_process_exits(&self, pid: u32) -> std::io::Result<()> {
        let watchdog = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
             pm=$(head -n 1 '{dir}/pg/postmaster.pid' 2>/dev/null); \
             if [ -n \"$pm\" ] && [ \"$(cat /proc/$pm/comm 2>/dev/null || echo postgres)\" = postgres ] \
                && kill -QUIT \"$pm\" 2>/dev/null; then \
               i=0; while kill -0 \"$pm\" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; \
               kill -KILL \"$pm\" 2>/dev/null; \
             fi; \
             rm -rf '{dir}'",
            dir = self.dir.display()
        );
        Command::new("sh")
            .args(["-c", &watchdog])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        Ok(())
    }

    /// The server's process id, read from `postmaster.pid`.
    pub fn pid(&self) -> Option<i32> {
        let text = fs::read_to_string(self.pgdata().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Whether the server of this directory is running.
    pub fn running(&self) -> bool {
        self.tool("pg_ctl")
            .arg("-D")
            .arg(self.pgdata())
            .arg("status")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn tool(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        cmd.current_dir(&self.dir)
            .env("LC_ALL", "C")
            .env_remove("PGDATA");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd
    }

    fn prepare_dir(&self) -> Result<()> {
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(&self.dir, Some(uid), Some(gid)).map_err(|e| EmbeddedError::Io {
                what: "changing the owner of",
                path: self.dir.clone(),
                source: e.into(),
            })?;
        }
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(0o700))
            .map_err(io_err("setting the mode of", &self.dir))?;
        let pgdata = self.pgdata();
        let foreign = fs::read_dir(&self.dir)
            .map_err(io_err("reading", &self.dir))?
            .flatten()
            .any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                !(matches!(name.as_ref(), PGDATA | "postgres.log" | "tools.log")
                    || name.starts_with(".s.PGSQL"))
            });
        if foreign && !holds_cluster(&pgdata) {
            return Err(EmbeddedError::NotOurs(self.dir.clone()));
        }
        Ok(())
    }

    fn write_settings(&self, settings: &Settings) -> Result<()> {
        let dir = self.dir.display().to_string().replace('\'', "''");
        let listen = if self.tcp_port.is_some() {
            "127.0.0.1"
        } else {
            ""
        };
        let mut text = format!(
            "# Written by snapfence at every start; edits are lost.\n\
             listen_addresses = '{listen}'\n\
             unix_socket_directories = '{dir}'\n\
             port = {port}\n",
            port = self.port()
        );
        for (name, value) in &settings.extra {
            text.push_str(&format!("{name} = {value}\n"));
        }
        let path = self.pgdata().join("snapfence.conf");
        fs::write(&path, text).map_err(io_err("writing", &path))?;
        if let Some((uid, gid)) = self.run_as {
            nix::unistd::chown(&path, Some(uid), Some(gid)).map_err(|e| EmbeddedError::Io {
                what: "changing the owner of",
                path: path.clone(),
                source: e.into(),
            })?;
        }
        Ok(())
    }
}

fn unprivileged_user() -> Result<Option<(Uid, Gid)>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    ["postgres", "nobody"]
        .iter()
        .find_map(|name| User::from_name(name).ok().flatten())
        .map(|u| Some((u.uid, u.gid)))
        .ok_or(EmbeddedError::NoUser)
}

fn check_reachable(data_dir: &Path, uid: Uid, gid: Gid) -> Result<()> {
    let absolute = std::path::absolute(data_dir).map_err(io_err("resolving", data_dir))?;
    let Some(existing) = absolute.ancestors().skip(1).find(|a| a.is_dir()) else {
        return Ok(());
    };
    let existing = fs::canonicalize(existing).map_err(io_err("resolving", existing))?;
    let user = User::from_uid(uid).ok().flatten();
    let mut groups = vec![gid];
    if let Some(user) = &user {
        if let Ok(name) = std::ffi::CString::new(user.name.clone()) {
            groups.extend(nix::unistd::getgrouplist(&name, gid).unwrap_or_default());
        }
    }
    let mut on_the_way: Vec<&Path> = existing.ancestors().collect();
    on_the_way.reverse();
    for dir in on_the_way {
        let meta = fs::metadata(dir).map_err(io_err("reading", dir))?;
        if !can_search(&meta, uid, &groups) {
            let owner = User::from_uid(Uid::from_raw(meta.uid()))
                .ok()
                .flatten()
                .map_or_else(|| meta.uid().to_string(), |u| u.name);
            return Err(EmbeddedError::Unsearchable {
                dir: dir.to_path_buf(),
                mode: meta.mode() & 0o7777,
                owner,
                user: user.map_or_else(|| uid.to_string(), |u| u.name),
                data_dir: absolute,
            });
        }
    }
    Ok(())
}

fn can_search(meta: &fs::Metadata, uid: Uid, groups: &[Gid]) -> bool {
    let mode = meta.mode();
    if meta.uid() == uid.as_raw() {
        mode & 0o100 != 0
    } else if groups.iter().any(|g| g.as_raw() == meta.gid()) {
        mode & 0o010 != 0
    } else {
        mode & 0o001 != 0
    }
}

trait PipeToLog {
    fn pipe_to_log(&mut self, pg: &EmbeddedPostgres) -> Result<()>;
}

impl PipeToLog for Command {
    fn pipe_to_log(&mut self, pg: &EmbeddedPostgres) -> Result<()> {
        let log_path = pg.dir.join("tools.log");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io_err("opening", &log_path))?;
        if let Some((uid, gid)) = pg.run_as {
            let _ = nix::unistd::chown(&log_path, Some(uid), Some(gid));
        }
        let err = log.try_clone().map_err(io_err("opening", &log_path))?;
        let tool = match self.get_program().to_string_lossy().rsplit('/').next() {
            Some("initdb") => "initdb",
            Some("pg_ctl") => "pg_ctl",
            Some("pg_basebackup") => "pg_basebackup",
            _ => "postgres",
        };
        let status = self
            .stdout(log)
            .stderr(err)
            .status()
            .map_err(io_err(
                "running (as root, every directory above --data-dir must be searchable by the `postgres` user)",
                Path::new(self.get_program()),
            ))?;
        if status.success() {
            Ok(())
        } else {
            Err(EmbeddedError::Tool {
                tool,
                status: status.to_string(),
                log: log_path,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OTHER: (u32, u32) = (65534, 65534);

    #[test]
    fn a_data_dir_under_a_directory_postgres_cannot_search_is_refused_naming_it() {
        let top = tempfile::Builder::new()
            .prefix("sf-tmp-reach-")
            .tempdir()
            .unwrap();
        let closed = top.path().join("closed");
        fs::create_dir_all(closed.join("open")).unwrap();
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).unwrap();
        let data = closed.join("open/not-yet/data");
        let (uid, gid) = (Uid::from_raw(OTHER.0), Gid::from_raw(OTHER.1));

        let err = check_reachable(&data, uid, gid).unwrap_err();
        let closed = fs::canonicalize(&closed).unwrap();
        match &err {
            EmbeddedError::Unsearchable { dir, mode, .. } => {
                assert_eq!(dir, &closed, "the first directory it cannot enter");
                assert_eq!(*mode, 0o700);
            }
            other => panic!("{other:?}"),
        }
        let message = err.to_string();
        assert!(
            message.contains(&format!("`chmod o+x {}`", closed.display())),
            "{message}"
        );
        assert!(message.contains("--data-dir"), "{message}");

        fs::set_permissions(&closed, fs::Permissions::from_mode(0o711)).unwrap();
        check_reachable(&data, uid, gid).expect("searchable now");
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o710)).unwrap();
        let meta = fs::metadata(&closed).unwrap();
        assert!(can_search(&meta, uid, &[Gid::from_raw(meta.gid())]));
        assert!(!can_search(&meta, uid, &[gid]));
        assert!(can_search(&meta, Uid::from_raw(meta.uid()), &[]));
    }
}
