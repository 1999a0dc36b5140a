//! `snapfence-bench`: a load generator for the service (and, for comparison, for etcd through its
//! JSON gateway or its native gRPC API, doing the same work).
//!
//! Each of `--concurrency` workers owns a slice of the `--keys` keys, so no two workers contend
//! for one key and every answer can be checked against what that worker alone did: a fenced
//! write must come back with the worker's token and the next version of the key, and after the
//! run every key's newest token and version are read back and compared with the writes that were
//! counted as accepted. An error is counted by its contract code, never as a success. The
//! numbers are the server's: requests are sent over keep-alive connections and a request
//! is timed from before it is sent until its answer has been read and checked.
//!
//! `lock` is the lock cycle an application pays for a critical section: acquire a free key, then
//! release it. Against etcd it is done as etcd's users do it (`--etcd-lock`), so both sides do
//! the same work; `grant` is etcd's bare lease grant, which takes no key: a calibration only.
//!
//! The bench talks to the server through `snapfence-client` alone, never the server's crate.
//!
//! Two kinds of run time something else than a request: `handoff` and `expiry` time how long a
//! waiting acquire (etcd: a blocked `Lock`) takes to be granted after the holder lets go
//! ([`handoff`]), and `watch` how long a write takes to reach a watcher ([`watch`]).

mod flood;
mod handoff;
mod report;
mod target;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tokio::time::Instant;

use clap::Parser;
use report::Recorder;
pub use report::Report;
use snapfence_client::{Client, RetryPolicy};
use target::{Target, Worker};

/// snapfence-bench: load a snapfence server (or etcd, over JSON or gRPC) with many concurrent
/// requests, check every answer, and report throughput and latency.
#[derive(Debug, Parser)]
#[command(name = "snapfence-bench", version, about)]
struct Cli {
    /// How to reach the server.
    #[command(flatten)]
    global: Global,
    /// What to send.
    #[command(flatten)]
    args: BenchArgs,
}

/// How to reach the server and how to print the report: the options and variables `snapfence`'s
/// own client commands take.
#[derive(Debug, Args)]
pub struct Global {
    /// The server (etcd's client URL with `--target etcd` or `etcd-grpc`).
    #[arg(long, env = "SNAPFENCE_URL", default_value = "http://127.0.0.1:7878")]
    pub url: String,
    /// How the report is printed: a table for people, or JSON for scripts.
    #[arg(long, value_enum, default_value = "table")]
    pub output: Output,
    /// How long one request may take.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// The API key (`sf_<id>_<secret>`), needed once the server has any.
    #[arg(long, env = "SNAPFENCE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Also trust the certificates in this PEM file for an https --url.
    #[arg(long, env = "SNAPFENCE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

/// How the report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Lines for people.
    Table,
    /// The report as JSON.
    Json,
}

/// The exit status of a wrong command line (clap's own).
const EXIT_USAGE: u8 = 2;
/// The exit status of a run that failed or whose check did.
const EXIT_FAILURE: u8 = 1;

/// The key `rest` under the run's prefix.
fn prefixed(prefix: &str, rest: impl std::fmt::Display) -> Result<snapfence_client::Key, String> {
    snapfence_client::Key::parse(format!("{prefix}{rest}"))
        .map_err(|e| format!("--prefix {prefix:?} does not make valid keys: {e}"))
}

/// The client of `global`, without retries: every failure is counted.
fn client_of(global: &Global) -> Result<Client, String> {
    let mut builder = Client::builder(global.url.clone())
        .timeout(global.timeout)
        .retry(RetryPolicy::none());
    if let Some(key) = &global.api_key {
        builder = builder.api_key(key.clone());
    }
    if let Some(path) = &global.ca_cert {
        let pem = std::fs::read(path)
            .map_err(|e| format!("--ca-cert: cannot read {}: {e}", path.display()))?;
        builder = builder.root_certificates_pem(pem);
    }
    builder.build().map_err(|e| format!("{e}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    bench(cli.args, &cli.global)
}

/// What a run sends.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What each request does: `acquire` a lease (each key's lease expires before its worker
    /// comes back to it), `lock` a free key and release it (one cycle), `renew` a held lease,
    /// `put` a fenced write, `get` a snapshot, `mixed` (70% get, 20% put, 10% renew), or
    /// `grant` (etcd only: a bare lease grant, a calibration); or a timing run: `handoff` and `expiry` (a
    /// waiter's grant after the holder's release or expiry, `--rounds` times), `watch` (writes
    /// at `--rate` to a watcher, for `--duration`), `flood` (another client's reads and acquires
    /// while `--flood` waiting acquires arrive at once).
    #[arg(long, value_enum)]
    pub op: Op,
    /// Requests in flight at once, one worker each (`watch`: writers, one key each).
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// How long to send requests for, after the keys are prepared.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub duration: Duration,
    /// How many keys the workers share out (at least one per worker).
    #[arg(long, default_value_t = 10_000)]
    pub keys: usize,
    /// The size of each written body.
    #[arg(long, default_value_t = 1024)]
    pub body_bytes: usize,
    /// Whose API to load: snapfence at --url, or etcd at --url through its v3 JSON gateway
    /// (`etcd`) or its native gRPC API (`etcd-grpc`); for etcd, `lock` is as `--etcd-lock`
    /// says, `put` a transaction that compares a fence key and then puts the fence and the
    /// body, `get` a range read.
    #[arg(long, value_enum, default_value = "snapfence")]
    pub target: TargetKind,
    /// How etcd's `lock` cycle takes and gives back the key: `per-lock` grants a lease, creates
    /// the key under it in a transaction and revokes the lease (as a lock with its own TTL);
    /// `session` creates the key in a transaction under a lease each worker was granted once
    /// and deletes it (etcd's `concurrency.Mutex` on a session).
    #[arg(long, value_enum, default_value = "per-lock")]
    pub etcd_lock: EtcdLock,
    /// `handoff` and `expiry`: how many hand-offs to time, one after another, each on a key of
    /// its own.
    #[arg(long, default_value_t = 200)]
    pub rounds: usize,
    /// `flood`: how many waiting acquires arrive at once, each on a connection of its own (the
    /// open-file limit must allow as many).
    #[arg(long, default_value_t = 5000)]
    pub flood: usize,
    /// `flood`: the API key of the flooding client [default: --api-key]; another key than the
    /// timed client's, as another tenant's, so the flood does not count against its limits.
    #[arg(long, hide_env_values = true)]
    pub flood_api_key: Option<String>,
    /// `watch`: the writes per second, all writers together.
    #[arg(long, default_value_t = 200.0)]
    pub rate: f64,
    /// Key names begin with this [default: `bench/` and a random run id, so that runs on one
    /// database never meet each other's leases].
    #[arg(long)]
    pub prefix: Option<String>,
}

/// What each request of a run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Acquire a lease.
    Acquire,
    /// Acquire a free key, then release it.
    Lock,
    /// etcd only: grant a lease, which takes no key (a calibration of etcd's write path).
    Grant,
    /// Renew a held lease.
    Renew,
    /// A fenced write.
    Put,
    /// A fenced write of a key under the worker's lease, fenced by that lease's namespace
    /// (v1.3 `Fencing-Key`).
    Nsput,
    /// A transaction (v1.3) of ten 1 KiB puts under the worker's lease's namespace.
    Txn,
    /// Read a snapshot.
    Get,
    /// 70% get, 20% put, 10% renew.
    Mixed,
    /// A waiter's grant after the holder's release (etcd: `Lock` after `Unlock`).
    Handoff,
    /// A waiter's grant after the holder's lease expired (etcd: its lease's TTL ran out).
    Expiry,
    /// Writes delivered to a watcher (`GET /v1/watch`; etcd: `Watch`).
    Watch,
    /// Another client's reads and acquires while `--flood` waiting acquires arrive at once.
    Flood,
}

/// How etcd's lock cycle is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EtcdLock {
    /// Lease grant, a transaction that creates the key under it, lease revoke.
    PerLock,
    /// A transaction that creates the key under a lease granted once, and a delete.
    Session,
}

/// The service a run loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    /// snapfence.
    Snapfence,
    /// etcd's v3 JSON gateway, for comparison.
    Etcd,
    /// etcd's native gRPC API, for comparison (`--url http://host:port`, its client port; a
    /// build with the `etcd-grpc` feature).
    EtcdGrpc,
}

/// Runs the load of `args` against the server of `global`.
fn bench(args: BenchArgs, global: &Global) -> ExitCode {
    let fail = |message: String| -> ExitCode {
        eprintln!("snapfence-bench: {message}");
        EXIT_USAGE.into()
    };
    if args.concurrency == 0 || args.keys < args.concurrency {
        return fail(format!(
            "--keys ({}) must be at least --concurrency ({}), which must be at least 1: each worker needs keys of its own",
            args.keys, args.concurrency
        ));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let target = match args.target {
        TargetKind::Snapfence => Target::snapfence(client_of(global), args.op),
        TargetKind::Etcd => Target::etcd(&global.url, global.timeout, args.op),
        #[cfg(feature = "etcd-grpc")]
        TargetKind::EtcdGrpc => {
            runtime.block_on(Target::etcd_grpc(&global.url, global.timeout, args.op))
        }
        #[cfg(not(feature = "etcd-grpc"))]
        TargetKind::EtcdGrpc => Err("this build has no etcd gRPC client: build it with \
            `cargo build --release -p snapfence-bench --features etcd-grpc` (needs protoc: \
            apt-get install protobuf-compiler)"
            .to_owned()),
    };
    let target = match target {
        Ok(target) => target,
        Err(message) => return fail(message),
    };
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("bench/{}/", &uuid::Uuid::new_v4().simple().to_string()[..8]));
    let target = Arc::new(target);
    let ran = runtime.block_on(async {
        match args.op {
            Op::Handoff | Op::Expiry => handoff::run(&args, &target, &prefix).await,
            Op::Watch => watch::run(&args, global, target, &prefix).await,
            Op::Flood => flood::run(&args, global, &target, &prefix).await,
            _ => run(&args, target, &prefix).await,
        }
    });
    match ran {
        Ok(report) => {
            match global.output {
                Output::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&report).expect("a report serializes")
                ),
                Output::Table => print!("{report}"),
            }
            if report.verified.is_ok() {
                ExitCode::SUCCESS
            } else {
                EXIT_FAILURE.into()
            }
        }
        Err(message) => {
            eprintln!("snapfence-bench: {message}");
            EXIT_FAILURE.into()
        }
    }
}

/// Prepares the keys, runs the load, and checks what it wrote.
async fn run(args: &BenchArgs, target: Arc<Target>, prefix: &str) -> Result<Report, String> {
    let body = body_of(args.body_bytes);
    let per = args.keys / args.concurrency;
    let mut workers = (0..args.concurrency)
        .map(|w| {
            Worker::new(
                w,
                prefix,
                w * per..(w + 1) * per,
                body.clone(),
                args.etcd_lock,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;

    let bar = progress(per * args.concurrency, "preparing keys");
    let prepared = each_worker(&mut workers, |mut worker| {
        let (target, bar) = (target.clone(), bar.clone());
        let op = args.op;
        async move {
            let done = worker.prepare(&target, op, &bar).await;
            (worker, done)
        }
    })
    .await?;
    bar.finish_and_clear();
    workers = prepared;
    if args.op == Op::Acquire {
        // The prepared leases are short; the run acquires each key again once they expired.
        tokio::time::sleep(target::ACQUIRE_TTL + Duration::from_millis(50)).await;
    }

    let recorder = Recorder::default();
    let sent = Arc::new(AtomicU64::new(0));
    let ticker = ticker(args.duration, sent.clone());
    let started = Instant::now();
    let deadline = started + args.duration;
    workers = each_worker(&mut workers, |mut worker| {
        let (target, recorder, sent) = (target.clone(), recorder.clone(), sent.clone());
        let op = args.op;
        async move {
            let mut seen = report::Histogram::new();
            let mut errors = report::Errors::new();
            while Instant::now() < deadline {
                let begun = Instant::now();
                match worker.op(&target, op).await {
                    Ok(()) => seen.record(begun.elapsed()),
                    Err(code) => *errors.entry(code).or_default() += 1,
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
            recorder.add(&seen, &errors);
            (worker, Ok::<(), String>(()))
        }
    })
    .await?;
    let elapsed = started.elapsed();
    ticker.finish_and_clear();

    let bar = progress(per * args.concurrency, "checking what was written");
    let checked = each_worker(&mut workers, |worker| {
        let (target, bar) = (target.clone(), bar.clone());
        async move {
            let verdict = worker.verify(&target, &bar).await;
            (worker, verdict)
        }
    })
    .await;
    bar.finish_and_clear();
    Ok(recorder.report(args, prefix, elapsed, checked.map(|_| ())))
}

/// The body every write of a run sends: `len` bytes of hex digits.
fn body_of(len: usize) -> bytes::Bytes {
    (0..len)
        .map(|i| b"0123456789abcdef"[i % 16])
        .collect::<Vec<u8>>()
        .into()
}

/// Runs `f` on every worker at once; gives the workers back, or the first failure.
async fn each_worker<F, Fut>(workers: &mut Vec<Worker>, f: F) -> Result<Vec<Worker>, String>
where
    F: Fn(Worker) -> Fut,
    Fut: Future<Output = (Worker, Result<(), String>)> + Send + 'static,
{
    let tasks: Vec<_> = workers.drain(..).map(|w| tokio::spawn(f(w))).collect();
    let mut back = Vec::with_capacity(tasks.len());
    let mut failure = None;
    for task in tasks {
        let (worker, done) = task.await.map_err(|e| format!("a worker crashed: {e}"))?;
        if let Err(e) = done {
            failure.get_or_insert(e);
        }
        back.push(worker);
    }
    failure.map_or(Ok(back), Err)
}

/// A bar on stderr (hidden when stderr is not a terminal) for a phase of `len` steps.
fn progress(len: usize, what: &'static str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64).with_message(what);
    bar.set_style(
        ProgressStyle::with_template("{msg:<26} [{bar:40}] {pos}/{len} ({per_sec}, {eta} left)")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar
}

/// A bar that shows the run's elapsed time against its duration, and the requests so far.
fn ticker(duration: Duration, sent: Arc<AtomicU64>) -> ProgressBar {
    let bar = ProgressBar::new(duration.as_secs().max(1));
    bar.set_style(
        ProgressStyle::with_template("running {elapsed:>4} of {len}s [{bar:40}] {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let shown = bar.clone();
    let started = std::time::Instant::now();
    tokio::spawn(async move {
        while !shown.is_finished() {
            shown.set_position(started.elapsed().as_secs());
            shown.set_message(format!("{} requests", sent.load(Ordering::Relaxed)));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    bar
}
