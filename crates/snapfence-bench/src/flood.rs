//! Flood runs: how another client fares while thousands of waiting acquires arrive at once.
//!
//! `--flood` connections each send one waiting acquire (`wait_ms`) of one of 20 held keys, all at
//! once, from a thread of their own, and keep their connection open; the instance queues as many
//! as its waiter bounds allow and refuses the rest `429`. Meanwhile one client, on one keep-alive
//! connection, reads a held key's status and acquires a free key in turn for `--duration`: each
//! must be answered as usual, and the run's latencies are its reads (its acquires' are beside
//! them). Two thirds into the run the flood's connections all close at once, so the probe also
//! covers its waiters leaving the queues. The flood's answers are counted by status.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use snapfence_client::{AcquireRequest, Key, Owner};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::report::{Errors, Histogram, Report, Timing};
use super::target::{Target, code};
use super::{BenchArgs, Global, prefixed};

/// The keys the flood waits for, each held through the run.
const HELD: usize = 20;
/// The wait each flooding acquire asks for: the longest the default bounds allow (--max-wait).
const FLOOD_WAIT_MS: u64 = 300_000;
/// The probe's pause between two pairs of requests.
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// Floods the server of `global` while timing another client's requests.
pub(super) async fn run(
    args: &BenchArgs,
    global: &Global,
    target: &Target,
    prefix: &str,
) -> Result<Report, String> {
    let Target::Snapfence(client) = target else {
        return Err("--op flood loads snapfence only".to_owned());
    };
    let addr = plain_http_address(&global.url)?;
    let hold = AcquireRequest::new(
        Owner::parse("bench-holder").expect("a valid owner"),
        args.duration + Duration::from_secs(120),
    );
    let held: Vec<Key> = (0..HELD)
        .map(|n| prefixed(prefix, format!("busy/{n}")))
        .collect::<Result<_, _>>()?;
    let mut tokens = Vec::with_capacity(HELD);
    for k in &held {
        let grant = client
            .acquire(k, &hold)
            .await
            .map_err(|e| format!("could not hold {k} for the flood ({}): {e}", code(&e)))?;
        tokens.push(grant.lease.token);
    }
    let (end, ended) = watch::channel(false);
    let statuses = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let flood = {
        let (statuses, held, n) = (statuses.clone(), held.clone(), args.flood);
        let auth = (args.flood_api_key.as_ref())
            .or(global.api_key.as_ref())
            .map(|k| format!("Authorization: Bearer {k}\r\n"))
            .unwrap_or_default();
        std::thread::spawn(move || flood(addr, auth, held, n, ended, statuses))
    };

    let (mut reads, mut acquires, mut errors) = (Histogram::new(), Histogram::new(), Errors::new());
    let free = AcquireRequest::new(
        Owner::parse("bench-probe").expect("a valid owner"),
        Duration::from_secs(60),
    );
    let started = Instant::now();
    let leave_at = args.duration * 2 / 3;
    let mut n = 0;
    while started.elapsed() < args.duration {
        if started.elapsed() >= leave_at {
            end.send_replace(true);
        }
        let sent = Instant::now();
        match client.lease_status(&held[1]).await {
            Ok(_) => reads.record(sent.elapsed()),
            Err(e) => *errors.entry(code(&e)).or_default() += 1,
        }
        let sent = Instant::now();
        match client
            .acquire(&prefixed(prefix, format!("probe/{n}"))?, &free)
            .await
        {
            Ok(_) => acquires.record(sent.elapsed()),
            Err(e) => *errors.entry(code(&e)).or_default() += 1,
        }
        n += 1;
        tokio::time::sleep(PROBE_EVERY).await;
    }
    let elapsed = started.elapsed();
    end.send_replace(true);
    tokio::task::spawn_blocking(move || flood.join())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|_| "the flood's thread panicked".to_owned())??;
    // The flood's waiters are gone with their connections, so the keys go back to no one.
    for (k, token) in held.iter().zip(tokens) {
        let _ = client.release(k, token).await;
    }

    let statuses = statuses.lock().expect("the flood has ended").clone();
    // Every flooding acquire waits or is refused for the waiters' bounds, and the other client
    // is always served.
    let unexpected: Vec<_> = statuses
        .iter()
        .filter(|(s, _)| !matches!(s.as_str(), "waiting" | "429"))
        .collect();
    let verified = if !errors.is_empty() {
        Err(format!("the other client was refused: {errors:?}"))
    } else if !unexpected.is_empty() {
        let hint = if unexpected.iter().any(|(s, _)| s.starts_with("connect")) {
            "; connections failed: raise the open-file limit (ulimit -n) above --flood"
        } else {
            ""
        };
        Err(format!(
            "flooding acquires answered otherwise than waiting or 429: {unexpected:?}{hint}"
        ))
    } else {
        Ok(())
    };
    let mut report = Report::new(args, prefix, elapsed, &reads, &errors, verified);
    (report.concurrency, report.keys) = (1, HELD);
    report.timing = Some(Timing {
        from_to: "another client's read of a held key's status, sent to answered (its acquires \
            of free keys below), while the flood arrives, waits and (after two thirds of the run) \
            leaves (this machine's monotonic clock)",
        acquire_ms: Some(acquires.latencies()),
        flood: Some(statuses),
        ..Timing::default()
    });
    Ok(report)
}

/// `host:port` of an `http://` URL: the flood writes its requests by hand.
fn plain_http_address(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--op flood needs an http:// --url, not {url}"))?;
    Ok(rest.trim_end_matches('/').to_owned())
}

/// Sends `n` waiting acquires at once on connections of their own and keeps them open until
/// `end`; counts their answers by status (`connect: ...` for a connection that failed).
fn flood(
    addr: String,
    auth: String,
    held: Vec<Key>,
    n: usize,
    end: watch::Receiver<bool>,
    statuses: Arc<Mutex<BTreeMap<String, u64>>>,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the flood's runtime: {e}"))?;
    runtime.block_on(async move {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let (addr, auth) = (addr.clone(), auth.clone());
                let (mut end, statuses) = (end.clone(), statuses.clone());
                let path = format!(
                    "/v1/leases/{}",
                    held[i % held.len()].as_str().replace('/', "%2F")
                );
                tokio::spawn(async move {
                    let status = waiting_acquire(&addr, &auth, &path, i, &mut end)
                        .await
                        .unwrap_or_else(|e| format!("connect: {}", e.kind()));
                    *statuses
                        .lock()
                        .expect("never poisoned")
                        .entry(status)
                        .or_default() += 1;
                })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    });
    Ok(())
}

/// One waiting acquire, written by hand, its connection held open until `end`: its status
/// code, or `waiting` if none came by then (a queued waiter's).
async fn waiting_acquire(
    addr: &str,
    auth: &str,
    path: &str,
    i: usize,
    end: &mut watch::Receiver<bool>,
) -> std::io::Result<String> {
    let body = format!(r#"{{"owner":"flood-{i}","ttl_ms":30000,"wait_ms":{FLOOD_WAIT_MS}}}"#);
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(format!("{head}{body}").as_bytes()).await?;
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    let status = tokio::select! {
        read = stream.read_line(&mut line) => match read {
            Ok(0) => "closed".to_owned(),
            Ok(_) => line.split_whitespace().nth(1).unwrap_or("protocol").to_owned(),
            Err(e) => format!("read: {}", e.kind()),
        },
        _ = end.wait_for(|e| *e) => return Ok("waiting".to_owned()),
    };
    let _ = end.wait_for(|e| *e).await;
    Ok(status)
}
