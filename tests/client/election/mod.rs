//! `Election` against the real server, with candidates in processes of their own (this test
//! binary started again as [`child::child_process`]) so that a leader can be SIGKILLed or SIGSTOPped
//! as a real one would die or freeze. The watch of the election's key, read from the oldest
//! change, is the record of every token granted and ended.

pub mod child;

use std::time::Duration;

use nix::sys::signal::Signal;
use snapfence_client::{
    ChangeEvent, ChangeId, ChangeKind, Client, Election, Error, FencingToken, Key, KeyPrefix,
    WatchOptions,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use self::child::{Proc, TTL, token_in};
use crate::harness::TestApp;
use crate::support::{client, key, owner};

/// The most a failover may take after the leader's death beyond the TTL: the server's hand-off
/// and the new leader's first renewal, on a loaded machine.
const HAND_OFF: Duration = Duration::from_millis(1500);

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
            if let Some((at, line)) = p.try_next() {
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
