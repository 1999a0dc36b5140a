//! What the client retries and what it does not: any call after a failure that may pass later,
//! a write with the same Idempotency-Key, so that it is done once; and how a write whose outcome
//! is still unknown after the last attempt is resolved.

use std::time::Duration;

use snapfence::domain::ETag;
use snapfence_client::{Error, PutOptions, RetryPolicy};
use tokio::net::TcpListener;

use crate::harness::TestApp;
use crate::proxy::{Mode, Proxy};
use crate::support::{client, closed_port, grant, key, upstream};

const TTL: Duration = Duration::from_secs(30);

/// A service, a client of it, a lease on `k` and its token, and a proxy in front of the service.
struct Leased {
    app: TestApp,
    c: snapfence_client::Client,
    k: snapfence::domain::Key,
    t: snapfence::domain::FencingToken,
    proxy: Proxy,
}

impl Leased {
    async fn behind_a_proxy() -> Self {
        let app = TestApp::spawn().await;
        let c = client(&app.instance.base);
        let k = key("k");
        let t = grant(&c, &k, "w", TTL).await.lease.token;
        let proxy = Proxy::start(upstream(&app.instance.base)).await;
        Self {
            app,
            c,
            k,
            t,
            proxy,
        }
    }
}

#[tokio::test]
async fn a_read_is_retried_after_a_broken_connection() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    proxy.next_connections(vec![Mode::Reset]);
    assert_eq!(client(&proxy.base()).healthz().await.unwrap().status, "ok");
    assert_eq!(proxy.connections(), 2, "one broken, one retried");
    app.stop().await;
}

#[tokio::test]
async fn a_read_is_retried_after_a_gateway_error() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let bad_gateway = Mode::Answer {
        status: "502 Bad Gateway",
        content_type: "text/plain",
        body: "upstream restarting".into(),
    };
    proxy.next_connections(vec![bad_gateway.clone(), bad_gateway]);
    assert_eq!(client(&proxy.base()).healthz().await.unwrap().status, "ok");
    assert_eq!(proxy.connections(), 3);
    app.stop().await;
}

#[tokio::test]
async fn a_write_whose_connection_broke_is_retried_with_its_key_and_lands_once() {
    let Leased {
        app,
        c: _,
        k,
        t,
        proxy,
    } = Leased::behind_a_proxy().await;
    proxy.next_connections(vec![Mode::Reset]);
    let written = client(&proxy.base())
        .put_snapshot(&k, t, "x", &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(written.meta.version.get(), 1);
    assert_eq!(proxy.connections(), 2, "one broken, one retried");
    app.stop().await;
}

#[tokio::test]
async fn a_write_whose_answer_was_lost_is_answered_by_its_retry_and_stored_once() {
    let Leased {
        app,
        c,
        k,
        t,
        proxy,
    } = Leased::behind_a_proxy().await;
    proxy.next_connections(vec![Mode::DropAnswer]);
    let written = client(&proxy.base())
        .put_snapshot(&k, t, "once", &PutOptions::default())
        .await
        .unwrap();
    assert!(written.created, "the retry gets the first attempt's answer");
    assert_eq!(written.meta.version.get(), 1);
    let versions = c.list_versions(&k, &Default::default()).await.unwrap();
    assert_eq!(versions.items.len(), 1, "stored once");
    assert_eq!(proxy.connections(), 2);
    app.stop().await;
}

#[tokio::test]
async fn a_grant_whose_answer_was_lost_is_granted_once_and_its_token_learnt() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    proxy.next_connections(vec![Mode::DropAnswer]);
    let g = grant(&client(&proxy.base()), &k, "w", TTL).await;
    let status = c.lease_status(&k).await.unwrap();
    assert_eq!(
        status.lease.token, g.lease.token,
        "the caller holds the key's lease"
    );
    assert_eq!(proxy.connections(), 2);
    app.stop().await;
}

#[tokio::test]
async fn a_write_is_retried_while_the_connection_is_refused() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let port = closed_port();
    let upstream = upstream(&app.instance.base);
    // The server's port opens only after the first attempt was refused.
    let opens = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        Proxy::start_on(listener, upstream)
    });
    let late = snapfence_client::Client::builder(format!("http://127.0.0.1:{port}"))
        .retry(snapfence_client::RetryPolicy {
            // Retries for about 20 s: the port opens well before, however loaded the machine.
            max_attempts: 200,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(100),
        })
        .build()
        .unwrap();
    let written = late
        .put_snapshot(&k, t, "x", &PutOptions::default())
        .await
        .unwrap();
    assert!(written.created);
    let proxy = opens.await.unwrap();
    assert_eq!(proxy.connections(), 1, "refused attempts never connected");
    app.stop().await;
}

/// A write whose first attempt a proxy answers with `refusal` (an answer that changed nothing)
/// is retried, and stored once.
async fn first_answered_then_stored_once(refusal: Mode) {
    let Leased {
        app,
        c,
        k,
        t,
        proxy,
    } = Leased::behind_a_proxy().await;
    proxy.next_connections(vec![refusal]);
    client(&proxy.base())
        .put_snapshot(&k, t, "x", &PutOptions::default())
        .await
        .unwrap();
    let versions = c.list_versions(&k, &Default::default()).await.unwrap();
    assert_eq!(versions.items.len(), 1);
    assert_eq!(proxy.connections(), 2);
    app.stop().await;
}

#[tokio::test]
async fn a_write_answered_unavailable_is_retried_and_lands_once() {
    first_answered_then_stored_once(Mode::problem(
        "503 Service Unavailable",
        "unavailable",
        "the database is unavailable; nothing was changed. Retry with backoff",
    ))
    .await;
}

#[tokio::test]
async fn a_put_whose_outcome_stayed_unknown_is_resolved_with_find_write() {
    let Leased {
        app,
        c,
        k,
        t,
        proxy,
    } = Leased::behind_a_proxy().await;
    proxy.next_connections(vec![Mode::DropAnswer]);
    let once = client(&proxy.base()).with_retry(RetryPolicy::none());
    let e = once
        .put_snapshot(&k, t, "the body", &PutOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Transport {
                may_have_reached: true,
                ..
            }
        ),
        "{e:?}"
    );
    let found = c.find_write(&k, t, &ETag::of(b"the body")).await.unwrap();
    assert_eq!(found.expect("the write landed").version.get(), 1);
    app.stop().await;
}

#[tokio::test]
async fn a_write_answered_too_many_requests_is_retried_and_lands_once() {
    first_answered_then_stored_once(Mode::problem(
        "429 Too Many Requests",
        "too_many_requests",
        "key \"ci\" has 64 requests in flight on this instance; nothing was changed",
    ))
    .await;
}

#[tokio::test]
async fn a_write_lost_once_then_answered_unavailable_is_indeterminate_not_unchanged() {
    let Leased {
        app,
        c,
        k,
        t,
        proxy,
    } = Leased::behind_a_proxy().await;
    let unavailable = Mode::problem(
        "503 Service Unavailable",
        "unavailable",
        "the database is unavailable; nothing was changed. Retry with backoff",
    );
    // The first attempt lands and its answer is lost; every retry is told only that it, itself,
    // changed nothing.
    proxy.next_connections(vec![Mode::DropAnswer, unavailable.clone(), unavailable]);
    let e = client(&proxy.base())
        .put_snapshot(&k, t, "x", &PutOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Indeterminate { .. }), "{e:?}");
    assert!(e.is_indeterminate());
    let versions = c.list_versions(&k, &Default::default()).await.unwrap();
    assert_eq!(versions.items.len(), 1, "the first attempt did land");
    app.stop().await;
}
