//! The fault scenarios: each runs the workload against real service processes and real
//! PostgreSQL clusters, injects one kind of fault under load, checks the history, and prints its
//! figures. `SNAPFENCE_FAULTS_LONG=1` runs each for longer, with more faults. Besides the
//! clients that put single keys, transaction clients commit several puts at once under a
//! namespace lease, so each promise is checked for transactions too (whole or not at all, once
//! after a retry with its Idempotency-Key, fenced by their namespace's grants, audited once).

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use snapfence_testkit::pgbouncer::PgBouncer;
use tokio::task::JoinHandle;

use crate::checker::{Call, Micros, Outcome, Property, Report, check};
use crate::cluster::{Cluster, ClusterSpec, Service, scratch, tcp_url};
use crate::proxy::Proxy;
use crate::workload::{self, Plan, Recorder, final_state};

/// How many times longer than in CI the scenarios run.
pub(crate) fn scale() -> u32 {
    match std::env::var("SNAPFENCE_FAULTS_LONG").as_deref() {
        Ok("1") => 6,
        _ => 1,
    }
}

const TTL_MS: i64 = 200;

pub(crate) fn plan(seconds: u64) -> Plan {
    Plan {
        clients: if scale() > 1 { 24 } else { 12 },
        keys: 3,
        ttl_ms: TTL_MS,
        duration: Duration::from_secs(seconds) * scale(),
        stall_chance: 0.1,
        idempotency_keys: true,
        min_changing_calls: 0,
        txn_clients: if scale() > 1 { 8 } else { 4 },
    }
}

pub(crate) fn unix_only() -> ClusterSpec {
    ClusterSpec {
        tcp: false,
        extra: vec![],
    }
}

fn with_tcp(extra: Vec<(&'static str, String)>) -> ClusterSpec {
    ClusterSpec { tcp: true, extra }
}

/// A workload running in the background.
pub(crate) struct Load {
    pub(crate) plan: Plan,
    pub(crate) recorder: Arc<Recorder>,
    task: JoinHandle<()>,
}

impl Load {
    pub(crate) fn start(plan: Plan, services: &[&Service]) -> Self {
        Self::start_on(plan, services.iter().map(|s| s.base()).collect())
    }

    /// [`start`](Self::start) with the clients sent to `bases` (gateways in front of the
    /// services, say) rather than to the services themselves.
    pub(crate) fn start_on(plan: Plan, bases: Vec<String>) -> Self {
        let recorder = Arc::new(Recorder::default());
        let task = tokio::spawn(workload::run(plan.clone(), bases, recorder.clone()));
        Self {
            plan,
            recorder,
            task,
        }
    }

    /// Grants [`BURST`] more keys (`burst-0`, …), one after the other, through `service` as one
    /// more client, and returns the largest token handed out so far. They are more grants than
    /// the 32 sequence values PostgreSQL logs ahead: what a primary acknowledges while its
    /// standbys receive nothing leaves a promoted standby's sequence behind.
    pub(crate) async fn grant_burst(&self, service: &Service) -> i64 {
        let burst: Vec<String> = (0..BURST).map(|i| format!("burst-{i}")).collect();
        workload::acquire_each(&self.plan, service.base(), self.recorder.clone(), &burst).await;
        self.recorder.highest_token().expect("grants")
    }

    /// Once a write sent after `at` (a failover) is accepted, lets the clients go on for a
    /// second more and stops them: however slow the machine, the promoted server has served
    /// the workload (and secured its tokens at its first grant) before the verdict.
    async fn stop_once_served_after(&self, at: Micros) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.recorder.first_write_after(at).is_none() {
            assert!(
                Instant::now() < deadline,
                "no write was accepted in the minute after the failover"
            );
            sleep_ms(100).await;
        }
        sleep_ms(1000).await;
        self.recorder.stop();
    }

    pub(crate) fn running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Waits (at most 200 ms) until a transaction is in flight to one of `services`, so that
    /// a fault done next lands in the middle of it; returns whether one is.
    async fn until_txn_in_flight(&self, services: &[Service]) -> bool {
        let in_flight = || {
            services
                .iter()
                .any(|s| self.recorder.txn_in_flight(&s.base()))
        };
        for _ in 0..200 {
            if in_flight() {
                break;
            }
            sleep_ms(1).await;
        }
        in_flight()
    }

    /// Waits for the clients to finish, reads the end state through `service`, checks the
    /// history and prints the scenario's figures.
    pub(crate) async fn verdict(self, scenario: &str, faults: usize, service: &Service) -> Report {
        self.task.await.expect("the workload");
        let end = final_state(&service.base(), &self.plan.keys()).await;
        let report = check(&self.recorder.history(), &end);
        // Straight to the standard error, past the test harness's capture: the figures belong
        // in every run's log, passing or not.
        let mut err = std::io::stderr().lock();
        writeln!(
            err,
            "faults: {scenario}: {faults} faults injected; {report}; {}",
            self.recorder.figures()
        )
        .ok();
        for a in report.anomalies.iter().take(10) {
            writeln!(err, "faults:   {:?}: {}", a.property, a.detail).ok();
        }
        report
    }
}

/// A plan that runs until its scenario stops it ([`Recorder::stop`]).
fn until_stopped() -> Plan {
    Plan {
        duration: Duration::from_secs(600),
        ..plan(0)
    }
}

/// How many grants [`Load::grant_burst`] makes.
pub(crate) const BURST: usize = 100;

/// The exactly-once promise of `Idempotency-Key`, over a scenario's run: at least
/// [`EXACTLY_ONCE_CALLS`] changing calls, each settled by a retry with its key (none left
/// unknown), none done twice, every grant known to its client (the last two are the checker's
/// [`Property::DuplicateEffect`] and [`Property::UnreportedGrant`], among the rest it checks).
/// Whether some outcome was unknown at all depends on the fault (an immediate stop mostly
/// refuses connections, which changes nothing), so the scenarios that always lose answers (a
/// cut link, a killed service) assert that themselves.
pub(crate) fn assert_exactly_once(report: &Report, recorder: &Recorder, at_least: usize) {
    assert_clean(report);
    let figures = recorder.figures();
    let unsettled = recorder
        .history()
        .iter()
        .filter(|o| !matches!(o.call, Call::Get) && matches!(o.outcome, Outcome::Indeterminate(_)))
        .count();
    writeln!(
        std::io::stderr(),
        "faults:   exactly once: {figures}; writes done twice {}, grants unknown to their client \
         {}, changing calls left unknown {unsettled}",
        report.count(Property::DuplicateEffect),
        report.count(Property::UnreportedGrant)
    )
    .ok();
    assert!(
        figures.changing_calls >= at_least,
        "at least {at_least} changing calls: {figures}"
    );
    assert_eq!(
        unsettled, 0,
        "every changing call was settled by its retries"
    );
}

/// The fewest changing calls over which a scenario checks the exactly-once promise.
pub(crate) const EXACTLY_ONCE_CALLS: usize = 1000;

/// The plan of a scenario that checks the exactly-once promise: twice the clients for longer,
/// and on until [`EXACTLY_ONCE_CALLS`] are made, although the faults hold every call up for a
/// while.
pub(crate) fn exactly_once_plan() -> Plan {
    Plan {
        clients: plan(0).clients * 2,
        txn_clients: plan(0).txn_clients * 2,
        min_changing_calls: EXACTLY_ONCE_CALLS,
        ..plan(12)
    }
}

pub(crate) async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Some of the faults landed while a transaction was in flight (`mid_txn` of them), and
/// transactions were cut: answered `503 unavailable` (a transaction cut before its COMMIT was
/// sent; the checker has verified that it left nothing) or sent again with their key after an
/// unknown outcome.
fn assert_txns_cut(mid_txn: usize, recorder: &Recorder) {
    let unavailable = recorder
        .history()
        .iter()
        .filter(|o| matches!(o.call, Call::Txn { .. }) && o.outcome == Outcome::NoEffect)
        .count();
    let figures = recorder.figures();
    writeln!(
        std::io::stderr(),
        "faults:   transactions cut: {unavailable} answered 503 unavailable, {} attempts sent \
         again after an unknown outcome",
        figures.txn_unknown_attempts
    )
    .ok();
    assert!(
        mid_txn > 0 && unavailable + figures.txn_unknown_attempts > 0,
        "the faults cut transactions: {mid_txn} faults mid-transaction, {unavailable} \
         transactions answered 503 unavailable; {figures}"
    );
}

/// Prints how many of the faults landed while a transaction was in flight.
fn note_mid_txn(mid_txn: usize, faults: usize, what: &str) {
    // Past the test harness's capture, as `Load::verdict` does.
    writeln!(
        std::io::stderr(),
        "faults:   {mid_txn} of the {faults} {what} landed while a transaction was in flight"
    )
    .ok();
}

pub(crate) fn assert_clean(report: &Report) {
    assert!(
        report.anomalies.is_empty(),
        "{report}: {:#?}",
        report.anomalies
    );
}

/// The transaction clients did their share under the fault: some transactions committed, and
/// (the checker having found nothing) each whole, once, and fenced.
pub(crate) fn assert_transactions_ran(report: &Report) {
    assert!(
        report.committed_txns > 0,
        "transactions committed: {report}"
    );
}

pub(crate) async fn two_services(url: &str, dir: &Path, broken: bool) -> [Service; 2] {
    [
        Service::start(url, dir, broken).await,
        Service::start(url, dir, broken).await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_paused_past_its_ttl_is_fenced_off_when_it_wakes() {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let services = two_services(&db.url(), dir.path(), false).await;
    let load = Load::start(plan(8), &[&services[0], &services[1]]);
    // Besides the holders that stall themselves, freeze a whole service process with its
    // requests in flight for three TTLs: its holders' writes arrive after a takeover.
    let mut faults = 0;
    while load.running() {
        sleep_ms(700).await;
        let frozen = &services[faults % 2];
        frozen.pause();
        sleep_ms(3 * TTL_MS as u64).await;
        frozen.resume();
        faults += 1;
    }
    let report = load.verdict("paused holder", faults, &services[0]).await;
    assert_clean(&report);
    assert!(
        report.refused_writes > 0,
        "some holder woke up after a takeover and was refused: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_restarts_of_postgres_lose_no_acknowledged_write_and_never_reissue_a_token() {
    let dir = scratch();
    let mut db = Cluster::primary(dir.path(), &unix_only()).await;
    let services = two_services(&db.url(), dir.path(), false).await;
    let crashes = 3 * scale() as usize;
    // Each crash takes 1.3 s of pauses plus the crash and the restart (recovery from the WAL):
    // 4 s each leaves time for a slow restart on a loaded machine.
    let plan = Plan {
        duration: Duration::from_secs(4 * crashes as u64 + 2),
        min_changing_calls: EXACTLY_ONCE_CALLS,
        ..plan(0)
    };
    let load = Load::start(plan, &[&services[0], &services[1]]);
    let mut faults = 0;
    let mut mid_txn = 0;
    while load.running() && faults < crashes {
        sleep_ms(1000).await;
        mid_txn += usize::from(load.until_txn_in_flight(&services).await);
        db.crash();
        sleep_ms(300).await;
        db.restart();
        faults += 1;
    }
    let recorder = load.recorder.clone();
    let report = load
        .verdict("postgres crash-restart", faults, &services[0])
        .await;
    assert_exactly_once(&report, &recorder, EXACTLY_ONCE_CALLS);
    assert_transactions_ran(&report);
    note_mid_txn(mid_txn, faults, "crashes");
    assert_txns_cut(mid_txn, &recorder);
    assert_eq!(faults, crashes, "every crash happened under load");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pgbouncer_killed_and_restarted_under_load_loses_no_acknowledged_write_and_doubles_none() {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let direct: sqlx::postgres::PgConnectOptions = db.url().parse().unwrap();
    let mut bouncer =
        tokio::task::block_in_place(|| PgBouncer::start(&direct)).expect("starting PgBouncer");
    let pooled = bouncer.url(direct.get_database().expect("the URL names its database"));
    let direct_url = db.url();
    let args = ["--database-direct-url", direct_url.as_str()];
    let services = [
        Service::start_with(&pooled, dir.path(), false, &args).await,
        Service::start_with(&pooled, dir.path(), false, &args).await,
    ];
    let restarts = 3 * scale() as usize;
    let plan = Plan {
        duration: Duration::from_secs(3 * restarts as u64 + 2),
        min_changing_calls: EXACTLY_ONCE_CALLS,
        ..plan(0)
    };
    let load = Load::start(plan, &[&services[0], &services[1]]);
    let mut faults = 0;
    let mut mid_txn = 0;
    while load.running() && faults < restarts {
        sleep_ms(1000).await;
        mid_txn += usize::from(load.until_txn_in_flight(&services).await);
        tokio::task::block_in_place(|| bouncer.restart()).expect("restarting PgBouncer");
        faults += 1;
    }
    let recorder = load.recorder.clone();
    let report = load
        .verdict("pgbouncer kill-restart", faults, &services[0])
        .await;
    assert_exactly_once(&report, &recorder, EXACTLY_ONCE_CALLS);
    assert_transactions_ran(&report);
    note_mid_txn(mid_txn, faults, "PgBouncer kills");
    assert_txns_cut(mid_txn, &recorder);
    assert_eq!(faults, restarts, "every kill happened under load");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_service_killed_mid_request_leaves_the_other_serving_and_fencing_intact() {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let mut services = two_services(&db.url(), dir.path(), false).await;
    let load = Load::start(plan(8), &[&services[0], &services[1]]);
    let mut faults = 0;
    let mut mid_txn = 0;
    while load.running() {
        sleep_ms(800).await;
        let victim = &mut services[faults % 2];
        mid_txn += usize::from(load.until_txn_in_flight(std::slice::from_ref(victim)).await);
        victim.kill();
        sleep_ms(300).await;
        victim.restart().await;
        faults += 1;
    }
    let recorder = load.recorder.clone();
    let report = load.verdict("service SIGKILL", faults, &services[0]).await;
    assert_clean(&report);
    assert_transactions_ran(&report);
    let figures = recorder.figures();
    note_mid_txn(mid_txn, faults, "kills");
    assert!(
        mid_txn > 0 && figures.txn_unknown_attempts > 0,
        "some kill cut a transaction, which was sent again: {mid_txn} kills mid-transaction; \
         {figures}"
    );
}

/// A primary reachable on TCP only through a proxy, and two services behind the proxy.
async fn behind_a_proxy(dir: &Path) -> (Cluster, Proxy, [Service; 2]) {
    let db = Cluster::primary(dir, &with_tcp(vec![])).await;
    let proxy = Proxy::start(db.tcp_addr()).await;
    let services = two_services(&tcp_url(proxy.addr()), dir, false).await;
    (db, proxy, services)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answers_lost_after_commit_leave_indeterminate_operations_and_nothing_else() {
    let dir = scratch();
    let (_db, proxy, services) = behind_a_proxy(dir.path()).await;
    let load = Load::start(exactly_once_plan(), &[&services[0], &services[1]]);
    let mut faults = 0;
    let mut mid_txn = 0;
    while load.running() {
        sleep_ms(600).await;
        mid_txn += usize::from(load.until_txn_in_flight(&services).await);
        // In turn: cut every connection; stall them past the service's timeout, then let the
        // late answers through; stall them, then cut.
        match faults % 3 {
            0 => proxy.cut(),
            1 => {
                proxy.stall();
                sleep_ms(1500).await;
                proxy.resume();
            }
            _ => {
                proxy.stall();
                sleep_ms(1500).await;
                proxy.cut();
                proxy.resume();
            }
        }
        faults += 1;
    }
    let recorder = load.recorder.clone();
    let report = load
        .verdict("database link cut or stalled", faults, &services[0])
        .await;
    assert_exactly_once(&report, &recorder, EXACTLY_ONCE_CALLS);
    assert_transactions_ran(&report);
    note_mid_txn(mid_txn, faults, "cuts and stalls");
    assert_txns_cut(mid_txn, &recorder);
    let figures = recorder.figures();
    assert!(
        figures.unknown_attempts > 0,
        "some answer was lost: {figures}"
    );
    assert_eq!(
        recorder.figures().timed_out_attempts,
        0,
        "the service answered every attempt (503 at worst) before the client gave up"
    );
}

/// Runs `plan` against two services while PostgreSQL is frozen (SIGSTOP) for 1.5 s at a time,
/// and returns the verdict with the run's recorder.
async fn under_freezes(plan: Plan, scenario: &str) -> (Report, Arc<Recorder>) {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let services = two_services(&db.url(), dir.path(), false).await;
    let load = Load::start(plan, &[&services[0], &services[1]]);
    let mut faults = 0;
    while load.running() {
        sleep_ms(700).await;
        db.freeze();
        sleep_ms(1500).await;
        db.thaw();
        faults += 1;
    }
    let recorder = load.recorder.clone();
    let report = load.verdict(scenario, faults, &services[0]).await;
    (report, recorder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_database_is_answered_within_the_bound_and_only_unknown_outcomes_are_indeterminate()
 {
    let (report, recorder) = under_freezes(exactly_once_plan(), "PostgreSQL frozen").await;
    assert_exactly_once(&report, &recorder, EXACTLY_ONCE_CALLS);
    let figures = recorder.figures();
    assert!(
        report.unavailable > 0 || figures.unknown_attempts > 0,
        "the freezes were felt: {report}"
    );
    // Every attempt's answer within the service's 1 s bound, with slack for a loaded machine:
    // the maximum, not the mean. (Honesty is the checker's: no call answered `unavailable` took
    // effect.)
    assert!(
        figures.slowest_attempt < Duration::from_millis(2500),
        "every attempt answered within the 1 s database bound and some slack; the slowest took {} ms",
        figures.slowest_attempt.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_idempotency_keys_retries_after_a_freeze_take_effect_twice_and_are_found() {
    let plan = Plan {
        idempotency_keys: false,
        ..exactly_once_plan()
    };
    let (report, _) = under_freezes(plan, "negative control, retries without keys").await;
    let twice = report.count(Property::DuplicateEffect) + report.count(Property::UnreportedGrant);
    assert!(
        twice > 0,
        "retried without keys, some write or grant took effect twice or unseen: {report}"
    );
}

/// Asks for a lease on `services[0]` `warm` times at once (opening as many connections), lets
/// them sit for `idle`, stalls the database link, and asserts that one more acquire is answered
/// 503 within the 1 s database timeout and some slack.
async fn stalled_link_answers_503_in_time(warm: usize, idle: Duration) {
    let dir = scratch();
    let (_db, proxy, services) = behind_a_proxy(dir.path()).await;
    let http = reqwest::Client::new();
    let acquire = |key: String| {
        http.post(format!("{}/v1/leases/{key}", services[0].base()))
            .json(&json!({"owner": "w", "ttl_ms": 60000}))
            .timeout(Duration::from_secs(30))
            .send()
    };
    let opened = futures_util::future::join_all((0..warm).map(|i| acquire(format!("before-{i}"))));
    for r in opened.await {
        assert_eq!(r.unwrap().status(), StatusCode::CREATED);
    }
    tokio::time::sleep(idle).await;
    proxy.stall();
    let asked = Instant::now();
    let r = acquire("during".into())
        .await
        .expect("an answer, not a timeout");
    let waited = asked.elapsed();
    proxy.cut();
    proxy.resume();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        waited < Duration::from_millis(2500),
        "answered within the 1 s database timeout and some slack, not after {waited:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_database_link_is_answered_503_within_the_timeout_not_hung() {
    stalled_link_answers_503_in_time(1, Duration::ZERO).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stalled_database_behind_an_idle_pool_is_answered_503_within_the_timeout() {
    // Idle long enough for every connection to be checked before its next use: each check
    // waits on the stalled link, and all of them together must still fit in the timeout.
    stalled_link_answers_503_in_time(8, Duration::from_millis(1500)).await;
}

/// Polls the primary until `n` standbys stream from it (synchronously, if `sync`).
async fn wait_for_standbys(primary: &Cluster, sync: bool) {
    let sql = if sync {
        "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
    } else {
        "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while primary.scalar(sql).await < 1 {
        assert!(Instant::now() < deadline, "the standby never streamed");
        sleep_ms(100).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_to_a_synchronous_standby_loses_no_acknowledged_write_nor_reissues_a_token() {
    let dir = scratch();
    let primary = Cluster::primary(&dir.path().join("p"), &with_tcp(vec![])).await;
    let standby = Cluster::standby(
        &dir.path().join("s"),
        &primary.pg.conninfo(),
        &with_tcp(vec![]),
    );
    // Only now: with a synchronous standby named and none there yet, every commit would wait.
    for sql in [
        "ALTER SYSTEM SET synchronous_commit = 'on'",
        "ALTER SYSTEM SET synchronous_standby_names = '*'",
        "SELECT pg_reload_conf()",
    ] {
        primary.execute(sql).await;
    }
    wait_for_standbys(&primary, true).await;
    // The services reach the database at a virtual address, moved to the standby on failover.
    let vip = Proxy::start(primary.tcp_addr()).await;
    let services = two_services(&tcp_url(vip.addr()), dir.path(), false).await;
    let load = Load::start(until_stopped(), &[&services[0], &services[1]]);
    sleep_ms(3000).await;
    let at = workload::now();
    primary.crash();
    standby.promote();
    vip.retarget(standby.tcp_addr());
    load.stop_once_served_after(at).await;
    let report = load.verdict("failover, synchronous", 1, &services[0]).await;
    assert_clean(&report);
    assert_eq!(
        standby.scalar("SELECT timeline FROM token_timeline").await,
        2,
        "the promoted standby secured its token sequence on its new timeline"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_to_a_lagging_asynchronous_standby_never_reissues_a_token() {
    let dir = scratch();
    let primary = Cluster::primary(&dir.path().join("p"), &with_tcp(vec![])).await;
    // Replication runs through a proxy too, so that the test can make the standby fall behind.
    let link = Proxy::start(primary.tcp_addr()).await;
    let standby = Cluster::standby(
        &dir.path().join("s"),
        &format!("host=127.0.0.1 port={} user=postgres", link.addr().port()),
        &with_tcp(vec![]),
    );
    wait_for_standbys(&primary, false).await;
    let vip = Proxy::start(primary.tcp_addr()).await;
    let services = two_services(&tcp_url(vip.addr()), dir.path(), false).await;
    let load = Load::start(until_stopped(), &[&services[0], &services[1]]);
    sleep_ms(2000).await;
    link.stall();
    let handed_out = load.grant_burst(&services[0]).await;
    let at = workload::now();
    primary.crash();
    standby.promote();
    let standby_sequence = standby
        .scalar("SELECT last_value FROM fencing_token_seq")
        .await;
    vip.retarget(standby.tcp_addr());
    load.stop_once_served_after(at).await;
    let report = load
        .verdict("failover, asynchronous", 1, &services[0])
        .await;
    let secured_at = standby
        .scalar("SELECT position FROM token_timeline WHERE timeline = 2")
        .await;
    writeln!(
        std::io::stderr(),
        "faults: failover, asynchronous: tokens handed out up to {handed_out}, the promoted \
         standby's sequence stood at {standby_sequence}, the guard moved it to {secured_at}; \
         tokens issued twice or out of order: {}",
        report.count(Property::TokenReissued) + report.count(Property::TokenRegression)
    )
    .ok();
    assert!(
        standby_sequence < handed_out,
        "the danger is real: the promoted standby's sequence ({standby_sequence}) is behind \
         tokens already handed out ({handed_out})"
    );
    assert!(
        report.except(&LOST_WITH_ASYNC).is_empty(),
        "{:#?}",
        report.except(&LOST_WITH_ASYNC)
    );
    assert_eq!(report.count(Property::TokenReissued), 0);
    assert_eq!(report.count(Property::TokenRegression), 0);
    assert!(
        secured_at > handed_out,
        "the guard moved the sequence ({secured_at}) past every token handed out ({handed_out})"
    );
}

/// What a failover to an asynchronous standby that lacks acknowledged commits may show, as the
/// documented price of asynchronous replication: lost writes, and the grants lost with them
/// (whose holders' writes then look late, and their refusals unjustified). A token issued twice
/// or out of order is not among them.
pub(crate) const LOST_WITH_ASYNC: [Property; 6] = [
    Property::LostWrite,
    Property::StaleRead,
    Property::WriteAfterNewerGrant,
    Property::OverlappingLeases,
    Property::UnjustifiedRefusal,
    Property::AuditMismatch,
];

/// The negative control's workload: two services, holders that stall past their TTL half the
/// time, so that a superseded holder often wakes before its successor's first write (the window
/// that checking against written tokens leaves open).
async fn stalling_holders(broken: bool) -> Report {
    let plan = Plan {
        stall_chance: 0.5,
        ..plan(6)
    };
    let name = if broken {
        "negative control, fencing broken"
    } else {
        "negative control, fencing intact"
    };
    stalling(plan, broken, name).await
}

/// Runs `plan` against two services, with fencing broken or not, and returns the verdict.
async fn stalling(plan: Plan, broken: bool, name: &str) -> Report {
    let dir = scratch();
    let db = Cluster::primary(dir.path(), &unix_only()).await;
    let services = two_services(&db.url(), dir.path(), broken).await;
    let load = Load::start(plan, &[&services[0], &services[1]]);
    load.verdict(name, 0, &services[0]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_fencing_checked_against_written_tokens_the_checker_finds_late_writes() {
    let report = stalling_holders(true).await;
    assert!(
        report.count(Property::WriteAfterNewerGrant) > 0,
        "the checker caught the broken fencing: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_fencing_intact_the_negative_controls_workload_has_no_anomalies() {
    let report = stalling_holders(false).await;
    assert_clean(&report);
    assert!(
        report.refused_writes > 0 && report.refused_txns > 0,
        "late writes and late transactions were refused: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_fencing_checked_against_written_tokens_the_checker_finds_late_transactions() {
    // Transaction clients only: every write the checker finds late is a transaction's put.
    let plan = Plan {
        clients: 0,
        txn_clients: 8,
        stall_chance: 0.5,
        ..plan(6)
    };
    let report = stalling(plan, true, "negative control, transactions, fencing broken").await;
    assert!(
        report.count(Property::WriteAfterNewerGrant) > 0,
        "the checker caught the broken fencing of transactions: {report}"
    );
}
