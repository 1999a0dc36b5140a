//! [`Election`]: leader election on a key, in the shape of etcd's `concurrency.Election`
//! (campaign, resign, leader, observe). The leader holds the key's lease through a
//! [`LeaseKeeper`], and its fencing token fences its writes: the store refuses a deposed
//! leader's writes, whatever that leader believes. Under contract v1.3 a lease also fences
//! the keys under its key (`NAME/…`, named with `Fencing-Key`), so the leader's token can guard
//! every key of its namespace.
//!
//! Candidates wait in the key's queue on the server and are served in the order they asked. A
//! leader that resigns (or drops its [`Leadership`]) hands over at once. One that dies or
//! freezes hands over when its lease expires, at most the TTL after its last renewal (by default
//! the keeper renews at least every third of the TTL), plus the hand-off: the server grants the first
//! waiter as soon as the database clock passes the expiry, and the new leader renews once, a
//! round trip, before it leads. The new leader is dated by that renewal, not by when it began to
//! wait, so a long wait does not make it lose at once: each failover grants exactly one token.
//!
//! Failover times measured by `tests/client/election.rs` (which prints them), with a 2 s TTL,
//! three candidate processes and a server on loopback, the leader SIGKILLed 0.1 to 0.2 s after a
//! renewal: the new leader led 1.86 to 1.99 s after the kill; from the old lease's expiry to the
//! new grant took 4 to 20 ms by the database clock. A leader SIGSTOPped instead is replaced in
//! the same time, and its writes after SIGCONT are refused by the fence.

use std::ops::Deref;
use std::time::Duration;

use reqwest::header;
use snapfence_types::headers::WATCH_AFTER;
use snapfence_types::{
    AcquireRequest, ChangeEvent, ChangeId, ChangeKind, FencingToken, Key, KeyPrefix, KeyStatus,
    LeaseState, MAX_WAIT_MS, Owner,
};
use tokio::time::Instant;

use crate::trace::TraceContext;
use crate::transport::Call;
use crate::{Client, Error, KeeperOptions, LeaseKeeper, Result, Watch, WatchOptions};

/// The longest one waiting acquire asks for (the contract's bound); a campaign asks again.
const MAX_WAIT: Duration = Duration::from_millis(MAX_WAIT_MS as u64);

/// An election on the key `name`, in which this process runs as `candidate` with leases of
/// `ttl`. Use a key of its own, that no other key begins with: [`observe`](Self::observe)
/// watches the keys that begin with it.
///
/// ```no_run
/// use std::time::Duration;
///
/// use snapfence_client::{Client, Election, Error, Key, Owner, PutOptions};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::new("http://127.0.0.1:7878")?;
/// let name = Key::parse("leaders/scheduler")?;
/// let election = Election::new(&client, name.clone(), Owner::parse("node-1")?, Duration::from_secs(5));
/// let leadership = election.campaign().await?;
/// let put = PutOptions::default();
/// // Lead while the lease holds; every write carries the leader's token, and is checked first.
/// loop {
///     match leadership
///         .fenced(|token| client.put_snapshot(&name, token, "plan", &put))
///         .await
///     {
///         Ok(_) => {}
///         // Deposed (the keeper's loss, or the fence's refusal): stop leading.
///         Err(Error::LeaseLost { .. } | Error::StaleToken { .. }) => break,
///         Err(e) => return Err(e.into()),
///     }
///     tokio::time::sleep(Duration::from_secs(1)).await;
/// }
/// leadership.resign().await.ok();
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Election {
    client: Client,
    name: Key,
    candidate: Owner,
    ttl: Duration,
    options: KeeperOptions,
}

/// Who leads: the candidate's name and its lease's fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The candidate, as it campaigned.
    pub owner: Owner,
    /// Its lease's token: the fence of its writes.
    pub token: FencingToken,
}

impl Election {
    /// An election on `name` for `candidate`, with the keeper's default options.
    pub fn new(client: &Client, name: Key, candidate: Owner, ttl: Duration) -> Self {
        Self {
            client: client.clone(),
            name,
            candidate,
            ttl,
            options: KeeperOptions::default(),
        }
    }

    /// How the leader's keeper renews and how early it gives up ([`KeeperOptions`]).
    pub fn keeper_options(mut self, options: KeeperOptions) -> Self {
        self.options = options;
        self
    }

    /// The election's key.
    pub fn name(&self) -> &Key {
        &self.name
    }

    /// Waits in the key's queue, for as long as it takes, until this candidate leads.
    pub async fn campaign(&self) -> Result<Leadership> {
        self.campaign_until(None).await
    }

    /// As [`campaign`](Self::campaign), but gives up after `limit` with [`Error::LeaseHeld`]
    /// (the leader then).
    pub async fn campaign_for(&self, limit: Duration) -> Result<Leadership> {
        self.campaign_until(Some(Instant::now() + limit)).await
    }

    async fn campaign_until(&self, until: Option<Instant>) -> Result<Leadership> {
        loop {
            let left = until.map_or(MAX_WAIT, |u| {
                u.saturating_duration_since(Instant::now()).min(MAX_WAIT)
            });
            let request = AcquireRequest::new(self.candidate.clone(), self.ttl).wait(left);
            match LeaseKeeper::acquire(&self.client, &self.name, &request, self.options).await {
                Ok(keeper) => return Ok(Leadership { keeper }),
                // The wait ended (the contract's bound, or the server's shorter one): ask again.
                Err(Error::LeaseHeld { .. }) if until.is_none_or(|u| Instant::now() < u) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Who leads now: the holder of the key's live lease; `None` when no lease is live.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        match self.client.lease_status(&self.name).await {
            Ok(status) => Ok(leader_of(&status)),
            Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Follows who leads: first the leader now, then each change, as the watch delivers it.
    pub async fn observe(&self) -> Result<Observe> {
        let prefix = KeyPrefix::parse(self.name.as_str()).expect("a key is a valid prefix");
        // Where the watch starts is taken before the status is read, so that a change between
        // the two is delivered, not missed; one the status already shows is recognised by its
        // token and passed over.
        let after = newest_change(&self.client, &prefix).await?;
        let mut follow = Follow {
            name: self.name.clone(),
            current: None,
            newest: None,
        };
        match self.client.lease_status(&self.name).await {
            Ok(status) => follow.read(&status),
            Err(Error::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        let mut options = WatchOptions::new().prefix(prefix);
        options.since = after;
        Ok(Observe {
            first: Some(follow.current.clone()),
            watch: self.client.watch(&options),
            follow,
        })
    }
}

/// The leader of a key's status: the holder of its live lease.
fn leader_of(status: &KeyStatus) -> Option<Leader> {
    (status.state == LeaseState::Held).then(|| Leader {
        owner: status.lease.owner.clone(),
        token: status.lease.token,
    })
}

/// Where a new watch of `prefix` starts (`Watch-After`: the newest change id when it connects);
/// `None` from a server that does not say. The connection is closed at once.
async fn newest_change(client: &Client, prefix: &KeyPrefix) -> Result<Option<ChangeId>> {
    let call = Call {
        method: reqwest::Method::GET,
        path: "/v1/watch",
    };
    let trace = TraceContext::current();
    let response = client
        .begin(
            &client.watch_http,
            reqwest::Method::GET,
            call.path,
            trace.as_ref(),
        )
        .header(header::ACCEPT, "text/event-stream")
        .query(&[("prefix", prefix.as_str())])
        .send()
        .await
        .map_err(Error::transport)?;
    let status = response.status();
    if !status.is_success() {
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(Error::transport)?;
        return Err(Error::from_answer(status, &headers, &body, &call));
    }
    Ok(response
        .headers()
        .get(WATCH_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| ChangeId::parse(v).ok()))
}

/// This candidate's leadership: the keeper of its lease ([`LeaseKeeper`]'s methods: `token`,
/// `check`, `fenced`, `lost`…). Dropping it resigns in the background.
#[derive(Debug)]
pub struct Leadership {
    keeper: LeaseKeeper,
}

impl Leadership {
    /// Gives leadership up: releases the lease, and the next candidate in line leads at once.
    /// [`Error::LeaseLost`] if it had already ended.
    pub async fn resign(self) -> Result<()> {
        self.keeper.release().await
    }

    /// The keeper of the leader's lease.
    pub fn into_keeper(self) -> LeaseKeeper {
        self.keeper
    }
}

impl Deref for Leadership {
    type Target = LeaseKeeper;

    fn deref(&self) -> &LeaseKeeper {
        &self.keeper
    }
}

/// Who leads an election, and each change of it ([`Election::observe`]).
#[derive(Debug)]
pub struct Observe {
    first: Option<Option<Leader>>,
    watch: Watch,
    follow: Follow,
}

impl Observe {
    /// The leader (`None` while nobody leads): first the leader when the observation began,
    /// then the leader after each change. `None` after the watch's last item, an error (see
    /// [`Client::watch`]).
    pub async fn next(&mut self) -> Option<Result<Option<Leader>>> {
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        loop {
            match self.watch.next().await? {
                Ok(change) => {
                    if self.follow.change(&change) {
                        return Some(Ok(self.follow.current.clone()));
                    }
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// Who leads, from a status read and the changes after it.
#[derive(Debug)]
struct Follow {
    name: Key,
    current: Option<Leader>,
    /// The newest token seen: grants up to it are already known.
    newest: Option<FencingToken>,
}

impl Follow {
    fn read(&mut self, status: &KeyStatus) {
        self.newest = Some(status.newest_token);
        self.current = leader_of(status);
    }

    /// Whether `change` changed the leader.
    fn change(&mut self, change: &ChangeEvent) -> bool {
        let data = &change.data;
        if data.key != self.name {
            return false;
        }
        match change.event {
            ChangeKind::LeaseGranted if self.newest.is_none_or(|n| data.token > n) => {
                self.newest = Some(data.token);
                self.current = data.owner.clone().map(|owner| Leader {
                    owner,
                    token: data.token,
                });
                true
            }
            ChangeKind::LeaseReleased | ChangeKind::LeaseExpired | ChangeKind::LeaseAbandoned
                if self.current.as_ref().is_some_and(|c| c.token == data.token) =>
            {
                self.current = None;
                true
            }
            _ => false,
        }
    }
}
