//! What the tests of this binary share beyond the harness: clients and names, a server whose
//! database cannot be reached, the `snapfence` binary as a user runs it, and golden files.

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use snapfence::domain::{Key, Owner};
use snapfence::store::{self, DbSettings};
use snapfence::{AppState, Rules};
use snapfence_client::{AcquireRequest, Client, Grant, RetryPolicy};
use sqlx::postgres::PgConnectOptions;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A client of `base` with short timeouts, so that a test of a failure fails fast.
pub fn client(base: &str) -> Client {
    Client::builder(base)
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(1))
        .retry(RetryPolicy {
            max_attempts: 3,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(100),
        })
        .build()
        .unwrap()
}

/// A key from a literal.
pub fn key(raw: &str) -> Key {
    Key::parse(raw).unwrap()
}

/// An owner from a literal.
pub fn owner(raw: &str) -> Owner {
    Owner::parse(raw).unwrap()
}

/// Acquires a key that must be free.
pub async fn grant(client: &Client, key: &Key, who: &str, ttl: Duration) -> Grant {
    client
        .acquire(key, &AcquireRequest::new(owner(who), ttl))
        .await
        .unwrap()
}

/// A port nobody listens on (it was free a moment ago).
pub fn closed_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The loopback address of a server at `base` (`http://127.0.0.1:PORT`), for a proxy to front.
pub fn upstream(base: &str) -> SocketAddr {
    base.trim_start_matches("http://")
        .parse()
        .expect("an http://IP:PORT base")
}

/// The real server, with a database address where nothing listens: every call that needs the
/// database answers `503 unavailable`.
pub struct Outage {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<std::io::Result<()>>,
}

impl Outage {
    /// Starts it.
    pub async fn start() -> Self {
        let options = PgConnectOptions::new()
            .host("127.0.0.1")
            .port(closed_port())
            .username("nobody")
            .database("nothing");
        let db = store::pool(
            options,
            &DbSettings {
                pool_size: 2,
                timeout: Duration::from_millis(500),
            },
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = oneshot::channel();
        let served = tokio::spawn(snapfence::run(
            listener,
            AppState::new(db, Rules::default()),
            None,
            async {
                rx.await.ok();
            },
        ));
        Self {
            base,
            stop: Some(tx),
            served,
        }
    }

    /// Stops it.
    pub async fn stop(mut self) {
        self.stop.take().map(|tx| tx.send(()));
        self.served.await.unwrap().unwrap();
    }
}

/// How a run of the binary ended.
#[derive(Debug)]
pub struct Ran {
    /// Its exit code.
    pub code: i32,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// The `snapfence` binary with `SNAPFENCE_URL` set to `base` and no lease of the test's own
/// environment leaking in.
pub fn snapfence(base: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_snapfence"));
    cmd.env("SNAPFENCE_URL", base)
        .env_remove("SNAPFENCE_TOKEN")
        .env_remove("SNAPFENCE_KEY")
        .env_remove("SNAPFENCE_OWNER")
        .env_remove("SNAPFENCE_API_KEY")
        .env_remove("SNAPFENCE_CA_CERT")
        .kill_on_drop(true);
    cmd
}

/// Runs the binary to its end with `args`, feeding it `stdin`.
pub async fn cli_with_stdin(base: &str, args: &[&str], stdin: &[u8]) -> Ran {
    let mut child = snapfence(base)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the snapfence binary");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let out = child.wait_with_output().await.unwrap();
    Ran {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Runs the binary to its end with `args` and an empty stdin.
pub async fn cli(base: &str, args: &[&str]) -> Ran {
    cli_with_stdin(base, args, b"").await
}

/// Replaces what differs between runs by placeholders: times, request ids, peer addresses and
/// cursors by a fixed text, tokens and audit ids by their order of first appearance, so that
/// equal values stay visibly equal.
#[derive(Debug, Default)]
pub struct Normaliser {
    tokens: Vec<i64>,
    ids: Vec<i64>,
}

impl Normaliser {
    /// The JSON with its varying parts replaced.
    pub fn json(&mut self, mut v: Value) -> Value {
        self.walk(None, &mut v);
        v
    }

    fn walk(&mut self, field: Option<&str>, v: &mut Value) {
        let numbered = |seen: &mut Vec<i64>, n: i64, what: &str| {
            let i = seen.iter().position(|&t| t == n).unwrap_or_else(|| {
                seen.push(n);
                seen.len() - 1
            });
            Value::String(format!("<{what} {}>", i + 1))
        };
        match (field, &mut *v) {
            (_, Value::Object(map)) => {
                for (k, item) in map.iter_mut() {
                    self.walk(Some(k), item);
                }
            }
            (_, Value::Array(items)) => {
                for item in items {
                    self.walk(field, item);
                }
            }
            (
                Some(
                    "acquired_at" | "expires_at" | "ended_at" | "updated_at" | "at" | "since"
                    | "last_modified",
                ),
                Value::String(_),
            ) => *v = "<time>".into(),
            (Some("request_id"), Value::String(_)) => *v = "<request id>".into(),
            (Some("remote_addr"), Value::String(_)) => *v = "<address>".into(),
            (Some("next_cursor"), Value::String(_)) => *v = "<cursor>".into(),
            (
                Some("token" | "presented_token" | "highest_token" | "newest_token"),
                Value::Number(n),
            ) => {
                *v = numbered(&mut self.tokens, n.as_i64().unwrap(), "token");
            }
            (Some("id" | "audit_id"), Value::Number(n)) => {
                *v = numbered(&mut self.ids, n.as_i64().unwrap(), "id");
            }
            _ => {}
        }
    }
}

/// A message with the server's URL, every RFC 3339 time and the random pause of each retry
/// replaced by placeholders.
pub fn normalise_text(text: &str, base: &str) -> String {
    let text: String = text
        .replace(base, "<url>")
        .lines()
        .map(|line| match line.find(" (retrying in ") {
            Some(at) => format!("{} (retrying in <pause>)\n", &line[..at]),
            None => format!("{line}\n"),
        })
        .collect();
    let mut out = String::new();
    let mut i = 0;
    while let Some(c) = text[i..].chars().next() {
        match time_at(&text[i..]) {
            Some(len) => {
                out.push_str("<time>");
                i += len;
            }
            None => {
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// The length of the RFC 3339 UTC time at the start of `s` (`2026-12-02T13:05:00.123Z`).
fn time_at(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| r.clone().all(|i| b.get(i).is_some_and(u8::is_ascii_digit));
    if !(digits(0..4) && b.get(4) == Some(&b'-') && digits(5..7) && b.get(10) == Some(&b'T')) {
        return None;
    }
    let end = (11..b.len()).find(|&i| !(b[i].is_ascii_digit() || b[i] == b':' || b[i] == b'.'))?;
    (b[end] == b'Z').then_some(end + 1)
}

/// Compares `actual` with the golden file `name` under `tests/client/golden/`; with
/// `BLESS=1` in the environment, writes it instead.
pub fn golden(name: &str, actual: &str) {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "client",
        "golden",
        name,
    ]
    .iter()
    .collect();
    if std::env::var_os("BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "no golden file {}; run the test with BLESS=1 to write it",
            path.display()
        )
    });
    assert_eq!(
        actual,
        expected,
        "{} differs; if the change is intended, run with BLESS=1 and review the diff",
        path.display()
    );
}

#[test]
fn times_in_text_become_placeholders() {
    assert_eq!(
        normalise_text(
            "held until 2026-12-02T13:05:00.123Z; see http://x:1/a at 2026-12-02T13:05:00Z.",
            "http://x:1"
        ),
        "held until <time>; see <url>/a at <time>.\n"
    );
    assert_eq!(
        normalise_text("down (retrying in 87ms)\n", "-"),
        "down (retrying in <pause>)\n"
    );
}
