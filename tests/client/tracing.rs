//! The Rust client passes its caller's trace context on (`snapfence_client::trace`): against a
//! `snapfence serve` process that exports its spans to a real OTLP receiver on loopback, the
//! server's span of each request a call makes is a child of the caller's span, in the caller's
//! trace, also for what a call leaves running (a keeper's renewals, a watch's reconnections);
//! without a context, each request's span is the root of a trace of its own. (In-process
//! instances export nothing: only the binary sets up the exporter from the `OTEL_*` variables.)

use std::time::Duration;

use snapfence_client::trace::{self, TraceContext};
use snapfence_client::{
    AcquireRequest, ChangeId, KeeperOptions, KeyPrefix, LeaseKeeper, PutOptions, WatchOptions,
};
use snapfence_testkit::otlp::{OtlpReceiver, ReceivedSpan, SpanKind};
use snapfence_testkit::serve::Served;

use crate::harness::{TestDatabase, migrated_database, url_of};
use crate::support::{client, grant, key, owner};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";
/// How long spans may take to arrive: a generous ceiling (they are sent every 100 ms).
const ARRIVAL: Duration = Duration::from_secs(30);

/// The caller's context, with `flags`.
fn caller(flags: &str) -> TraceContext {
    TraceContext::parse(&format!("00-{TRACE}-{CALLER}-{flags}")).unwrap()
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// A server span of the caller's trace whose parent is the caller's span.
fn assert_under_caller(span: &ReceivedSpan) {
    assert_eq!(span.trace_id, TRACE, "{span:?}");
    assert_eq!(span.parent_span_id.as_deref(), Some(CALLER), "{span:?}");
    assert_eq!(span.kind, SpanKind::Server as i32, "{span:?}");
}

/// `snapfence serve` on a database of its own, exporting its spans to a receiver of its own
/// every 100 ms.
struct Traced {
    // First: fields drop in order, and the server stops before its receiver and database go.
    _served: Served,
    /// `http://127.0.0.1:PORT`.
    base: String,
    receiver: OtlpReceiver,
    _db: TestDatabase,
    /// Its stderr.
    _log: tempfile::NamedTempFile,
}

impl Traced {
    /// Starts it with `args` added to `serve`'s, and waits until `/readyz` says it is ready.
    async fn start(args: &[&str]) -> Self {
        let receiver = OtlpReceiver::start().await;
        let db = migrated_database().await;
        let log = tempfile::Builder::new()
            .prefix("sf-tmp-tracing-")
            .tempfile()
            .unwrap();
        let url = url_of(db.options());
        let served = Served::start(
            env!("CARGO_BIN_EXE_snapfence"),
            ["--database-url", &url].iter().chain(args),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint()),
                ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ],
            log.path(),
        )
        .await;
        Self {
            base: served.base.clone(),
            _served: served,
            receiver,
            _db: db,
            _log: log,
        }
    }

    /// Waits until the spans received hold at least `n` named `name` for each `(name, n)`,
    /// and returns them all.
    async fn spans_named(&self, wanted: &[(&str, usize)]) -> Vec<ReceivedSpan> {
        self.receiver
            .wait_for(ARRIVAL, |spans| {
                wanted
                    .iter()
                    .all(|&(name, n)| named(spans, name).len() >= n)
            })
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_calls_in_a_trace_scope_are_server_spans_under_the_callers_span() {
    let served = Traced::start(&[]).await;
    let client = client(&served.base);
    let k = key("traced/put");
    trace::scope(caller("01"), async {
        let granted = grant(&client, &k, "w", Duration::from_secs(60)).await;
        client
            .put_snapshot(&k, granted.lease.token, "state", &PutOptions::default())
            .await
            .unwrap();
    })
    .await;

    let spans = served
        .spans_named(&[("POST /v1/leases/{key}", 1), ("PUT /v1/snapshots/{key}", 1)])
        .await;
    for name in ["POST /v1/leases/{key}", "PUT /v1/snapshots/{key}"] {
        let of_call = named(&spans, name);
        assert!(!of_call.is_empty(), "no span {name}: {spans:#?}");
        for span in of_call {
            assert_under_caller(span);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_outside_any_scope_is_the_root_span_of_a_trace_of_its_own() {
    let served = Traced::start(&[]).await;
    let client = client(&served.base);
    let k = key("traced/status");
    let inside = trace::scope(caller("01"), client.lease_status(&k)).await;
    assert!(matches!(
        inside,
        Err(snapfence_client::Error::NotFound { .. })
    ));
    let outside = client.lease_status(&k).await;
    assert!(matches!(
        outside,
        Err(snapfence_client::Error::NotFound { .. })
    ));

    let spans = served.spans_named(&[("GET /v1/leases/{key}", 2)]).await;
    let (ours, roots): (Vec<_>, Vec<_>) = named(&spans, "GET /v1/leases/{key}")
        .into_iter()
        .partition(|s| s.trace_id == TRACE);
    assert_eq!(ours.len(), 1, "{spans:#?}");
    assert_under_caller(ours[0]);
    assert_eq!(roots.len(), 1, "{spans:#?}");
    assert_eq!(roots[0].parent_span_id, None, "{:?}", roots[0]);
    assert_eq!(roots[0].kind, SpanKind::Server as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callers_unsampled_flag_is_passed_on_and_its_request_is_not_recorded() {
    let served = Traced::start(&[]).await;
    let client = client(&served.base);
    let unsampled = key("traced/unsampled");
    let sampled = key("traced/sampled");
    let r = trace::scope(caller("00"), client.lease_status(&unsampled)).await;
    assert!(matches!(r, Err(snapfence_client::Error::NotFound { .. })));
    // Sent after it, so exported with it or after it, were it recorded.
    let r = trace::scope(caller("01"), client.lease_status(&sampled)).await;
    assert!(matches!(r, Err(snapfence_client::Error::NotFound { .. })));

    served.spans_named(&[("GET /v1/leases/{key}", 1)]).await;
    // The unsampled request's span, had it been recorded, ended first: it would have come in
    // the same batch or an earlier one. Some more schedules are a generous margin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spans = served.receiver.spans();
    let gets = named(&spans, "GET /v1/leases/{key}");
    assert!(
        gets.iter().all(|s| s.trace_id == TRACE),
        "only the caller's trace: {spans:#?}"
    );
    let ids: std::collections::BTreeSet<&str> = gets.iter().map(|s| s.span_id.as_str()).collect();
    assert_eq!(ids.len(), 1, "the sampled call's span only: {spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_renews_and_releases_when_dropped_in_the_trace_it_started_in() {
    let served = Traced::start(&[]).await;
    let client = client(&served.base);
    let k = key("traced/kept");
    let request = AcquireRequest::new(owner("keeper"), Duration::from_secs(5));
    let options = KeeperOptions::default().renew_every(Duration::from_millis(200));
    let keeper = trace::scope(
        caller("01"),
        LeaseKeeper::acquire(&client, &k, &request, options),
    )
    .await
    .unwrap();
    // From here on no scope: the renewals run in the keeper's own task.
    served
        .spans_named(&[("POST /v1/leases/{key}/renew", 2)])
        .await;
    drop(keeper);

    let spans = served.spans_named(&[("DELETE /v1/leases/{key}", 1)]).await;
    for name in [
        "POST /v1/leases/{key}",
        "POST /v1/leases/{key}/renew",
        "DELETE /v1/leases/{key}",
    ] {
        let of_keeper = named(&spans, name);
        assert!(!of_keeper.is_empty(), "no span {name}: {spans:#?}");
        for span in of_keeper {
            assert_under_caller(span);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reconnects_in_the_trace_it_was_opened_in_wherever_it_is_polled() {
    // Each stream ends after 300 ms, and the watch connects again.
    let served = Traced::start(&["--max-watch", "300ms"]).await;
    let client = client(&served.base);
    let options = WatchOptions::new()
        .prefix(KeyPrefix::parse("traced/").unwrap())
        .since(ChangeId::ORIGIN);
    let watch = trace::scope(caller("01"), async { client.watch(&options) }).await;
    // Polled by a task of its own, which no scope encloses.
    let polled = tokio::spawn(async move {
        let mut watch = watch;
        while let Some(change) = watch.next().await {
            change.unwrap();
        }
    });

    let spans = served.spans_named(&[("GET /v1/watch", 2)]).await;
    assert!(!polled.is_finished(), "the watch ended: {:?}", polled.await);
    polled.abort();
    for span in named(&spans, "GET /v1/watch") {
        assert_under_caller(span);
    }
}
