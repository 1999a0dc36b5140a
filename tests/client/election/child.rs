//! The candidates and holders of the election and keeper tests, each in a process of its own:
//! this test binary started again with only [`child_process`] to run, steered through its
//! stdin and heard through its stdout.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use snapfence_client::{Election, Error, FencingToken, LeaseKeeper, PutOptions};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use crate::support::{client, key, owner};

/// The variable that makes [`child_process`] act, and what it does: `candidate` campaigns in
/// the election named `SF_CHILD_KEY`; `holder` acquires that key with a [`LeaseKeeper`].
const ROLE: &str = "SF_CHILD_ROLE";
/// What a child prints before each line meant for the test.
const SAYS: &str = "@@ ";

/// The election's TTL: short, so that failovers are quick, and long enough to renew in on a
/// loaded machine (the keeper renews every 533 ms and gives up 400 ms before the deadline).
pub const TTL: Duration = Duration::from_secs(2);

/// A candidate or holder in a process of its own. It prints `@@ leading TOKEN` or
/// `@@ holding TOKEN` once it holds the key, then takes commands on stdin, one a line:
/// `check` (the keeper's check), `fenced` (a write through the keeper: checked first) and
/// `write` (a write with its token, unchecked), and prints what came of each.
pub struct Proc {
    pub name: String,
    pub pid: Pid,
    stdin: ChildStdin,
    said: mpsc::UnboundedReceiver<(Instant, String)>,
    child: tokio::process::Child,
    _reader: JoinHandle<()>,
}

impl Proc {
    /// Starts this binary as [`child_process`], acting as `role` on `key` under the name
    /// `name`.
    pub fn start(base: &str, role: &str, key: &str, name: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "election::child::child_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(ROLE, role)
            .env("SF_CHILD_URL", base)
            .env("SF_CHILD_KEY", key)
            .env("SF_CHILD_NAME", name)
            .env("SF_CHILD_TTL_MS", TTL.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("this test binary, again");
        let pid = Pid::from_raw(child.id().unwrap() as i32);
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, said) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                // The test harness of the child may print on the same line before it.
                if let Some(at) = line.find(SAYS) {
                    let _ = tx.send((Instant::now(), line[at + SAYS.len()..].to_owned()));
                }
            }
        });
        Self {
            name: name.to_owned(),
            pid,
            stdin,
            said,
            child,
            _reader: reader,
        }
    }

    /// The next line it says within `within`, with when it came; `None` if none came.
    pub async fn next_within(&mut self, within: Duration) -> Option<(Instant, String)> {
        timeout(within, self.said.recv()).await.ok().flatten()
    }

    /// A line it said already, if there is one.
    pub fn try_next(&mut self) -> Option<(Instant, String)> {
        self.said.try_recv().ok()
    }

    /// The next line it says; it must say one within 30 s.
    pub async fn next(&mut self) -> String {
        let (_, line) = self
            .next_within(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("{} said nothing more", self.name));
        line
    }

    /// Waits until it holds the key (`leading` or `holding`); its token.
    pub async fn token(&mut self) -> FencingToken {
        let line = self.next().await;
        token_in(&line).unwrap_or_else(|| panic!("{}: {line}", self.name))
    }

    /// Sends it a command, to be read when it runs.
    pub async fn send(&mut self, command: &str) {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Sends it a command and returns what it says about it.
    pub async fn ask(&mut self, command: &str) -> String {
        self.send(command).await;
        self.next().await
    }

    /// Sends it a signal.
    pub fn signal(&self, signal: Signal) {
        kill(self.pid, signal).unwrap();
    }

    /// SIGKILLs it and reaps it.
    pub async fn kill(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// The token of a `leading TOKEN` or `holding TOKEN` line.
pub fn token_in(line: &str) -> Option<FencingToken> {
    let (_, token) = line.split_once(' ')?;
    FencingToken::new(token.parse().ok()?).ok()
}

/// Not a test: the body of a candidate or holder process ([`Proc`]), which the tests start
/// with [`ROLE`] set. Without it, it does nothing.
#[tokio::test]
#[ignore = "the child process of the election and keeper tests; they start it themselves"]
async fn child_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let c = client(&var("SF_CHILD_URL"));
    let k = key(&var("SF_CHILD_KEY"));
    let name = owner(&var("SF_CHILD_NAME"));
    let ttl = Duration::from_millis(var("SF_CHILD_TTL_MS").parse().unwrap());
    let keeper: LeaseKeeper = match role.as_str() {
        "candidate" => {
            let election = Election::new(&c, k.clone(), name.clone(), ttl);
            let leadership = election.campaign().await.unwrap();
            println!("{SAYS}leading {}", leadership.token());
            leadership.into_keeper()
        }
        "holder" => {
            let request = snapfence_client::AcquireRequest::new(name.clone(), ttl);
            let keeper = LeaseKeeper::acquire(&c, &k, &request, Default::default())
                .await
                .unwrap();
            println!("{SAYS}holding {}", keeper.token());
            keeper
        }
        other => panic!("{ROLE}={other}"),
    };
    let body = format!("by {}", name.as_str());
    let options = PutOptions::default();
    let put = |token| c.put_snapshot(&k, token, body.clone(), &options);
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(command) = commands.next_line().await.unwrap() {
        let said = match command.as_str() {
            "check" => match keeper.check() {
                Ok(()) => "check ok".to_owned(),
                Err(e) => format!("check {}", outcome(&e)),
            },
            "fenced" => match keeper.fenced(put).await {
                Ok(w) => format!("fenced accepted {}", w.meta.version),
                Err(e) => format!("fenced {}", outcome(&e)),
            },
            "write" => match put(keeper.token()).await {
                Ok(w) => format!("write accepted {}", w.meta.version),
                Err(e) => format!("write {}", outcome(&e)),
            },
            other => panic!("unknown command {other:?}"),
        };
        println!("{SAYS}{said}");
    }
}

/// How a failed call is told to the test: `lost` for [`Error::LeaseLost`] (the keeper's loss
/// or the server's), `refused CODE` for another contract code.
fn outcome(e: &Error) -> String {
    match e {
        Error::LeaseLost { .. } => "lost".to_owned(),
        e => match e.code() {
            Some(code) => format!("refused {}", code.as_str()),
            None => format!("failed {e}"),
        },
    }
}
