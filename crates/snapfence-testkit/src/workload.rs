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

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::Rng;
use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use crate::checker::{
    Answer, AuditRow, Call, FinalState, INDETERMINATE, Micros, Op, Outcome, UNREPORTED_GRANT,
    Version,
};

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
}

impl Plan {
    /// The keys of the plan.
    pub fn keys(&self) -> Vec<String> {
        (0..self.keys).map(|k| format!("key-{k}")).collect()
    }
}

/// The wall clock in microseconds: the clock the database decides expiry by.
pub fn now() -> Micros {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_micros() as Micros
}

/// Every operation of a run, appended as each completes, and the figures of its attempts.
#[derive(Default)]
pub struct Recorder {
    ops: Mutex<Vec<Op>>,
    next_id: AtomicU64,
    changing_calls: AtomicUsize,
    unknown_attempts: AtomicUsize,
    replays: AtomicUsize,
    timed_out_attempts: AtomicUsize,
    slowest_attempt_us: AtomicU64,
    stopped: AtomicBool,
}

/// What the attempts of a run's changing calls came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Figures {
    /// Changing calls (acquire, renew, release, put), each with its own Idempotency-Key.
    pub changing_calls: usize,
    /// Attempts whose outcome was unknown, each sent again with its call's key.
    pub unknown_attempts: usize,
    /// Answers the service replayed from a key's record (`Idempotent-Replayed: true`).
    pub replays: usize,
    /// Attempts of any call that the client gave up on (its timeout) without an answer.
    pub timed_out_attempts: usize,
    /// The longest any one attempt waited for its answer (or its failure).
    pub slowest_attempt: Duration,
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} changing calls, {} attempts with an unknown outcome sent again (with their call's \
             Idempotency-Key, if it has one), {} answers replayed; slowest attempt {} ms, {} attempts timed out",
            self.changing_calls,
            self.unknown_attempts,
            self.replays,
            self.slowest_attempt.as_millis(),
            self.timed_out_attempts
        )
    }
}

impl Recorder {
    /// The figures of the attempts so far.
    pub fn figures(&self) -> Figures {
        Figures {
            changing_calls: self.changing_calls.load(Ordering::Relaxed),
            unknown_attempts: self.unknown_attempts.load(Ordering::Relaxed),
            replays: self.replays.load(Ordering::Relaxed),
            timed_out_attempts: self.timed_out_attempts.load(Ordering::Relaxed),
            slowest_attempt: Duration::from_micros(self.slowest_attempt_us.load(Ordering::Relaxed)),
        }
    }

    /// The history so far.
    pub fn history(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// Tells the clients to start no new operation, before the plan's duration is up: for a
    /// scenario that runs until its faults are over rather than for a fixed time.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// When the first write acknowledged after `at` was acknowledged: the end of an outage that
    /// began at `at`, as the clients saw it. Only writes sent at or after `at` count, so that a
    /// write that merely finished late does not close the window.
    pub fn first_write_after(&self, at: Micros) -> Option<Micros> {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.invoked >= at && matches!(o.outcome, Outcome::Ok(Answer::Written { .. })))
            .map(|o| o.completed)
            .min()
    }

    /// The longest stretch of `[from, to]` in which no write was acknowledged: an outage as the
    /// clients felt it, wherever in that span it fell (a leader cut off from its consensus
    /// store keeps accepting writes for a while after the fault, then none until a successor
    /// does).
    pub fn longest_without_writes(&self, from: Micros, to: Micros) -> Duration {
        let mut acknowledged: Vec<Micros> = self
            .ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Ok(Answer::Written { .. })))
            .map(|o| o.completed)
            .filter(|at| (from..=to).contains(at))
            .collect();
        acknowledged.sort_unstable();
        let bounds = std::iter::once(from)
            .chain(acknowledged)
            .chain(std::iter::once(to));
        let longest = bounds
            .clone()
            .zip(bounds.skip(1))
            .map(|(a, b)| b - a)
            .max()
            .unwrap_or_default();
        Duration::from_micros(longest.max(0) as u64)
    }

    /// The largest token granted so far.
    pub fn highest_token(&self) -> Option<i64> {
        self.ops
            .lock()
            .unwrap()
            .iter()
            .filter_map(|o| match o.outcome {
                Outcome::Ok(Answer::Granted { token }) => Some(token),
                _ => None,
            })
            .max()
    }
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
    let clients: Vec<_> = (0..plan.clients)
        .map(|id| {
            let client = Client {
                id,
                http: http.clone(),
                at: id % endpoints.len(),
                endpoints: endpoints.clone(),
                recorder: recorder.clone(),
                plan: plan.clone(),
            };
            tokio::spawn(client.run(deadline))
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
        id: plan.clients,
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

    async fn run(mut self, deadline: Instant) {
        let keys = self.plan.keys();
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
            self.hold(&key, token, ttl).await;
        }
    }

    /// What a holder does with its lease: a few writes, reads and renewals, then release or
    /// walk away. Stops at the first refusal or indeterminate answer.
    async fn hold(&mut self, key: &str, token: i64, ttl: u64) {
        let rounds = rand::rng().random_range(1..=4);
        for _ in 0..rounds {
            let stall = rand::rng().random_bool(self.plan.stall_chance);
            let wait = if stall {
                pause(ttl * 2..ttl * 3)
            } else {
                pause(0..ttl / 4)
            };
            tokio::time::sleep(wait).await;
            if !matches!(self.put(key, token).await, Outcome::Ok(_)) {
                return;
            }
            if rand::rng().random_bool(0.5) {
                self.get(key).await;
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
            let sent = Instant::now();
            let answer = request.send().await;
            let waited = sent.elapsed().as_micros() as u64;
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
            }
            let outcome = outcome(&call, &owner, answer).await;
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
        let leases = format!("{base}/v1/leases/{key}");
        let snapshot = format!("{base}/v1/snapshots/{key}");
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
        }
    }
}

/// What an answer (or its absence) says about the call; `owner` is the owner an acquire asked
/// for, which no other call's lease has.
async fn outcome(call: &Call, owner: &str, answer: reqwest::Result<Response>) -> Outcome {
    let r = match answer {
        Ok(r) => r,
        Err(e) => return Outcome::Indeterminate(transport_error(&e)),
    };
    let status = r.status();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // The contract's two 503s: `unavailable` promises that nothing changed, `indeterminate`
        // does not. Anything else (a proxy's 503, a body that cannot be read) promises nothing.
        let code = r
            .json::<Value>()
            .await
            .ok()
            .and_then(|p| p["code"].as_str().map(str::to_owned));
        return match code.as_deref() {
            Some("unavailable") => Outcome::NoEffect,
            Some("indeterminate") => Outcome::Indeterminate(INDETERMINATE.into()),
            _ => Outcome::Indeterminate(format!("503 with the code {code:?}")),
        };
    }
    if matches!(call, Call::Get) && status == StatusCode::OK {
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let seen = (|| {
            Some(Version {
                version: header("snapshot-version")?.parse().ok()?,
                token: header("fencing-token")?.parse().ok()?,
                etag: header("etag")?,
            })
        })();
        return match seen {
            Some(v) => Outcome::Ok(Answer::Read(Some(v))),
            None => Outcome::Unexpected("a snapshot without its headers".into()),
        };
    }
    let body: Value = match r.bytes().await {
        Ok(bytes) if bytes.is_empty() => Value::Null,
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => return Outcome::Unexpected(format!("{status} with a body that is not JSON")),
        },
        Err(e) => return Outcome::Indeterminate(transport_error(&e)),
    };
    let number = |field: &str| body[field].as_i64();
    match (call, status.as_u16()) {
        (Call::Acquire { .. }, 201) => number("token").map_or_else(
            || Outcome::Unexpected(format!("a grant without a token: {body}")),
            |token| Outcome::Ok(Answer::Granted { token }),
        ),
        (Call::Renew { .. }, 200) | (Call::Release { .. }, 204) => Outcome::Ok(Answer::Done),
        (Call::Put { .. }, 200 | 201) => number("version").map_or_else(
            || Outcome::Unexpected(format!("a write without a version: {body}")),
            |version| Outcome::Ok(Answer::Written { version }),
        ),
        (Call::Get, 404) => Outcome::Ok(Answer::Read(None)),
        (Call::Acquire { .. }, 409) if body["holder"]["owner"] == owner => {
            Outcome::Unexpected(UNREPORTED_GRANT.into())
        }
        (_, 409 | 412) => match body["code"].as_str() {
            Some(code) => Outcome::Refused {
                code: code.to_owned(),
                audit_id: number("audit_id"),
            },
            None => Outcome::Unexpected(format!("{status} without a code: {body}")),
        },
        _ => Outcome::Unexpected(format!("{status}: {body}")),
    }
}

fn transport_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection refused".into()
    } else {
        "connection lost".into()
    }
}

/// What the service holds at the end: every version of every key and the whole rejections
/// log, read through the API of the service at `base`. Retried for a while, since the service
/// may still be reconnecting after the last fault.
pub async fn final_state(base: &str, keys: &[String]) -> FinalState {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match read_final_state(&http, base, keys).await {
            Ok(state) => return state,
            Err(e) if Instant::now() < deadline => {
                eprintln!("reading the final state: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("could not read the final state: {e}"),
        }
    }
}

async fn read_final_state(
    http: &reqwest::Client,
    base: &str,
    keys: &[String],
) -> Result<FinalState, String> {
    let mut end = FinalState::default();
    for key in keys {
        let mut versions: Vec<Version> =
            pages(http, &format!("{base}/v1/snapshots/{key}/versions"))
                .await?
                .into_iter()
                .map(|v| Version {
                    version: v["version"].as_i64().unwrap_or_default(),
                    token: v["token"].as_i64().unwrap_or_default(),
                    etag: v["etag"].as_str().unwrap_or_default().to_owned(),
                })
                .collect();
        versions.reverse();
        if !versions.is_empty() {
            end.versions.insert(key.clone(), versions);
        }
    }
    end.rejections = pages(http, &format!("{base}/v1/audit/rejections"))
        .await?
        .into_iter()
        .map(|r| AuditRow {
            id: r["id"].as_i64().unwrap_or_default(),
            request_id: r["request_id"].as_str().map(str::to_owned),
            key: r["key"].as_str().unwrap_or_default().to_owned(),
            reason: r["reason"].as_str().unwrap_or_default().to_owned(),
            presented_token: r["presented_token"].as_i64().unwrap_or_default(),
        })
        .collect();
    Ok(end)
}

/// Every item of a paged list; a list of a key with no snapshot is empty.
async fn pages(http: &reqwest::Client, url: &str) -> Result<Vec<Value>, String> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut request = http.get(url).query(&[("limit", "1000")]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let r = request.send().await.map_err(|e| e.to_string())?;
        if r.status() == StatusCode::NOT_FOUND {
            return Ok(items);
        }
        if r.status() != StatusCode::OK {
            return Err(format!("{url} answered {}", r.status()));
        }
        let page: Value = r.json().await.map_err(|e| e.to_string())?;
        items.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(items),
        }
    }
}
