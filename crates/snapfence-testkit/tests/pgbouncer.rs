//! The testkit's PgBouncer: a real one, in transaction pooling mode, in front of the test
//! cluster. Many clients share its few server connections, and it can be killed and started
//! again under load.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use snapfence_testkit::harness::{TestDatabase, fresh_database};
use snapfence_testkit::pgbouncer::{POOL_SIZE, PgBouncer};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::Barrier;

const CLIENTS: usize = 50;
const TRANSACTIONS: usize = 20;

/// A PgBouncer in front of the test cluster (killed by its watchdog if this process dies
/// before it is dropped).
fn bouncer(database: &TestDatabase) -> PgBouncer {
    // Said with `{e}`: the error carries PgBouncer's configuration and log, line by line.
    PgBouncer::start(database.options()).unwrap_or_else(|e| panic!("starting PgBouncer: {e}"))
}

/// One explicit transaction asking for the server process it ran on. The statement is not
/// prepared for keeps: in transaction mode the next transaction may run on another server.
async fn backend_pid(conn: &mut PgConnection) -> Result<i32, sqlx::Error> {
    let mut tx = conn.begin().await?;
    let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
        .persistent(false)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(pid)
}

/// `clients` connections, all open at once for the whole run, each running `TRANSACTIONS`
/// transactions; every client's outcome: the server process ids its transactions ran on.
async fn run_clients(options: &PgConnectOptions, clients: usize) -> Vec<Result<Vec<i32>, String>> {
    // Every client connects before any transaction starts, and disconnects only once every
    // client is done: the clients are never fewer than `clients` at once.
    let connected = Arc::new(Barrier::new(clients));
    let done = Arc::new(Barrier::new(clients));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (options, connected, done) = (options.clone(), connected.clone(), done.clone());
            tokio::spawn(async move {
                let conn = PgConnection::connect_with(&options).await;
                connected.wait().await;
                match conn {
                    Ok(mut conn) => {
                        let mut pids = Vec::with_capacity(TRANSACTIONS);
                        let mut failed = None;
                        for _ in 0..TRANSACTIONS {
                            match backend_pid(&mut conn).await {
                                Ok(pid) => pids.push(pid),
                                Err(e) => {
                                    failed = Some(format!("a transaction: {e}"));
                                    break;
                                }
                            }
                        }
                        done.wait().await;
                        conn.close().await.ok();
                        failed.map_or(Ok(pids), Err)
                    }
                    Err(e) => {
                        done.wait().await;
                        Err(format!("connecting: {e}"))
                    }
                }
            })
        })
        .collect();
    // They take a second or two. In session mode the clients past the pool size would wait
    // for a server until every client is done, that is forever.
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut outcomes = Vec::with_capacity(clients);
        for task in tasks {
            outcomes.push(task.await.expect("a client task"));
        }
        outcomes
    })
    .await
    .expect("the clients finish within 60 s (all connected at once: none waits for a server)")
}

/// The distinct server processes of a run whose every transaction succeeded.
fn distinct_backends(outcomes: Vec<Result<Vec<i32>, String>>) -> HashSet<i32> {
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(failures.is_empty(), "every client succeeds: {failures:?}");
    let pids: Vec<i32> = outcomes.into_iter().flat_map(Result::unwrap).collect();
    assert_eq!(pids.len(), CLIENTS * TRANSACTIONS, "every transaction ran");
    pids.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_in_transaction_mode_share_a_few_server_connections() {
    let database = fresh_database().await;
    let name = database.options().get_database().unwrap().to_string();
    let bouncer = bouncer(&database);

    let outcomes = run_clients(&bouncer.connect_options(&name), CLIENTS).await;
    let backends = distinct_backends(outcomes);
    eprintln!(
        "{CLIENTS} clients, {} transactions through PgBouncer on {} server processes",
        CLIENTS * TRANSACTIONS,
        backends.len()
    );

    assert!(
        backends.len() < CLIENTS,
        "{CLIENTS} clients at once ran on fewer server processes, yet ran on {}",
        backends.len()
    );
    assert!(
        backends.len() <= POOL_SIZE,
        "at most the pool size ({POOL_SIZE}) of server processes, yet {}: {}",
        backends.len(),
        bouncer.log()
    );
}

/// The control of the test above: the same clients straight to the cluster each have a server
/// process of their own, so that counting them can tell pooling from none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_straight_to_the_cluster_each_have_a_server_connection() {
    let database = fresh_database().await;

    let outcomes = run_clients(database.options(), CLIENTS).await;
    let backends = distinct_backends(outcomes);

    assert_eq!(backends.len(), CLIENTS, "a server process per client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_under_load_breaks_open_connections_and_new_ones_work() {
    let database = fresh_database().await;
    let name = database.options().get_database().unwrap().to_string();
    let mut bouncer = bouncer(&database);
    let options = bouncer.connect_options(&name);

    // The load: one client looping transactions on one connection, connecting again whenever
    // a transaction on it fails.
    let committed = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (committed, broken, stop) = (committed.clone(), broken.clone(), stop.clone());
        tokio::spawn(async move {
            let mut conn: Option<PgConnection> = None;
            while !stop.load(Ordering::Relaxed) {
                let Some(open) = conn.as_mut() else {
                    match PgConnection::connect_with(&options).await {
                        Ok(c) => conn = Some(c),
                        // Refused while PgBouncer is down: tried again.
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                    continue;
                };
                match backend_pid(open).await {
                    Ok(_) => {
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        broken.fetch_add(1, Ordering::Relaxed);
                        conn = None;
                    }
                }
            }
        })
    };
    let until_committed = |n: usize, what: &'static str| {
        let committed = committed.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                while committed.load(Ordering::Relaxed) < n {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{what}: {n} transactions committed within 30 s"));
        }
    };

    until_committed(100, "before the restart").await;
    let before = committed.load(Ordering::Relaxed);
    let old_pid = bouncer.pid();
    bouncer
        .restart()
        .unwrap_or_else(|e| panic!("restarting PgBouncer: {e}"));
    let new_pid = bouncer.pid();
    until_committed(before + 100, "after the restart").await;
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), load)
        .await
        .expect("the load stops")
        .expect("the load task");
    eprintln!(
        "restart under load: {} transactions committed ({before} before the restart), {} broken",
        committed.load(Ordering::Relaxed),
        broken.load(Ordering::Relaxed)
    );

    assert_ne!(
        old_pid, new_pid,
        "another PgBouncer process after the restart"
    );
    assert!(
        broken.load(Ordering::Relaxed) >= 1,
        "the kill broke the load's open connection"
    );
    let mut conn = PgConnection::connect_with(&bouncer.connect_options(&name))
        .await
        .expect("a new connection through the restarted PgBouncer");
    let current: String = {
        let mut tx = conn.begin().await.expect("BEGIN");
        let current = sqlx::query_scalar("SELECT current_database()::text")
            .persistent(false)
            .fetch_one(&mut *tx)
            .await
            .expect("a query through the restarted PgBouncer");
        tx.commit().await.expect("COMMIT");
        current
    };
    assert_eq!(current, name, "the client's database, through PgBouncer");
    conn.close().await.ok();
}

#[tokio::test]
async fn a_dropped_pgbouncer_leaves_no_process_and_no_directory() {
    let database = fresh_database().await;
    let bouncer = bouncer(&database);
    let pid = bouncer.pid().expect("a running PgBouncer");
    let dir = bouncer.dir().to_path_buf();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .as_deref(),
        Some("pgbouncer\n"),
        "PgBouncer runs as {pid}"
    );
    assert!(dir.is_dir(), "its directory is there while it runs");

    drop(bouncer);

    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} is gone"
    );
    assert!(!dir.exists(), "{} is removed", dir.display());
}
