//! Answers lost on their way back to the client, after the service has done the call: the
//! clients reach each service through a TCP gateway that, for some connections, forwards the
//! request and drops the answer. Each such call is sent again with its Idempotency-Key, and
//! must be answered from the key's record: done once, never twice, transactions included.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::checker::{Property, Report};
use crate::cluster::{Cluster, Service, scratch};
use crate::proxy::{Mode, Proxy};
use crate::scenarios::{
    EXACTLY_ONCE_CALLS, Load, assert_exactly_once, assert_transactions_ran, exactly_once_plan,
    plan, sleep_ms, two_services, unix_only,
};
use crate::workload::{Plan, Recorder};

/// How many of the connections opened after each cut lose their answer.
const DROPS: usize = 8;

/// The loopback address a service listens on.
fn addr_of(service: &Service) -> SocketAddr {
    let base = service.base();
    base.trim_start_matches("http://")
        .parse()
        .unwrap_or_else(|e| panic!("{base} is not an HTTP address: {e}"))
}

/// Runs `plan` through gateways in front of two services that, every 600 ms, cut their open
/// connections and drop the answers of the next [`DROPS`]: each of those requests reaches its
/// service, which acts on it, and the client sees the connection close.
async fn through_dropping_gateways(plan: Plan, scenario: &str) -> (Report, Arc<Recorder>) {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let services = two_services(&db.url(), dir.path(), false).await;
    let gateways = [
        Proxy::start(addr_of(&services[0])).await,
        Proxy::start(addr_of(&services[1])).await,
    ];
    let load = Load::start_on(plan, gateways.iter().map(Proxy::base).collect());
    // Per gateway, the count of connections by which the drops queued so far are used up: no
    // more are queued before, or on a loaded machine every connection would come to lose its
    // answer and no retry would get through.
    let mut dropping_until = [0; 2];
    let mut faults = 0;
    while load.running() {
        sleep_ms(600).await;
        for (gateway, until) in gateways.iter().zip(&mut dropping_until) {
            let accepted = gateway.connections();
            if accepted >= *until {
                gateway.next_connections(vec![Mode::DropAnswer; DROPS]);
                *until = accepted + DROPS;
            }
            gateway.cut();
        }
        faults += 1;
    }
    let recorder = load.recorder.clone();
    let report = load.verdict(scenario, faults, &services[0]).await;
    (report, recorder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_dropped_after_the_service_acted_are_replayed_to_the_retry_with_its_key() {
    let (report, recorder) =
        through_dropping_gateways(exactly_once_plan(), "answers dropped by a gateway").await;
    assert_exactly_once(&report, &recorder, EXACTLY_ONCE_CALLS);
    assert_transactions_ran(&report);
    let figures = recorder.figures();
    assert!(
        figures.txn_replays > 0,
        "some transaction's answer was lost after it was done, and its retry was answered from \
         its Idempotency-Key's record: {figures}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_idempotency_keys_transactions_whose_answers_were_dropped_take_effect_twice_and_are_found()
 {
    // Transaction clients only: every body stored twice is a transaction's put.
    let plan = Plan {
        clients: 0,
        txn_clients: 8,
        idempotency_keys: false,
        ..plan(6)
    };
    let (report, _) =
        through_dropping_gateways(plan, "negative control, transactions retried without keys")
            .await;
    assert!(
        report.count(Property::DuplicateEffect) > 0,
        "retried without keys, some transaction took effect twice: {report}"
    );
}
