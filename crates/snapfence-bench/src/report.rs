//! Latencies, error counts, and the report of a run.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::target::WRONG_ANSWER;
use super::{BenchArgs, EtcdLock, Op, TargetKind};

/// Errors by the code they were counted under.
pub(super) type Errors = BTreeMap<String, u64>;

/// The latencies of successful requests, in microseconds from 1 µs to an hour, to three
/// significant figures. The bounds are fixed: merging into an auto-resizing histogram that is
/// still empty loses the quantiles.
pub(super) struct Histogram(hdrhistogram::Histogram<u64>);

impl Histogram {
    pub(super) fn new() -> Self {
        Self(hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"))
    }

    pub(super) fn record(&mut self, latency: Duration) {
        self.0.saturating_record(latency.as_micros().max(1) as u64);
    }

    fn ms_at(&self, quantile: f64) -> f64 {
        self.0.value_at_quantile(quantile) as f64 / 1000.0
    }

    pub(super) fn latencies(&self) -> Latencies {
        Latencies {
            p50: self.ms_at(0.5),
            p90: self.ms_at(0.9),
            p99: self.ms_at(0.99),
            max: self.0.max() as f64 / 1000.0,
        }
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// Where the workers leave what they saw.
#[derive(Clone)]
pub(super) struct Recorder(Arc<Mutex<(Histogram, Errors)>>);

impl Default for Recorder {
    fn default() -> Self {
        Self(Arc::new(Mutex::new((Histogram::new(), Errors::new()))))
    }
}

impl Recorder {
    pub(super) fn add(&self, seen: &Histogram, errors: &Errors) {
        let mut all = self.0.lock().expect("no worker panics holding it");
        all.0.0.add(&seen.0).expect("histograms of one shape");
        for (code, n) in errors {
            *all.1.entry(code.clone()).or_default() += n;
        }
    }

    pub(super) fn report(
        &self,
        args: &BenchArgs,
        prefix: &str,
        elapsed: Duration,
        verified: Result<(), String>,
    ) -> Report {
        let all = self.0.lock().expect("no worker panics holding it");
        Report::new(args, prefix, elapsed, &all.0, &all.1, verified)
    }
}

impl Report {
    /// The report of `latency` and `errors` over `elapsed`; `verified` fails too if any
    /// success was counted as a wrong answer.
    pub(super) fn new(
        args: &BenchArgs,
        prefix: &str,
        elapsed: Duration,
        latency: &Histogram,
        errors: &Errors,
        verified: Result<(), String>,
    ) -> Self {
        let ok = latency.0.len();
        let secs = elapsed.as_secs_f64();
        let verified = verified.and_then(|()| match errors.get(WRONG_ANSWER) {
            Some(n) => Err(format!("{n} answers were successes with the wrong content")),
            None => Ok(()),
        });
        Report {
            target: args.target,
            op: args.op,
            etcd_lock: (args.op == Op::Lock && args.target != TargetKind::Snapfence)
                .then_some(args.etcd_lock),
            concurrency: args.concurrency,
            keys: args.keys / args.concurrency * args.concurrency,
            body_bytes: args.body_bytes,
            prefix: prefix.to_owned(),
            seconds: secs,
            ok,
            errors: errors.clone(),
            ops_per_sec: ok as f64 / secs,
            latency_ms: latency.latencies(),
            timing: None,
            verified: verified.map(|()| "every accepted answer and every key checked out"),
        }
    }
}

/// What a run measured, as `--output json` prints it.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The service loaded.
    pub target: TargetKind,
    /// The operation.
    pub op: Op,
    /// An etcd `lock` run's way of locking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd_lock: Option<EtcdLock>,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Keys used (a whole number per worker).
    pub keys: usize,
    /// Bytes per written body.
    pub body_bytes: usize,
    /// The prefix of the keys.
    pub prefix: String,
    /// How long the load ran.
    pub seconds: f64,
    /// Requests answered with success, and checked.
    pub ok: u64,
    /// Failed requests by code (a contract code, `transport`, `protocol`, `http_NNN`, or
    /// `wrong_answer` for a success that did not check out).
    pub errors: BTreeMap<String, u64>,
    /// Successful requests per second.
    pub ops_per_sec: f64,
    /// Latencies of the successful requests (of a hand-off or watch run: of the hand-offs or
    /// the events, timed as `timing` says).
    pub latency_ms: Latencies,
    /// A hand-off or watch run's timing: what its latencies run from and to, on which clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    /// Whether the check after the run found every key as the run left it, or what it found.
    #[serde(serialize_with = "verdict")]
    pub verified: Result<&'static str, String>,
}

fn verdict<S: serde::Serializer>(
    v: &Result<&'static str, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "lowercase")]
    enum Verdict<'a> {
        Ok(&'a str),
        Failed(&'a str),
    }
    match v {
        Ok(m) => Verdict::Ok(m).serialize(s),
        Err(m) => Verdict::Failed(m).serialize(s),
    }
}

/// What a hand-off or a watch run timed, and how.
#[derive(Debug, Default, Serialize)]
pub struct Timing {
    /// From what to what each latency runs, and on which clock.
    pub from_to: &'static str,
    /// An expiry hand-off: the database clock minus this machine's (from the grants' times).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_offset_ms: Option<f64>,
    /// How far the offset may be off either way, so how far each expiry latency may be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock_offset_error_ms: Option<f64>,
    /// A watch run: the writes per second asked for, all writers together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<f64>,
    /// A watch run: the writes accepted per second, as sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes_per_sec: Option<f64>,
    /// A watch run: events that came before their write's answer (counted as 0 ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early: Option<u64>,
    /// A watch run: the same events timed from their write's sending instead (never early).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_send_ms: Option<Latencies>,
    /// A flood run: the other client's acquires (the run's latencies are its reads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquire_ms: Option<Latencies>,
    /// A flood run: the flooding acquires by the status they were answered (`waiting`: still
    /// queued at the end).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flood: Option<BTreeMap<String, u64>>,
}

/// Latency quantiles in milliseconds.
#[derive(Debug, Serialize)]
pub struct Latencies {
    /// The median.
    pub p50: f64,
    /// The 90th percentile.
    pub p90: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The slowest.
    pub max: f64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.latency_ms;
        let how = self
            .etcd_lock
            .map(|l| format!(" ({l:?})"))
            .unwrap_or_default();
        writeln!(
            f,
            "{:?} {:?}{how} x{} over {} keys, {} B bodies, {:.1}s",
            self.target, self.op, self.concurrency, self.keys, self.body_bytes, self.seconds
        )?;
        writeln!(f, "  ok          {} ({:.0}/s)", self.ok, self.ops_per_sec)?;
        writeln!(
            f,
            "  latency ms  p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
            l.p50, l.p90, l.p99, l.max
        )?;
        if let Some(t) = &self.timing {
            writeln!(f, "  timed       {}", t.from_to)?;
            if let (Some(offset), Some(error)) = (t.clock_offset_ms, t.clock_offset_error_ms) {
                writeln!(
                    f,
                    "  db clock    {offset:+.2} ms from this machine's (within {error:.2} ms)"
                )?;
            }
            if let (Some(rate), Some(writes)) = (t.rate, t.writes_per_sec) {
                writeln!(
                    f,
                    "  writes      {writes:.0}/s (asked {rate:.0}/s); {} events before their write's answer",
                    t.early.unwrap_or(0)
                )?;
            }
            if let Some(l) = &t.acquire_ms {
                writeln!(
                    f,
                    "  acquires    p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
                    l.p50, l.p90, l.p99, l.max
                )?;
            }
            if let Some(flood) = &t.flood {
                writeln!(f, "  flood       {flood:?}")?;
            }
            if let Some(l) = &t.from_send_ms {
                writeln!(
                    f,
                    "  from send   p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
                    l.p50, l.p90, l.p99, l.max
                )?;
            }
        }
        if self.errors.is_empty() {
            writeln!(f, "  errors      none")?;
        }
        for (code, n) in &self.errors {
            writeln!(f, "  errors      {code}: {n}")?;
        }
        match &self.verified {
            Ok(m) => writeln!(f, "  check       ok: {m}"),
            Err(m) => writeln!(f, "  check       FAILED: {m}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_latencies_keep_their_quantiles() {
        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        for ms in 1..=50 {
            a.record(Duration::from_millis(ms));
        }
        for ms in 51..=100 {
            b.record(Duration::from_millis(ms));
        }
        let recorder = Recorder::default();
        recorder.add(&a, &Errors::new());
        recorder.add(&b, &Errors::from([("lease_held".to_owned(), 2)]));
        let all = recorder.0.lock().unwrap();
        assert_eq!(all.0.0.len(), 100);
        assert!(
            (all.0.ms_at(0.5) - 50.0).abs() < 0.1,
            "{}",
            all.0.ms_at(0.5)
        );
        assert!(
            (all.0.ms_at(0.99) - 99.0).abs() < 0.1,
            "{}",
            all.0.ms_at(0.99)
        );
        assert_eq!(all.1.get("lease_held"), Some(&2));
    }
}
