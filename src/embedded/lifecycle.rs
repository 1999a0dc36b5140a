//! A cluster's server: started with its settings, stopped, promoted, watched, and its status.

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use super::tools::PipeToLog;
use super::{EmbeddedError, EmbeddedPostgres, Result, Settings, io_err};

impl EmbeddedPostgres {
    pub(super) fn launch(self, settings: &Settings) -> Result<Self> {
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
