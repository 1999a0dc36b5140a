//! The fencing invariant under real concurrency, with no fault injected: many clients on two
//! instances over a few keys loop acquire (short TTL) → write, some of them stalling past their
//! TTL as a paused holder would, and the one checker of fencing histories
//! (`snapfence_testkit::checker`, the fault tests' own) judges the recorded history against
//! what the database holds at the end.

use std::sync::Arc;
use std::time::Duration;

use snapfence::Rules;
use snapfence_testkit::checker::check;
use snapfence_testkit::harness::TestApp;
use snapfence_testkit::workload::{self, Plan, Recorder, final_state};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn accepted_writes_always_carry_the_newest_token_under_racing_holders() {
    // Every version is kept, so that the checker can tell a superseded write from a lost one.
    let app = TestApp::spawn_with(Rules {
        keep_versions: 100_000,
        ..Rules::default()
    })
    .await;
    let second = app.another_instance().await;
    let plan = Plan {
        clients: 12,
        keys: 3,
        ttl_ms: 150,
        duration: Duration::from_secs(3),
        stall_chance: 0.3,
        idempotency_keys: true,
        min_changing_calls: 0,
        txn_clients: 0,
    };
    let recorder = Arc::new(Recorder::default());
    workload::run(
        plan.clone(),
        vec![app.instance.base.clone(), second.base.clone()],
        recorder.clone(),
    )
    .await;
    let end = final_state(&app.instance.base, &plan.keys()).await;
    let report = check(&recorder.history(), &end);
    assert!(
        report.anomalies.is_empty(),
        "{report}: {:#?}",
        report.anomalies
    );
    assert!(
        report.accepted_writes > 0 && report.refused_writes > 0,
        "the race exercised both outcomes: {report}"
    );
    second.stop().await;
    app.stop().await;
}
