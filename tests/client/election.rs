//! `Election` against the real server, with candidates in processes of their own (this test
//! binary started again as [`child_process`]) so that a leader can be SIGKILLed or SIGSTOPped
//! as a real one would die or freeze. The watch of the election's key, read from the oldest
//! change, is the record of every token granted and ended.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use snapfence_client::{
    ChangeEvent, ChangeId, ChangeKind, Client, Election, Error, FencingToken, Key, KeyPrefix,
    LeaseKeeper, PutOptions, WatchOptions,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use crate::harness::TestApp;
use crate::support::{client, key, owner};

/// The variable that makes [`child_process`] act, and what it does: `candidate` campaigns in
/// the election named `SF_CHILD_KEY`; `holder` acquires that key with a [`LeaseKeeper`].
const ROLE: &str = "SF_CHILD_ROLE";
/// What a child prints before each line meant for the test.
const SAYS: &str = "@@ ";

/// The election's TTL: short, so that failovers are quick, and long enough to renew in on a
/// loaded machine (the keeper renews every 533 ms and gives up 400 ms before the deadline).
const TTL: Duration = Duration::from_secs(2);
/// The most a failover may take after the leader's death beyond the TTL: the server's hand-off
/// and the new leader's first renewal, on a loaded machine.
const HAND_OFF: Duration = Duration::from_millis(1500);

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
                "election::child_process",
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
fn token_in(line: &str) -> Option<FencingToken> {
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

/// Every change of `name` from the oldest, gathered in the background.
struct Record {
    changes: mpsc::UnboundedReceiver<ChangeEvent>,
    seen: Vec<ChangeEvent>,
    _task: JoinHandle<()>,
}

impl Record {
    fn start(c: &Client, name: &Key) -> Self {
        let options = WatchOptions::new()
            .prefix(KeyPrefix::parse(name.as_str()).unwrap())
            .since(ChangeId::ORIGIN);
        let mut watch = c.watch(&options);
        let name = name.clone();
        let (tx, changes) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(Ok(change)) = watch.next().await {
                if change.data.key == name {
                    let _ = tx.send(change);
                }
            }
        });
        Self {
            changes,
            seen: Vec::new(),
            _task: task,
        }
    }

    /// The changes so far, once the watch has caught up with the lease's current state (the
    /// grant of `newest`) and waited `settle` for later ones.
    async fn until(&mut self, newest: FencingToken, settle: Duration) -> &[ChangeEvent] {
        let until = Instant::now() + Duration::from_secs(10);
        while !self
            .seen
            .iter()
            .any(|c| c.event == ChangeKind::LeaseGranted && c.data.token == newest)
        {
            let left = until.saturating_duration_since(Instant::now());
            let change = timeout(left, self.changes.recv())
                .await
                .expect("the watch delivers the grant")
                .unwrap();
            self.seen.push(change);
        }
        while let Ok(Some(change)) = timeout(settle, self.changes.recv()).await {
            self.seen.push(change);
        }
        &self.seen
    }
}

/// The tokens granted in `changes`, in order.
fn grants(changes: &[ChangeEvent]) -> Vec<FencingToken> {
    changes
        .iter()
        .filter(|c| c.event == ChangeKind::LeaseGranted)
        .map(|c| c.data.token)
        .collect()
}

/// The tokens whose lease ended (released, expired, abandoned) in `changes`.
fn ends(changes: &[ChangeEvent]) -> Vec<FencingToken> {
    changes
        .iter()
        .filter(|c| {
            matches!(
                c.event,
                ChangeKind::LeaseReleased | ChangeKind::LeaseExpired | ChangeKind::LeaseAbandoned
            )
        })
        .map(|c| c.data.token)
        .collect()
}

/// Three candidates: the first leads, the other two wait in the queue. Returns them in that
/// order with the leader's token.
async fn three_candidates(app: &TestApp, name: &str) -> (Vec<Proc>, FencingToken) {
    let base = &app.instance.base;
    let mut first = Proc::start(base, "candidate", name, "a");
    let token = first.token().await;
    let others = [
        Proc::start(base, "candidate", name, "b"),
        Proc::start(base, "candidate", name, "c"),
    ];
    let c = client(base);
    let until = Instant::now() + Duration::from_secs(30);
    while c.lease_status(&key(name)).await.unwrap().waiters < 2 {
        assert!(Instant::now() < until, "the others never queued");
        sleep(Duration::from_millis(20)).await;
    }
    let mut all = vec![first];
    all.extend(others);
    (all, token)
}

/// The one of `standbys` that leads first, within `within`, with when it said so and its
/// token; the others must not have said anything by then.
async fn next_leader(standbys: &mut [Proc], within: Duration) -> (usize, Instant, FencingToken) {
    let until = Instant::now() + within;
    loop {
        for (i, p) in standbys.iter_mut().enumerate() {
            if let Ok((at, line)) = p.said.try_recv() {
                let token = token_in(&line).unwrap_or_else(|| panic!("{}: {line}", p.name));
                return (i, at, token);
            }
        }
        assert!(Instant::now() < until, "no standby led within {within:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_killed_leader_is_replaced_by_exactly_one_candidate_within_the_ttl_and_the_hand_off() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let name = key("leader");
    let mut record = Record::start(&c, &name);
    let (mut candidates, old) = three_candidates(&app, "leader").await;
    assert_eq!(
        candidates[0].ask("fenced").await,
        "fenced accepted 1",
        "the first leader writes"
    );

    let mut standbys = candidates.split_off(1);
    let killed = Instant::now();
    candidates.pop().unwrap().kill().await;
    let (new, led_at, token) = next_leader(&mut standbys, TTL + HAND_OFF + TTL).await;
    let failover = led_at - killed;
    eprintln!("failover after SIGKILL with a {TTL:?} TTL: {failover:?}");
    assert!(
        failover <= TTL + HAND_OFF,
        "the new leader led {failover:?} after the kill"
    );
    assert!(token > old);
    assert_eq!(
        standbys[new].ask("fenced").await,
        "fenced accepted 2",
        "the new leader's first write is accepted"
    );
    let other = &mut standbys[1 - new];
    assert_eq!(
        other.next_within(TTL).await,
        None,
        "{} must not lead too",
        other.name
    );

    // The watch's record: one grant for the failover, and it was not dropped.
    let changes = record.until(token, Duration::from_millis(500)).await;
    assert_eq!(grants(changes), vec![old, token], "{changes:#?}");
    assert_eq!(ends(changes), vec![old], "{changes:#?}");
    let at = |kind, token| {
        let change = changes
            .iter()
            .find(|c| c.event == kind && c.data.token == token);
        change.expect("in the record").data.at
    };
    let hand_off = at(ChangeKind::LeaseGranted, token) - at(ChangeKind::LeaseExpired, old);
    eprintln!("hand-off from the expiry to the next grant, by the database clock: {hand_off}");
    let election = Election::new(&c, name, owner("observer"), TTL);
    let leader = election.leader().await.unwrap().expect("someone leads");
    assert_eq!(leader.token, token);
    assert_eq!(leader.owner.as_str(), standbys[new].name);
    // Gone before the server, so that none of them reports the server's going.
    drop(standbys);
    app.stop().await;
}

#[tokio::test]
async fn a_leader_frozen_past_its_ttl_is_replaced_and_its_write_is_refused() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let name = key("leader");
    let mut record = Record::start(&c, &name);
    let (mut candidates, old) = three_candidates(&app, "leader").await;
    let mut standbys = candidates.split_off(1);
    let mut frozen = candidates.pop().unwrap();

    frozen.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let (new, led_at, token) = next_leader(&mut standbys, TTL + HAND_OFF + TTL).await;
    eprintln!(
        "failover after SIGSTOP with a {TTL:?} TTL: {:?}",
        led_at - stopped
    );
    assert_eq!(
        standbys[new].ask("fenced").await,
        "fenced accepted 1",
        "the new leader's first write is accepted"
    );
    frozen.signal(Signal::SIGCONT);
    assert_eq!(
        frozen.ask("write").await,
        "write refused stale_token",
        "the old leader's write, sent without a check, is refused by the fence"
    );
    assert_eq!(frozen.ask("check").await, "check lost");
    let other = &mut standbys[1 - new];
    assert_eq!(other.next_within(Duration::from_millis(500)).await, None);

    let changes = record.until(token, Duration::from_millis(500)).await;
    assert_eq!(grants(changes), vec![old, token], "{changes:#?}");
    assert_eq!(ends(changes), vec![old], "{changes:#?}");
    drop((frozen, standbys));
    app.stop().await;
}

#[tokio::test]
async fn observe_follows_the_leader_from_the_current_one_through_a_resignation() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let election = |who| Election::new(&c, key("leader"), owner(who), TTL);
    let first = election("a").campaign().await.unwrap();
    let mut observed = election("observer").observe().await.unwrap();
    let now = observed.next().await.unwrap().unwrap().expect("a leads");
    assert_eq!(
        (now.owner.as_str(), now.token),
        ("a", first.token()),
        "the leader when the observation began"
    );

    let standby = election("b");
    let campaign = tokio::spawn(async move { standby.campaign().await });
    let until = Instant::now() + Duration::from_secs(30);
    while c.lease_status(&key("leader")).await.unwrap().waiters < 1 {
        assert!(Instant::now() < until, "b never queued");
        sleep(Duration::from_millis(20)).await;
    }
    first.resign().await.unwrap();
    let second = campaign.await.unwrap().unwrap();

    let mut seen = Vec::new();
    while seen.last() != Some(&Some(second.token())) {
        let leader = timeout(Duration::from_secs(10), observed.next())
            .await
            .expect("the change is observed")
            .unwrap()
            .unwrap();
        seen.push(leader.map(|l| l.token));
    }
    assert_eq!(
        seen,
        vec![None, Some(second.token())],
        "a's end, then b's lead"
    );
    second.resign().await.unwrap();
    app.stop().await;
}

#[tokio::test]
async fn campaign_for_gives_up_with_lease_held_while_another_leads() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let leader = Election::new(&c, key("leader"), owner("a"), TTL)
        .campaign()
        .await
        .unwrap();
    let started = Instant::now();
    let e = Election::new(&c, key("leader"), owner("b"), TTL)
        .campaign_for(Duration::from_millis(700))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::LeaseHeld { .. }), "{e:?}");
    assert!(started.elapsed() >= Duration::from_millis(700));
    leader.resign().await.unwrap();
    app.stop().await;
}
