//! The workload: many clients over a few keys, each looping acquire (short TTL) → a few rounds
//! of fenced put, get and renew → release (or let the lease expire), through the HTTP API of one
//! or more service processes, as any user would. Every call is recorded with its invoke and
//! complete times and its outcome, for the [`checker`](crate::checker).
//!
//! Every changing call carries an `Idempotency-Key` of its own; an attempt whose outcome is
//! unknown (a timeout, a cut connection, `503 indeterminate`, `409 request_in_progress`) is sent
//! again with that key, through the next service, until it has an answer that says what
//! happened, as the project's clients do. The history records each call once, with the answer
//! that settled it; [`Recorder::figures`] counts the attempts. A client that is refused stops
//! working on the key, as the contract asks of a holder. Some holders stall past their TTL before
//! writing, the pause that fencing exists for.
//!
//! Transaction clients (`txn`) do the same with a lease on a namespace `ns-N`, writing
//! several keys `ns-N/K` at once with `POST /v1/txn` instead of one put.
//! `recorder` keeps the history, `answers` reads each answer, `end` the final state.

mod answers;
mod end;
mod recorder;
mod txn;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde_json::json;

pub use self::end::final_state;
pub use self::recorder::{Figures, Recorder};
use crate::checker::{Answer, Call, Micros, Op, Outcome};

/// How long a changing call is retried with its Idempotency-Key before it is recorded as
/// indeterminate: longer than any fault of the scenarios lasts.
const SETTLE_WITHIN: Duration = Duration::from_secs(20);

/// How much load, for how long.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Concurrent clients.
    pub clients: usize,
    /// Keys they share.
    pub keys: usize,
    /// The TTL of every lease.
    pub ttl_ms: i64,
    /// How long clients keep starting new operations.
    pub duration: Duration,
    /// The chance that a holder stalls past its TTL before a write.
    pub stall_chance: f64,
    /// Whether changing calls carry an `Idempotency-Key` (always, but in the negative control
    /// that shows what retrying without one does).
    pub idempotency_keys: bool,
    /// The fewest changing calls the run makes: past `duration`, clients keep starting new
    /// operations until this many were made (for at most three more `duration`s), so that a
    /// scenario that checks a promise over so many calls gets them on a slow machine too,
    /// rather than failing by its speed.
    pub min_changing_calls: usize,
    /// Concurrent transaction clients besides `clients`: each leases one of the namespaces
    /// and commits transactions of several puts in it (see the module's docs).
    pub txn_clients: usize,
}

impl Plan {
    /// Every key the plan's clients may write: the plain keys, and the keys of the namespaces
    /// if there are transaction clients.
    pub fn keys(&self) -> Vec<String> {
        let mut keys = self.plain_keys();
        if self.txn_clients > 0 {
            for ns in txn::namespaces() {
                keys.extend(txn::keys_of(&ns));
            }
        }
        keys
    }

    /// `key-N`, the keys only the plain clients write.
    fn plain_keys(&self) -> Vec<String> {
        (0..self.keys).map(|k| format!("key-{k}")).collect()
    }

    /// The keys the plain clients lease and put: the plain keys, and with transaction clients
    /// the first key of each namespace too, so that a key is written under two fences (its
    /// own lease's and its namespace's) and its tokens must still only go forward.
    fn lease_keys(&self) -> Vec<String> {
        let mut keys = self.plain_keys();
        if self.txn_clients > 0 {
            keys.extend(
                txn::namespaces()
                    .iter()
                    .map(|ns| txn::keys_of(ns)[0].clone()),
            );
        }
        keys
    }
}

/// A key as a path segment: the workload's keys are ASCII, and only `/` needs encoding.
fn in_path(key: &str) -> String {
    key.replace('/', "%2F")
}

/// The wall clock in microseconds: the clock the database decides expiry by.
pub fn now() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros() as Micros
}

/// Runs the plan against the services at `endpoints` (client `i` starts at endpoint
/// `i % len`) and returns when every client has finished.
pub async fn run(plan: Plan, endpoints: Vec<String>, recorder: Arc<Recorder>) {
    let http = reqwest::Client::builder()
        // Above the service's database timeout: a service that answers at all answers first.
        .timeout(Duration::from_secs(3))
        .build()
        .expect("an HTTP client");
    let deadline = Instant::now() + plan.duration;
    let clients: Vec<_> = (0..plan.clients + plan.txn_clients)
        .map(|id| {
            let client = Client {
                id,
                http: http.clone(),
                at: id % endpoints.len(),
                endpoints: endpoints.clone(),
                recorder: recorder.clone(),
                plan: plan.clone(),
            };
            let work = if id < plan.clients {
                Work::Keys
            } else {
                Work::Namespaces
            };
            tokio::spawn(client.run(work, deadline))
        })
        .collect();
    for c in clients {
        c.await.expect("a client task");
    }
}

/// Acquires each of `keys` once, one after the other, through the service at `endpoint`, as
/// one more client of `plan`, recording each call.
pub async fn acquire_each(plan: &Plan, endpoint: String, recorder: Arc<Recorder>, keys: &[String]) {
    let mut client = Client {
        id: plan.clients + plan.txn_clients,
        http: reqwest::Client::new(),
        endpoints: vec![endpoint],
        at: 0,
        recorder,
        plan: plan.clone(),
    };
    for key in keys {
        client.acquire(key).await;
    }
}

struct Client {
    id: usize,
    http: reqwest::Client,
    endpoints: Vec<String>,
    at: usize,
    recorder: Arc<Recorder>,
    plan: Plan,
}

/// What a client leases and writes.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// A key, written by fenced puts.
    Keys,
    /// A namespace, written by transactions.
    Namespaces,
}

/// Milliseconds, at random in `range`.
fn pause(range: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(rand::rng().random_range(range))
}

/// The ETag the server gives a body: its quoted SHA-256.
fn etag_of(body: &str) -> String {
    snapfence::domain::ETag::of(body.as_bytes())
        .as_str()
        .to_owned()
}

impl Client {
    /// Whether to start another operation: until the plan's deadline, then for as long as the
    /// run has made fewer than its fewest changing calls (within three more durations), unless
    /// the scenario stopped the clients.
    fn goes_on(&self, deadline: Instant) -> bool {
        let now = Instant::now();
        let short =
            self.recorder.changing_calls.load(Ordering::Relaxed) < self.plan.min_changing_calls;
        !self.recorder.stopped()
            && (now < deadline || short && now < deadline + self.plan.duration * 3)
    }

    async fn run(mut self, work: Work, deadline: Instant) {
        let keys = match work {
            Work::Keys => self.plan.lease_keys(),
            Work::Namespaces => txn::namespaces(),
        };
        let ttl = self.plan.ttl_ms as u64;
        while self.goes_on(deadline) {
            let key = keys[rand::rng().random_range(0..keys.len())].clone();
            let token = match self.acquire(&key).await {
                Outcome::Ok(Answer::Granted { token }) => token,
                Outcome::Indeterminate(_) => {
                    tokio::time::sleep(pause(20..100)).await;
                    continue;
                }
                _ => {
                    tokio::time::sleep(pause(5..ttl / 2)).await;
                    continue;
                }
            };
            self.hold(work, &key, token, ttl).await;
        }
    }

    /// What a holder does with its lease: a few writes (puts of its key, or transactions in its
    /// namespace), reads and renewals, then release or walk away. Stops at the first refusal or
    /// indeterminate answer.
    async fn hold(&mut self, work: Work, key: &str, token: i64, ttl: u64) {
        let rounds = rand::rng().random_range(1..=4);
        for _ in 0..rounds {
            let stall = rand::rng().random_bool(self.plan.stall_chance);
            let wait = if stall {
                pause(ttl * 2..ttl * 3)
            } else {
                pause(0..ttl / 4)
            };
            tokio::time::sleep(wait).await;
            let written = match work {
                Work::Keys => self.put(key, token).await,
                Work::Namespaces => self.txn(key, token).await,
            };
            if !matches!(written, Outcome::Ok(_)) {
                return;
            }
            if rand::rng().random_bool(0.5) {
                let read = match work {
                    Work::Keys => key.to_owned(),
                    Work::Namespaces => txn::any_key_of(key),
                };
                self.get(&read).await;
            }
            if rand::rng().random_bool(0.3) {
                let renewed = self
                    .call(
                        key,
                        Call::Renew {
                            token,
                            ttl_ms: self.plan.ttl_ms,
                        },
                    )
                    .await;
                if !matches!(renewed, Outcome::Ok(_)) {
                    return;
                }
            }
        }
        if rand::rng().random_bool(0.7) {
            self.call(key, Call::Release { token }).await;
        }
    }

    async fn acquire(&mut self, key: &str) -> Outcome {
        self.call(
            key,
            Call::Acquire {
                ttl_ms: self.plan.ttl_ms,
            },
        )
        .await
    }

    async fn put(&mut self, key: &str, token: i64) -> Outcome {
        // The body names the operation, so every body of the run, and its ETag, is unique.
        let id = self.recorder.next_id.fetch_add(1, Ordering::Relaxed);
        let body = format!("client {} op {id}", self.id);
        let call = Call::Put {
            token,
            etag: etag_of(&body),
        };
        self.record(id, key, call, Some(body)).await
    }

    async fn get(&mut self, key: &str) -> Outcome {
        self.call(key, Call::Get).await
    }

    async fn call(&mut self, key: &str, call: Call) -> Outcome {
        let id = self.recorder.next_id.fetch_add(1, Ordering::Relaxed);
        self.record(id, key, call, None).await
    }

    /// Sends one call, waits for an answer that settles it (retrying a changing call with
    /// its Idempotency-Key while the outcome is unknown), and records the operation.
    async fn record(&mut self, id: u64, key: &str, call: Call, body: Option<String>) -> Outcome {
        let changing = !matches!(call, Call::Get);
        let owner = format!("client-{}/op-{id}", self.id);
        let invoked = now();
        let give_up = Instant::now() + SETTLE_WITHIN;
        if changing {
            self.recorder.changing_calls.fetch_add(1, Ordering::Relaxed);
        }
        let is_txn = matches!(call, Call::Txn { .. });
        let mut uncertain = false;
        let outcome = loop {
            let request = self
                .request(key, &call, &owner, body.clone())
                .header("x-request-id", format!("op-{id}"));
            let request = if changing && self.plan.idempotency_keys {
                request.header("idempotency-key", format!("op-{id}"))
            } else {
                request
            };
            let endpoint = self.endpoints[self.at].clone();
            if is_txn {
                self.recorder.txn_sent(&endpoint, 1);
            }
            let sent = Instant::now();
            let answer = request.send().await;
            let waited = sent.elapsed().as_micros() as u64;
            if is_txn {
                self.recorder.txn_sent(&endpoint, -1);
            }
            self.recorder
                .slowest_attempt_us
                .fetch_max(waited, Ordering::Relaxed);
            if answer.as_ref().is_err_and(reqwest::Error::is_timeout) {
                self.recorder
                    .timed_out_attempts
                    .fetch_add(1, Ordering::Relaxed);
            }
            if answer
                .as_ref()
                .is_ok_and(|r| r.headers().get("idempotent-replayed").is_some())
            {
                self.recorder.replays.fetch_add(1, Ordering::Relaxed);
                if is_txn {
                    self.recorder.txn_replays.fetch_add(1, Ordering::Relaxed);
                }
            }
            let outcome = answers::outcome(&call, &owner, answer).await;
            let unknown = matches!(outcome, Outcome::Indeterminate(_))
                || matches!(&outcome, Outcome::Refused { code, .. } if code == "request_in_progress");
            if unknown {
                // Another service may answer where this one could not.
                self.at = (self.at + 1) % self.endpoints.len();
            }
            // After an attempt whose outcome is unknown, `503 unavailable` speaks for its own
            // attempt only: the call is settled by an answer that says what happened.
            let unsettled = unknown || (uncertain && matches!(outcome, Outcome::NoEffect));
            uncertain |= unknown;
            if !(changing && unsettled) {
                break outcome;
            }
            if Instant::now() >= give_up {
                break Outcome::Indeterminate(format!("still unsettled after {SETTLE_WITHIN:?}"));
            }
            self.recorder
                .unknown_attempts
                .fetch_add(1, Ordering::Relaxed);
            if is_txn {
                self.recorder
                    .txn_unknown_attempts
                    .fetch_add(1, Ordering::Relaxed);
            }
            tokio::time::sleep(pause(20..100)).await;
        };
        let completed = now();
        self.recorder.ops.lock().unwrap().push(Op {
            id,
            client: self.id,
            key: key.to_owned(),
            call,
            invoked,
            completed,
            outcome: outcome.clone(),
        });
        outcome
    }

    /// One attempt of `call` on the current service.
    fn request(
        &self,
        key: &str,
        call: &Call,
        owner: &str,
        body: Option<String>,
    ) -> reqwest::RequestBuilder {
        let base = &self.endpoints[self.at];
        let leases = format!("{base}/v1/leases/{}", in_path(key));
        let snapshot = format!("{base}/v1/snapshots/{}", in_path(key));
        match call {
            Call::Acquire { ttl_ms } => self
                .http
                .post(&leases)
                .json(&json!({"owner": owner, "ttl_ms": ttl_ms})),
            Call::Renew { token, ttl_ms } => self
                .http
                .post(format!("{leases}/renew"))
                .json(&json!({"token": token, "ttl_ms": ttl_ms})),
            Call::Release { token } => self
                .http
                .delete(&leases)
                .header("Fencing-Token", token.to_string()),
            Call::Put { token, .. } => self
                .http
                .put(&snapshot)
                .header("Fencing-Token", token.to_string())
                .body(body.unwrap_or_default()),
            Call::Get => self.http.get(&snapshot),
            Call::Txn { token, .. } => self
                .http
                .post(format!("{base}/v1/txn"))
                .header("Fencing-Key", in_path(key))
                .header("Fencing-Token", token.to_string())
                .header("Content-Type", "application/json")
                .body(body.unwrap_or_default()),
        }
    }
}
