//! Watch runs: how long a write takes to reach a watcher, and whether every write reaches it
//! once, in order.
//!
//! A watcher follows the run's prefix from before the first write (snapfence: `GET /v1/watch`
//! read as server-sent events; etcd: `Watch` of the prefix). `--concurrency` writers, each on a
//! key of its own, write `--body-bytes` bodies at `--rate` writes per second together, for
//! `--duration` (snapfence: fenced PUTs under a lease; etcd: plain puts, and its events carry
//! the value, snapfence's do not). Each event is timed from its write's answer received to the
//! event received, on this machine's monotonic clock; an event that came before its write's
//! answer counts as 0 ms, and is counted. The writers' pace is kept by the clock, not by the
//! answers, so a slow answer does not slow the next write's start beyond its turn.
//!
//! The check: every key's events are exactly its accepted writes, versions 1, 2, … in order,
//! each once and each with its write's ETag (etcd: its revision); event ids increase; no event
//! of another kind or key. The watcher is given [`DRAIN`] after the last write for the rest,
//! then [`LINGER`] more in which any further event is one too many.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use snapfence_client::{AcquireRequest, FencingToken, Key, Owner, PutOptions};
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use super::report::{Errors, Histogram, Report, Timing};
use super::target::{HELD_TTL, Target, check, code};
use super::{BenchArgs, Global, body_of, prefixed};

/// How long the watcher has, after the last write's answer, to receive the events not yet in.
const DRAIN: Duration = Duration::from_secs(5);
/// How long the watcher is followed after it received every write, to catch one seen twice.
const LINGER: Duration = Duration::from_millis(300);

/// A write as its writer saw it answered.
struct Written {
    version: i64,
    sent: Instant,
    /// Its ETag (etcd: its revision), which its event must carry.
    tag: String,
    answered: Instant,
}

/// An event as the watcher received it.
struct Seen {
    key: String,
    version: i64,
    tag: String,
    at: Instant,
}

/// What the watcher hands on: an event, or why the stream cannot be trusted any more.
type Delivery = Result<Seen, String>;

/// Runs the writers against `target` with a watcher on `prefix`, then checks and times what
/// the watcher received.
pub(super) async fn run(
    args: &BenchArgs,
    global: &Global,
    target: Arc<Target>,
    prefix: &str,
) -> Result<Report, String> {
    if args.rate.is_nan() || args.rate <= 0.0 {
        return Err(format!("--rate must be above 0, got {}", args.rate));
    }
    let keys = (0..args.concurrency)
        .map(|i| prefixed(prefix, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut tokens = Vec::with_capacity(keys.len());
    for key in &keys {
        tokens.push(prepare(&target, key).await?);
    }
    let (deliver, mut delivered) = mpsc::unbounded_channel();
    // Dropped at the end of the run, which ends the watcher's stream (etcd: `Watcher` keeps the
    // watch open while it lives).
    let _watching = watch(global, &target, prefix, deliver).await?;

    let body = body_of(args.body_bytes);
    let period = Duration::from_secs_f64(keys.len() as f64 / args.rate);
    let started = Instant::now();
    let deadline = started + args.duration;
    let writers: Vec<_> = keys
        .iter()
        .zip(&tokens)
        .enumerate()
        .map(|(i, (key, token))| {
            let (target, key, token, body) = (target.clone(), key.clone(), *token, body.clone());
            // Spread over one period, so the writers' turns do not all fall together.
            let first = started + period.mul_f64(i as f64 / keys.len() as f64);
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval_at(first, period);
                ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
                let (mut written, mut errors) = (Vec::<Written>::new(), Errors::new());
                while ticks.tick().await < deadline {
                    let version = written.last().map_or(0, |w| w.version) + 1;
                    let sent = Instant::now();
                    match write(&target, &key, token, body.clone(), version).await {
                        Ok(tag) => written.push(Written {
                            version,
                            sent,
                            tag,
                            answered: Instant::now(),
                        }),
                        Err(code) => *errors.entry(code).or_default() += 1,
                    }
                }
                (written, errors)
            })
        })
        .collect();
    let (mut written, mut errors) = (Vec::with_capacity(writers.len()), Errors::new());
    for writer in writers {
        let (some, failed) = writer.await.map_err(|e| format!("a writer crashed: {e}"))?;
        written.push(some);
        for (code, n) in failed {
            *errors.entry(code).or_default() += n;
        }
    }
    let writing = started.elapsed();

    let accepted: usize = written.iter().map(Vec::len).sum();
    let (seen, stream) = receive(&mut delivered, accepted).await;
    let last_event = seen.last().map_or(started, |s| s.at);
    let mut timed = Timed::default();
    let verified = stream.and_then(|()| check_and_time(&keys, &written, seen, &mut timed));
    if verified.is_err() {
        // Counted in the errors too, where compare.sh looks.
        *errors
            .entry(super::target::WRONG_ANSWER.to_owned())
            .or_default() += 1;
    }
    let mut report = Report::new(
        args,
        prefix,
        last_event.duration_since(started),
        &timed.from_answer,
        &errors,
        verified,
    );
    report.keys = keys.len();
    report.timing = Some(Timing {
        from_to: match *target {
            Target::Snapfence(_) => {
                "each fenced PUT's answer received to its snapshot.written event received \
                 (this machine's monotonic clock); ops_per_sec is events received per second"
            }
            _ => {
                "each put's answer received to its Watch event received (this machine's \
                 monotonic clock); ops_per_sec is events received per second"
            }
        },
        rate: Some(args.rate),
        writes_per_sec: Some(accepted as f64 / writing.as_secs_f64()),
        early: Some(timed.early),
        from_send_ms: Some(timed.from_send.latencies()),
        ..Timing::default()
    });
    Ok(report)
}

/// A writer's lease on `key` (snapfence), so its PUTs are fenced; nothing for etcd.
async fn prepare(target: &Target, key: &Key) -> Result<Option<FencingToken>, String> {
    let Target::Snapfence(client) = target else {
        return Ok(None);
    };
    let request = AcquireRequest::new(Owner::parse("bench-writer").expect("valid"), HELD_TTL);
    let grant = client.acquire(key, &request).await.map_err(|e| {
        format!(
            "acquiring {key} failed ({}); is the server at --url up, and is --prefix free?",
            code(&e)
        )
    })?;
    Ok(Some(grant.lease.token))
}

/// One write of `version` to `key`; its ETag (etcd: its revision), or the code it failed with.
async fn write(
    target: &Target,
    key: &Key,
    token: Option<FencingToken>,
    body: Bytes,
    version: i64,
) -> Result<String, String> {
    match target {
        Target::Snapfence(client) => {
            let token = token.expect("prepared");
            let meta = client
                .put_snapshot(key, token, body, &PutOptions::default())
                .await
                .map_err(|e| code(&e))?
                .meta;
            check(meta.token == token && meta.version.get() == version)?;
            Ok(serde_json::to_value(&meta.etag)
                .expect("an ETag serializes")
                .to_string())
        }
        #[cfg(feature = "etcd-grpc")]
        Target::EtcdGrpc(etcd) => {
            let put = etcd
                .clone()
                .put(key.as_str(), body.to_vec(), None)
                .await
                .map_err(super::target::grpc_code)?;
            let revision = put.header().map(|h| h.revision());
            revision
                .map(|r| r.to_string())
                .ok_or_else(|| super::target::WRONG_ANSWER.to_owned())
        }
        Target::Etcd { .. } => unreachable!("the JSON gateway target refuses watch runs"),
    }
}

/// What keeps a watch open, until dropped: the task reading its events (and etcd's handle of
/// the watch, which keeps it open while it lives).
struct Watching {
    task: tokio::task::JoinHandle<()>,
    #[cfg(feature = "etcd-grpc")]
    _etcd: Option<etcd_client::Watcher>,
}

impl Watching {
    fn reading(task: tokio::task::JoinHandle<()>) -> Self {
        Self {
            task,
            #[cfg(feature = "etcd-grpc")]
            _etcd: None,
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens the watch of `prefix` and starts handing its events to `deliver`. It returns once
/// the watch is open: every change after that is in it (snapfence opens a watch before it
/// answers with the stream's head; etcd's client waits for the watch's `created`).
async fn watch(
    global: &Global,
    target: &Target,
    prefix: &str,
    deliver: mpsc::UnboundedSender<Delivery>,
) -> Result<Watching, String> {
    match target {
        Target::Snapfence(_) => {
            let stream = open_stream(global, prefix).await?;
            Ok(Watching::reading(tokio::spawn(follow_stream(
                stream, deliver,
            ))))
        }
        #[cfg(feature = "etcd-grpc")]
        Target::EtcdGrpc(etcd) => {
            let options = etcd_client::WatchOptions::new().with_prefix();
            let (watcher, stream) = etcd
                .clone()
                .watch(prefix, Some(options))
                .await
                .map_err(|e| format!("cannot watch etcd: {e}"))?;
            Ok(Watching {
                task: tokio::spawn(follow_etcd(stream, deliver)),
                _etcd: Some(watcher),
            })
        }
        Target::Etcd { .. } => unreachable!("the JSON gateway target refuses watch runs"),
    }
}

/// `GET /v1/watch?prefix=` with the run's API key and CA, on a client without a timeout (the
/// stream lasts the run).
async fn open_stream(global: &Global, prefix: &str) -> Result<reqwest::Response, String> {
    let mut http = reqwest::Client::builder();
    if let Some(path) = &global.ca_cert {
        let pem = std::fs::read(path)
            .map_err(|e| format!("--ca-cert: cannot read {}: {e}", path.display()))?;
        let ca = reqwest::Certificate::from_pem(&pem).map_err(|e| format!("--ca-cert: {e}"))?;
        http = http.add_root_certificate(ca);
    }
    let http = http
        .build()
        .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
    let mut request = http
        .get(format!("{}/v1/watch", global.url.trim_end_matches('/')))
        .query(&[("prefix", prefix)]);
    if let Some(key) = &global.api_key {
        request = request.bearer_auth(key);
    }
    let answer = request
        .send()
        .await
        .map_err(|e| format!("cannot open the watch: {e}"))?;
    if answer.status() != reqwest::StatusCode::OK {
        return Err(format!("the watch was answered {}", answer.status()));
    }
    Ok(answer)
}

/// A watch stream's next item; at its end or failure, `None`, after telling `deliver` why
/// (`what` names the stream).
fn next_or_tell<T, E: std::fmt::Display>(
    next: Result<Option<T>, E>,
    deliver: &mpsc::UnboundedSender<Delivery>,
    what: &str,
) -> Option<T> {
    let why = match next {
        Ok(Some(item)) => return Some(item),
        Ok(None) => format!("{what} ended"),
        Err(e) => format!("{what} failed: {e}"),
    };
    // The receiver is gone only once the run is over.
    let _ = deliver.send(Err(why));
    None
}

/// Reads server-sent events (fields `id`, `event`, `data`; comment lines start with `:`; a
/// blank line ends an event) and hands on each `snapshot.written`, stamped when the chunk that
/// completed it arrived. The writers' own `lease.granted` may come first (granted before the
/// watch opened, numbered after); any other kind, an id not above the last, or the stream's end
/// is handed on as a failure.
async fn follow_stream(mut stream: reqwest::Response, deliver: mpsc::UnboundedSender<Delivery>) {
    let mut buffer = Vec::new();
    let (mut id, mut kind, mut data) = (String::new(), String::new(), String::new());
    let mut last_id = i64::MIN;
    loop {
        let Some(chunk) = next_or_tell(stream.chunk().await, &deliver, "the watch stream") else {
            return;
        };
        let at = Instant::now();
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if !line.is_empty() {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
                match field {
                    "id" => id = value,
                    "event" => kind = value,
                    "data" if data.is_empty() => data = value,
                    "data" => data = format!("{data}\n{value}"),
                    _ => {} // a comment (`:`), or a field this reader has no use for
                }
                continue;
            }
            if kind.is_empty() && data.is_empty() {
                continue; // the end of a comment
            }
            let event = std::mem::take(&mut data);
            let (this_id, this_kind) = (std::mem::take(&mut id), std::mem::take(&mut kind));
            let delivery = match this_id.parse::<i64>() {
                Ok(n) if n > last_id => {
                    last_id = n;
                    parse_written(&this_kind, &event, at)
                }
                _ => Some(Err(format!(
                    "event id {this_id:?} is not above the one before ({last_id})"
                ))),
            };
            if let Some(delivery) = delivery
                && deliver.send(delivery).is_err()
            {
                return;
            }
        }
    }
}

/// A `snapshot.written` event's key, version and ETag; `None` for a `lease.granted`.
fn parse_written(kind: &str, data: &str, at: Instant) -> Option<Delivery> {
    match kind {
        "lease.granted" => None,
        "snapshot.written" => Some(
            serde_json::from_str::<Value>(data)
                .ok()
                .and_then(|v| {
                    Some(Seen {
                        key: v["key"].as_str()?.to_owned(),
                        version: v["version"].as_i64()?,
                        tag: v.get("etag")?.to_string(),
                        at,
                    })
                })
                .ok_or_else(|| {
                    format!("a snapshot.written event without key, version or etag: {data}")
                }),
        ),
        other => Some(Err(format!("an event of kind {other:?}: {data}"))),
    }
}

/// Hands on each put event of an etcd watch, stamped when its message arrived.
#[cfg(feature = "etcd-grpc")]
async fn follow_etcd(
    mut stream: etcd_client::WatchStream,
    deliver: mpsc::UnboundedSender<Delivery>,
) {
    loop {
        let Some(message) = next_or_tell(stream.message().await, &deliver, "the etcd watch") else {
            return;
        };
        let at = Instant::now();
        for event in message.events() {
            let seen = match (event.event_type(), event.kv()) {
                (etcd_client::EventType::Put, Some(kv)) => Ok(Seen {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    version: kv.version(),
                    tag: kv.mod_revision().to_string(),
                    at,
                }),
                (kind, _) => Err(format!("an etcd event of kind {kind:?}")),
            };
            if deliver.send(seen).is_err() {
                return;
            }
        }
    }
}

/// Receives until `expected` events are in (or [`DRAIN`] passes), then for [`LINGER`] more;
/// the events, and whether the stream stayed sound.
async fn receive(
    delivered: &mut mpsc::UnboundedReceiver<Delivery>,
    expected: usize,
) -> (Vec<Seen>, Result<(), String>) {
    let mut seen = Vec::with_capacity(expected);
    let mut until = Instant::now() + DRAIN;
    let mut lingering = false;
    loop {
        if seen.len() >= expected && !lingering {
            (until, lingering) = (Instant::now() + LINGER, true);
        }
        match tokio::time::timeout_at(until, delivered.recv()).await {
            Ok(Some(Ok(event))) => seen.push(event),
            Ok(Some(Err(e))) => return (seen, Err(e)),
            Ok(None) => return (seen, Err("the watcher stopped".into())),
            Err(_) => return (seen, Ok(())),
        }
    }
}

/// The events' latencies: from their write's answer, and from its sending.
#[derive(Default)]
struct Timed {
    from_answer: Histogram,
    from_send: Histogram,
    /// Events that came before their write's answer (0 ms from it).
    early: u64,
}

/// Matches every key's events with its writes, in order, and times each into `timed`.
fn check_and_time(
    keys: &[Key],
    written: &[Vec<Written>],
    seen: Vec<Seen>,
    timed: &mut Timed,
) -> Result<(), String> {
    let mut by_key: HashMap<String, Vec<Seen>> = HashMap::new();
    for event in seen {
        by_key.entry(event.key.clone()).or_default().push(event);
    }
    for (key, writes) in keys.iter().zip(written) {
        let events = by_key.remove(key.as_str()).unwrap_or_default();
        if events.len() != writes.len() {
            return Err(format!(
                "key {key}: {} writes accepted, {} events received",
                writes.len(),
                events.len()
            ));
        }
        for (n, (w, e)) in writes.iter().zip(&events).enumerate() {
            if (e.version, &e.tag) != (w.version, &w.tag) {
                return Err(format!(
                    "key {key}: event {} is version {} ({}), the write was version {} ({})",
                    n + 1,
                    e.version,
                    e.tag,
                    w.version,
                    w.tag
                ));
            }
            timed.from_send.record(e.at.duration_since(w.sent));
            match e.at.checked_duration_since(w.answered) {
                Some(after) => timed.from_answer.record(after),
                None => {
                    timed.early += 1;
                    timed.from_answer.record(Duration::ZERO);
                }
            }
        }
    }
    match by_key.keys().next() {
        Some(other) => Err(format!("events of key {other}, which no writer wrote")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes of versions 1..=n to `k`, answered now, each tagged with its version.
    fn writes(n: i64) -> Vec<Written> {
        let now = Instant::now();
        (1..=n)
            .map(|version| Written {
                version,
                sent: now,
                tag: version.to_string(),
                answered: now,
            })
            .collect()
    }

    fn events(versions: &[i64]) -> Vec<Seen> {
        let at = Instant::now();
        versions
            .iter()
            .map(|&version| Seen {
                key: "k".into(),
                version,
                tag: version.to_string(),
                at,
            })
            .collect()
    }

    fn verdict(versions: &[i64]) -> Result<(), String> {
        let keys = [Key::parse("k").unwrap()];
        check_and_time(&keys, &[writes(3)], events(versions), &mut Timed::default())
    }

    #[test]
    fn every_write_once_in_order_or_the_check_fails() {
        assert_eq!(verdict(&[1, 2, 3]), Ok(()));
        for wrong in [&[1, 2][..], &[1, 2, 3, 3], &[1, 3, 2], &[1, 2, 2]] {
            assert!(verdict(wrong).is_err(), "{wrong:?} passed");
        }
        let stray = Seen {
            key: "other".into(),
            ..events(&[1]).remove(0)
        };
        let keys = [Key::parse("k").unwrap()];
        let mut seen = events(&[1, 2, 3]);
        seen.push(stray);
        let timed = &mut Timed::default();
        assert!(check_and_time(&keys, &[writes(3)], seen, timed).is_err());
    }
}
