//! What one request of each kind is against each target, and how a worker prepares and checks
//! its keys.

use std::ops::Range;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use super::{EtcdLock, Op, prefixed};
use snapfence_client::{AcquireRequest, Client, Error, PutOptions, TxnOp, TxnOpResult};
use snapfence_client::{FencingToken, Key, LeaseState, Owner, Version};

/// The TTL of the leases an `acquire` run takes: the shortest the default bounds allow, so each
/// has expired by the time its worker comes back to its key.
pub(super) const ACQUIRE_TTL: Duration = Duration::from_millis(100);
/// The TTL of the leases that `renew`, `put`, `get` and `mixed` (and a watch run's writers)
/// hold through the run.
pub(super) const HELD_TTL: Duration = Duration::from_secs(600);
/// The TTL of a `lock` cycle's lease, released at once: long enough never to lapse on its own.
const LOCK_TTL: Duration = Duration::from_secs(60);
/// The TTL of an etcd lease grant (a `grant`, a `per-lock` cycle's lease), in seconds.
const ETCD_LEASE_TTL: u64 = 60;
/// The TTL of a worker's etcd session lease, in seconds: longer than any run, so that it needs
/// no keep-alive stream.
const ETCD_SESSION_TTL: i64 = 24 * 3600;
/// The token an etcd fence key holds through a run.
const ETCD_FENCE: &str = "1";

/// A code for an answer that is a success but not the right one (a wrong version or token, a
/// body of the wrong size): the benchmark counts it as an error and the run fails its check.
pub(super) const WRONG_ANSWER: &str = "wrong_answer";

/// The service a run loads.
pub(super) enum Target {
    /// snapfence, through the crate's own client (without retries: every failure is counted).
    Snapfence(Client),
    /// etcd's v3 JSON gateway.
    Etcd {
        /// Keep-alive connections to it.
        http: reqwest::Client,
        /// `http://host:port`.
        base: String,
    },
    /// etcd's native gRPC API, through the `etcd-client` crate (one HTTP/2 connection, its
    /// requests multiplexed, as etcd's own clients use it).
    #[cfg(feature = "etcd-grpc")]
    EtcdGrpc(Box<etcd_client::Client>),
}

/// Refuses the operations etcd has no equivalent of.
fn etcd_has(op: Op) -> Result<(), String> {
    match op {
        Op::Renew | Op::Mixed | Op::Nsput | Op::Txn | Op::Flood => Err(format!(
            "etcd has no equivalent of --op {op:?}; use lock, put or get"
        )),
        Op::Acquire => Err(
            "etcd has no acquire that keeps a key alone: use --op lock (acquire \
            and release, the same work on both sides) or --op grant (a bare lease grant, as a \
            calibration)"
                .to_owned(),
        ),
        _ => Ok(()),
    }
}

/// Refuses the timing runs over etcd's JSON gateway: its `Lock` and `Watch` are streams or
/// long calls, which the gRPC target alone times as etcd's clients see them.
fn etcd_gateway_has(op: Op) -> Result<(), String> {
    if matches!(op, Op::Handoff | Op::Expiry | Op::Watch) {
        return Err(format!(
            "--op {op:?} against etcd runs over gRPC only: use --target etcd-grpc"
        ));
    }
    etcd_has(op)
}

impl Target {
    /// The snapfence target, for the operations it has.
    pub(super) fn snapfence(client: Result<Client, String>, op: Op) -> Result<Self, String> {
        if op == Op::Grant {
            return Err(
                "--op grant is etcd's bare lease grant, with --target etcd or etcd-grpc; \
                snapfence's grant of a key is --op acquire"
                    .to_owned(),
            );
        }
        client.map(Self::Snapfence)
    }

    /// The etcd gRPC target at `url` (`http://host:port`), for the operations it has an
    /// equivalent of.
    #[cfg(feature = "etcd-grpc")]
    pub(super) async fn etcd_grpc(url: &str, timeout: Duration, op: Op) -> Result<Self, String> {
        etcd_has(op)?;
        let options = etcd_client::ConnectOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout);
        etcd_client::Client::connect([url.trim_end_matches('/')], Some(options))
            .await
            .map(|c| Self::EtcdGrpc(Box::new(c)))
            .map_err(|e| format!("cannot connect to etcd at {url} ({e}); is it up?"))
    }

    /// The etcd target, for the operations it has an equivalent of.
    pub(super) fn etcd(url: &str, timeout: Duration, op: Op) -> Result<Self, String> {
        etcd_gateway_has(op)?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
        Ok(Self::Etcd {
            http,
            base: url.trim_end_matches('/').to_owned(),
        })
    }
}

/// What a worker knows of one of its keys.
struct KeyState {
    key: Key,
    /// The token of the worker's lease on it.
    token: Option<FencingToken>,
    /// The version of its newest accepted write (0 before any); of the keys under it too, for
    /// `nsput` and `txn`, which write all of them at every request.
    version: i64,
}

/// How many puts a `txn` request makes.
const TXN_PUTS: usize = 10;

/// One of the concurrent workers, with the keys it alone uses.
pub(super) struct Worker {
    keys: Vec<KeyState>,
    next: usize,
    owner: Owner,
    body: Bytes,
    rng: SmallRng,
    /// How an etcd `lock` cycle is done.
    etcd_lock: EtcdLock,
    /// An etcd `session` cycle's lease, granted while preparing.
    session: Option<i64>,
    /// A `lock` run's: every key's last cycle ended with a release.
    released: bool,
    /// What each key's writes wrote: the key itself (""), or the keys under it (`nsput`, `txn`).
    written: Vec<String>,
}

impl Worker {
    /// Worker `id`, with the keys `{prefix}{i}` for `i` in `keys`.
    pub(super) fn new(
        id: usize,
        prefix: &str,
        keys: Range<usize>,
        body: Bytes,
        etcd_lock: EtcdLock,
    ) -> Result<Self, String> {
        let keys = keys
            .map(|i| {
                prefixed(prefix, i).map(|key| KeyState {
                    key,
                    token: None,
                    version: 0,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            keys,
            next: 0,
            owner: Owner::parse(format!("bench-{id}")).expect("a valid owner"),
            body,
            rng: SmallRng::seed_from_u64(id as u64),
            etcd_lock,
            session: None,
            released: false,
            written: vec![String::new()],
        })
    }

    /// Makes the worker's keys ready for `op`: leases for everything but an etcd run, and a
    /// first snapshot for reads.
    pub(super) async fn prepare(
        &mut self,
        target: &Target,
        op: Op,
        bar: &ProgressBar,
    ) -> Result<(), String> {
        if op == Op::Lock && self.etcd_lock == EtcdLock::Session {
            self.session = match target {
                Target::Snapfence(_) => None,
                Target::Etcd { .. } => Some(
                    etcd_grant(target, ETCD_SESSION_TTL)
                        .await
                        .map_err(|code| format!("granting the session lease failed ({code})"))?,
                ),
                #[cfg(feature = "etcd-grpc")]
                Target::EtcdGrpc(etcd) => Some(
                    etcd.clone()
                        .lease_grant(ETCD_SESSION_TTL, None)
                        .await
                        .map_err(|e| format!("granting the session lease failed ({e})"))?
                        .id(),
                ),
            };
        }
        for i in 0..self.keys.len() {
            let ready = match (target, op) {
                (_, Op::Lock | Op::Grant) => Ok(()),
                (Target::Snapfence(client), Op::Acquire) => {
                    self.acquire(client, i, ACQUIRE_TTL).await
                }
                (Target::Snapfence(client), _) => {
                    self.acquire(client, i, HELD_TTL).await?;
                    if matches!(op, Op::Get | Op::Mixed) {
                        self.put(client, i).await?;
                    }
                    Ok(())
                }
                (Target::Etcd { .. }, Op::Put) => {
                    let fence = self.etcd_fence(i);
                    etcd_call(target, "kv/put", json!({"key": fence.0, "value": fence.1}))
                        .await
                        .map(drop)
                }
                (Target::Etcd { .. }, Op::Get) => {
                    let body =
                        json!({"key": self.etcd_body_key(i), "value": STANDARD.encode(&self.body)});
                    etcd_call(target, "kv/put", body).await.map(drop)
                }
                #[cfg(feature = "etcd-grpc")]
                (Target::EtcdGrpc(etcd), Op::Put) => etcd
                    .clone()
                    .put(self.fence_key(i), ETCD_FENCE, None)
                    .await
                    .map(drop)
                    .map_err(grpc_code),
                #[cfg(feature = "etcd-grpc")]
                (Target::EtcdGrpc(etcd), Op::Get) => etcd
                    .clone()
                    .put(self.body_key(i), self.body.to_vec(), None)
                    .await
                    .map(drop)
                    .map_err(grpc_code),
                (Target::Etcd { .. }, _) => Ok(()),
                #[cfg(feature = "etcd-grpc")]
                (Target::EtcdGrpc(_), _) => Ok(()),
            };
            ready.map_err(|code| {
                format!(
                    "preparing key {} failed ({code}); is the server at --url up, and is --prefix free?",
                    self.keys[i].key
                )
            })?;
            bar.inc(1);
        }
        Ok(())
    }

    /// One request of the run; `Err` holds the code it is counted under.
    pub(super) async fn op(&mut self, target: &Target, op: Op) -> Result<(), String> {
        let i = self.next;
        self.next = (self.next + 1) % self.keys.len();
        let op = match op {
            Op::Mixed => match self.rng.random_range(0..10) {
                0..7 => Op::Get,
                7..9 => Op::Put,
                _ => Op::Renew,
            },
            op => op,
        };
        match (target, op) {
            (Target::Snapfence(client), Op::Acquire) => self.acquire(client, i, ACQUIRE_TTL).await,
            (Target::Snapfence(client), Op::Lock) => {
                self.released = true;
                self.acquire(client, i, LOCK_TTL).await?;
                let state = &self.keys[i];
                client
                    .release(&state.key, state.token.expect("just granted"))
                    .await
                    .map_err(|e| code(&e))
            }
            (Target::Snapfence(client), Op::Renew) => {
                let state = &self.keys[i];
                let token = state.token.expect("prepared");
                let lease = client
                    .renew(&state.key, token, Some(HELD_TTL))
                    .await
                    .map_err(|e| code(&e))?;
                check(lease.token == token)
            }
            (Target::Snapfence(client), Op::Put) => self.put(client, i).await,
            (Target::Snapfence(client), Op::Nsput) => self.nsput(client, i).await,
            (Target::Snapfence(client), Op::Txn) => self.txn(client, i).await,
            (Target::Snapfence(client), _) => {
                let state = &self.keys[i];
                let read = client
                    .get_snapshot(&state.key)
                    .await
                    .map_err(|e| code(&e))?;
                check(
                    read.body.len() == self.body.len() && read.head.version.get() == state.version,
                )
            }
            (Target::Etcd { .. }, Op::Grant) => {
                etcd_grant(target, ETCD_LEASE_TTL as i64).await.map(drop)
            }
            (Target::Etcd { .. }, Op::Lock) => self.etcd_lock(target, i).await,
            (Target::Etcd { .. }, Op::Put) => self.etcd_put(target, i).await,
            (Target::Etcd { .. }, _) => {
                let read =
                    etcd_call(target, "kv/range", json!({"key": self.etcd_body_key(i)})).await?;
                let size = read["kvs"][0]["value"].as_str().map_or(0, str::len);
                check(size == self.body.len().div_ceil(3) * 4)
            }
            #[cfg(feature = "etcd-grpc")]
            (Target::EtcdGrpc(etcd), Op::Lock) => self.grpc_lock(etcd, i).await,
            #[cfg(feature = "etcd-grpc")]
            (Target::EtcdGrpc(etcd), Op::Grant) => {
                let granted = etcd
                    .clone()
                    .lease_grant(ETCD_LEASE_TTL as i64, None)
                    .await
                    .map_err(grpc_code)?;
                check(granted.id() != 0)
            }
            #[cfg(feature = "etcd-grpc")]
            (Target::EtcdGrpc(etcd), Op::Put) => {
                use etcd_client::{Compare, CompareOp, Txn, TxnOp};
                let fence = self.fence_key(i);
                let txn = Txn::new()
                    .when([Compare::value(fence.clone(), CompareOp::Equal, ETCD_FENCE)])
                    .and_then([
                        TxnOp::put(fence, ETCD_FENCE, None),
                        TxnOp::put(self.body_key(i), self.body.to_vec(), None),
                    ]);
                let answer = etcd.clone().txn(txn).await.map_err(grpc_code)?;
                check(answer.succeeded())
            }
            #[cfg(feature = "etcd-grpc")]
            (Target::EtcdGrpc(etcd), _) => {
                let read = etcd
                    .clone()
                    .get(self.body_key(i), None)
                    .await
                    .map_err(grpc_code)?;
                check(read.kvs().first().map(|kv| kv.value().len()) == Some(self.body.len()))
            }
        }
    }

    /// After the run: every key's newest token is still this worker's, and its snapshot is the
    /// version the accepted writes counted up to, written with that token. Nothing can have been
    /// counted as accepted that the server did not keep.
    pub(super) async fn verify(&self, target: &Target, bar: &ProgressBar) -> Result<(), String> {
        let Target::Snapfence(client) = target else {
            bar.inc(self.keys.len() as u64);
            return Ok(());
        };
        for state in &self.keys {
            let Some(token) = state.token else {
                bar.inc(1);
                continue;
            };
            let failed = |what: String| format!("check of key {}: {what}", state.key);
            let status = client
                .lease_status(&state.key)
                .await
                .map_err(|e| failed(e.to_string()))?;
            if status.newest_token != token {
                return Err(failed(format!(
                    "the newest token is {}, not this run's {token}",
                    status.newest_token
                )));
            }
            if status.state != LeaseState::Held && state.version > 0 {
                return Err(failed(format!("the lease is {:?}, not held", status.state)));
            }
            if self.released && status.state != LeaseState::Released {
                return Err(failed(format!(
                    "the lease is {:?}, not released",
                    status.state
                )));
            }
            for suffix in self.written.iter().filter(|_| state.version > 0) {
                let key = Key::parse(format!("{}{suffix}", state.key))
                    .map_err(|e| failed(e.to_string()))?;
                let head = client
                    .head_snapshot(&key)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                if head.version.get() != state.version || head.token != token {
                    return Err(failed(format!(
                        "{key}'s snapshot is version {} by token {}; the run counted {} accepted writes ending with token {token}",
                        head.version, head.token, state.version
                    )));
                }
                if !suffix.is_empty() && head.fencing_key.as_ref() != Some(&state.key) {
                    return Err(failed(format!("{key} was not fenced by {}", state.key)));
                }
            }
            bar.inc(1);
        }
        Ok(())
    }

    async fn acquire(&mut self, client: &Client, i: usize, ttl: Duration) -> Result<(), String> {
        let state = &mut self.keys[i];
        let grant = client
            .acquire(&state.key, &AcquireRequest::new(self.owner.clone(), ttl))
            .await
            .map_err(|e| code(&e))?;
        let fresh = state.token.is_none_or(|old| grant.lease.token > old);
        state.token = Some(grant.lease.token);
        check(fresh)
    }

    /// A fenced write, which must come back as the key's next version under this worker's token.
    async fn put(&mut self, client: &Client, i: usize) -> Result<(), String> {
        let key = self.keys[i].key.clone();
        self.write(client, i, &key, &PutOptions::default()).await
    }

    /// A fenced write of `{key}/s`, under the namespace of the worker's lease on key `i`.
    async fn nsput(&mut self, client: &Client, i: usize) -> Result<(), String> {
        self.written = vec!["/s".to_owned()];
        let fence = self.keys[i].key.clone();
        let child = Key::parse(format!("{fence}/s")).map_err(|e| e.to_string())?;
        let options = PutOptions {
            fence: Some(fence),
            ..PutOptions::default()
        };
        self.write(client, i, &child, &options).await
    }

    /// A write of `key` with the token of the worker's lease on key `i`, counted as that key's.
    async fn write(
        &mut self,
        client: &Client,
        i: usize,
        key: &Key,
        options: &PutOptions,
    ) -> Result<(), String> {
        let state = &mut self.keys[i];
        let token = state.token.expect("prepared");
        let written = client
            .put_snapshot(key, token, self.body.clone(), options)
            .await
            .map_err(|e| code(&e))?;
        let expected = state.version + 1;
        state.version = written.meta.version.get();
        check(written.meta.token == token && written.meta.version == Version::from_stored(expected))
    }

    /// A transaction of [`TXN_PUTS`] puts of `{key}/t{n}`, under the namespace of the worker's
    /// lease on key `i`: each must come back as its key's next version.
    async fn txn(&mut self, client: &Client, i: usize) -> Result<(), String> {
        self.written = (0..TXN_PUTS).map(|n| format!("/t{n}")).collect();
        let state = &mut self.keys[i];
        let token = state.token.expect("prepared");
        let ops = (0..TXN_PUTS)
            .map(|n| {
                Key::parse(format!("{}/t{n}", state.key))
                    .map(|k| TxnOp::put(k, self.body.clone()))
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let answer = client
            .txn(&state.key, token, &ops)
            .await
            .map_err(|e| code(&e))?;
        let expected = state.version + 1;
        state.version = expected;
        check(
            answer.results.len() == TXN_PUTS
                && answer.results.iter().all(|r| {
                    matches!(r, TxnOpResult::Put { meta, .. }
                        if meta.token == token && meta.version == Version::from_stored(expected))
                }),
        )
    }

    /// In etcd, the key a `lock` cycle creates and gives back for key `i`.
    fn lock_key(&self, i: usize) -> String {
        format!("{}/lock", self.keys[i].key)
    }

    /// etcd's lock cycle over the JSON gateway (see [`EtcdLock`]): the key must have been free.
    async fn etcd_lock(&self, target: &Target, i: usize) -> Result<(), String> {
        let key = STANDARD.encode(self.lock_key(i));
        let lease = match self.session {
            Some(session) => session,
            None => etcd_grant(target, ETCD_LEASE_TTL as i64).await?,
        };
        let txn = json!({
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": {"key": key, "value": STANDARD.encode(self.owner.as_str()), "lease": lease.to_string()}}],
        });
        let created = etcd_call(target, "kv/txn", txn).await?;
        check(created["succeeded"].as_bool() == Some(true))?;
        if self.session.is_some() {
            let deleted = etcd_call(target, "kv/deleterange", json!({"key": key})).await?;
            check(deleted["deleted"].as_str() == Some("1"))
        } else {
            etcd_call(target, "lease/revoke", json!({"ID": lease.to_string()}))
                .await
                .map(drop)
        }
    }

    /// etcd's lock cycle over gRPC (see [`EtcdLock`]): the key must have been free.
    #[cfg(feature = "etcd-grpc")]
    async fn grpc_lock(&self, etcd: &etcd_client::Client, i: usize) -> Result<(), String> {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let mut etcd = etcd.clone();
        let key = self.lock_key(i);
        let lease = match self.session {
            Some(session) => session,
            None => etcd
                .lease_grant(ETCD_LEASE_TTL as i64, None)
                .await
                .map_err(grpc_code)?
                .id(),
        };
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                self.owner.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        check(etcd.txn(txn).await.map_err(grpc_code)?.succeeded())?;
        if self.session.is_some() {
            let deleted = etcd.delete(key, None).await.map_err(grpc_code)?;
            check(deleted.deleted() == 1)
        } else {
            etcd.lease_revoke(lease).await.map(drop).map_err(grpc_code)
        }
    }

    /// In etcd, the key that fences key `i`: it holds the writer's token ([`ETCD_FENCE`]).
    fn fence_key(&self, i: usize) -> String {
        format!("{}/fence", self.keys[i].key)
    }

    /// In etcd, the key that holds key `i`'s body.
    fn body_key(&self, i: usize) -> String {
        format!("{}/body", self.keys[i].key)
    }

    /// The fence key of key `i` and the token it holds, base64 as etcd's gateway takes them.
    fn etcd_fence(&self, i: usize) -> (String, String) {
        (
            STANDARD.encode(self.fence_key(i)),
            STANDARD.encode(ETCD_FENCE),
        )
    }

    fn etcd_body_key(&self, i: usize) -> String {
        STANDARD.encode(self.body_key(i))
    }

    /// etcd's fenced write: if the fence key still holds the token, put the fence and the body.
    async fn etcd_put(&self, target: &Target, i: usize) -> Result<(), String> {
        let (fence, token) = self.etcd_fence(i);
        let body = STANDARD.encode(&self.body);
        let txn = json!({
            "compare": [{"key": fence, "target": "VALUE", "result": "EQUAL", "value": token}],
            "success": [
                {"request_put": {"key": fence, "value": token}},
                {"request_put": {"key": self.etcd_body_key(i), "value": body}},
            ],
        });
        let answer = etcd_call(target, "kv/txn", txn).await?;
        check(answer["succeeded"].as_bool() == Some(true))
    }
}

/// `Ok` when an answer checked out, else the [`WRONG_ANSWER`] code.
pub(super) fn check(right: bool) -> Result<(), String> {
    if right {
        Ok(())
    } else {
        Err(WRONG_ANSWER.to_owned())
    }
}

/// The code a failed call is counted under: the contract's code, or what failed instead.
pub(super) fn code(e: &Error) -> String {
    match (e.code(), e) {
        (Some(code), _) => code.as_str().to_owned(),
        (None, Error::Transport { .. }) => "transport".to_owned(),
        (None, Error::Unexpected { status, .. }) => format!("http_{}", status.as_u16()),
        (None, _) => "protocol".to_owned(),
    }
}

/// The code a failed etcd gRPC call is counted under.
#[cfg(feature = "etcd-grpc")]
pub(super) fn grpc_code(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(status) => format!("grpc_{:?}", status.code()),
        _ => "transport".to_owned(),
    }
}

/// A lease grant over etcd's gateway; its id.
async fn etcd_grant(target: &Target, ttl: i64) -> Result<i64, String> {
    let granted = etcd_call(target, "lease/grant", json!({"TTL": ttl})).await?;
    // The gateway writes 64-bit integers as strings.
    granted["ID"]
        .as_str()
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| WRONG_ANSWER.to_owned())
}

/// A call of etcd's gateway: `POST /v3/{path}` with a JSON body.
async fn etcd_call(target: &Target, path: &str, body: Value) -> Result<Value, String> {
    let Target::Etcd { http, base } = target else {
        unreachable!("an etcd call on the etcd target only")
    };
    let answer = http
        .post(format!("{base}/v3/{path}"))
        .json(&body)
        .send()
        .await
        .map_err(|_| "transport".to_owned())?;
    if !answer.status().is_success() {
        return Err(format!("http_{}", answer.status().as_u16()));
    }
    answer.json().await.map_err(|_| "protocol".to_owned())
}
