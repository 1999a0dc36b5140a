//! snapfence: a Postgres-backed fenced snapshot store. Every lease grant mints a strictly
//! increasing fencing token, and any write whose token is not the newest is refused and audited.

pub mod cli;
pub mod config;
pub mod conn;
pub mod domain;
pub mod embedded;
pub mod http;
pub mod metrics;
pub mod rules;
pub mod store;
pub mod telemetry;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum_server::accept::DefaultAcceptor;
use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use tokio::net::TcpListener;

pub use http::AppState;
pub use http::router;
pub use rules::Rules;

/// Serves the API on `listener` until `shutdown`, then finishes requests in flight; prunes
/// meanwhile.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    tls: Option<RustlsConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let pruner = tokio::spawn(prune_forever(state.clone()));
    let handle = axum_server::Handle::<conn::Peer>::new();
    let stopper = handle.clone();
    let waiters = state.waiters.clone();
    let changes = state.changes.clone();
    tokio::spawn(async move {
        shutdown.await;
        // Waiters make their last try and watches end now, or shutdown would wait for them.
        waiters.stop();
        changes.stop();
        // No deadline: requests in flight finish (the database bounds them).
        stopper.graceful_shutdown(None);
    });
    let rules = state.rules.clone();
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    let listener = conn::Listener::new(listener, rules.max_connections);
    let served = match tls {
        None => {
            let acceptor = conn::Acceptor::new(DefaultAcceptor::new(), &rules);
            let mut server = axum_server::Server::from_listener(listener)
                .acceptor(acceptor)
                .handle(handle);
            conn::tune(&mut server, &rules);
            server.serve(app).await
        }
        Some(tls) => {
            let handshake = RustlsAcceptor::new(tls).handshake_timeout(rules.head_timeout);
            let acceptor = conn::Acceptor::new(handshake, &rules);
            let mut server = axum_server::Server::from_listener(listener)
                .acceptor(acceptor)
                .handle(handle);
            conn::tune(&mut server, &rules);
            server.serve(app).await
        }
    };
    pruner.abort();
    served
}

/// Loads a PEM chain and key for [`run`], with the `ring` provider the client already links.
pub async fn tls_config(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> std::io::Result<RustlsConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    RustlsConfig::from_pem_file(cert, key).await
}

/// Prunes past retention in small batches with pauses, so a backlog never holds up the hot paths.
async fn prune_forever(state: AppState) {
    const BATCH: i64 = 1000;
    const PAUSE: Duration = Duration::from_millis(50);
    const PERIOD: Duration = Duration::from_secs(60);
    let rules = state.rules.clone();
    loop {
        for log in store::audit::Log::ALL {
            prune_in_batches(log.name(), BATCH, PAUSE, || {
                store::audit::prune(&state.db, log, rules.audit_retention, BATCH)
            })
            .await;
        }
        prune_in_batches("idempotency_records", BATCH, PAUSE, || {
            store::idempotency::prune(&state.db, rules.idempotency_retention, BATCH)
        })
        .await;
        tokio::time::sleep(PERIOD).await;
    }
}

async fn prune_in_batches<F, Fut>(table: &str, batch: i64, pause: Duration, mut prune: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = store::Result<u64>>,
{
    loop {
        match prune().await {
            Ok(n) if n as i64 == batch => tokio::time::sleep(pause).await,
            Ok(_) => break,
            Err(e) => {
                tracing::debug!(error = %e, table, "pruning skipped");
                break;
            }
        }
    }
}
