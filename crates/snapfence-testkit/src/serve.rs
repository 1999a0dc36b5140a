//! `snapfence serve` as a process of its own, for what only the binary does (embedded
//! PostgreSQL, signals, the `OTEL_*` exporter, its memory). The caller names the binary:
//! `env!("CARGO_BIN_EXE_snapfence")` exists only in the root package's integration tests.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::StatusCode;

use crate::harness::free_port;

/// A running `snapfence serve`; stopped as a user would stop it when dropped.
pub struct Served {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Served {
    /// Starts `bin serve --listen 127.0.0.1:PORT` with `args` and `env` (without `DATABASE_URL`
    /// and the `OTEL_*` variables of the test's own environment), its stderr in `stderr`, and
    /// waits until `/readyz` says it is ready.
    pub async fn start(
        bin: &str,
        args: impl IntoIterator<Item = impl AsRef<OsStr>>,
        env: &[(&str, &str)],
        stderr: &Path,
    ) -> Self {
        let port = free_port();
        let mut command = Command::new(bin);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("OTEL_") {
                command.env_remove(name);
            }
        }
        let child = command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(args)
            .env_remove("DATABASE_URL")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(stderr).unwrap())
            .spawn()
            .expect("starting snapfence serve");
        let served = Self {
            child: Some(child),
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = reqwest::get(format!("{}/readyz", served.base)).await
                && r.status() == StatusCode::OK
            {
                return served;
            }
            assert!(
                Instant::now() < deadline,
                "serve did not become ready: {}",
                std::fs::read_to_string(stderr).unwrap()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("a running server").id()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM).unwrap();
    }

    /// Waits for the process to exit.
    pub async fn wait(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("a running server");
        tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap()
    }
}

/// Stops the server as a user would (SIGTERM, which stops an embedded PostgreSQL too; SIGKILL
/// if that takes over 30 s), so that a test that fails half-way leaves nothing running.
impl Drop for Served {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
