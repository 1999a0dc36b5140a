//! PostgreSQL's tools: where they are installed, and running one as the cluster's user with its
//! output in `tools.log`.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{EmbeddedError, EmbeddedPostgres, Result, io_err};

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

impl EmbeddedPostgres {
    pub(super) fn tool(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bin.join(name));
        cmd.current_dir(&self.dir)
            .env("LC_ALL", "C")
            .env_remove("PGDATA");
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid.as_raw()).gid(gid.as_raw());
        }
        cmd
    }
}

pub(super) trait PipeToLog {
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
