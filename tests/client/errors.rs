//! Each variant of `client::Error`, from a real answer of the server (or of a gateway in front
//! of it, for the codes the server only answers with authentication configured), with its
//! fields and whether a write that failed so may have taken effect.

use std::time::Duration;

use reqwest::StatusCode;
use snapfence::Rules;
use snapfence::domain::{Key, LeaseState, RecoveryReason, Scope};
use snapfence_client::{AcquireRequest, Client, Error, PutOptions, RetryPolicy};

use crate::harness::TestApp;
use crate::proxy::{Mode, Proxy};
use crate::support::{Outage, client, closed_port, grant, key, owner, upstream};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_ttl_out_of_bounds_is_invalid_request_with_the_servers_detail() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let request = AcquireRequest::new(owner("w"), Duration::from_millis(1));
    let e = c.acquire(&key("k"), &request).await.unwrap_err();
    let Error::InvalidRequest { detail } = &e else {
        panic!("{e:?}")
    };
    assert!(detail.contains("ttl_ms 1 is out of bounds"), "{detail}");
    assert_eq!(e.code().map(|c| c.as_str()), Some("invalid_request"));
    assert!(!e.is_indeterminate());
    app.stop().await;
}

#[tokio::test]
async fn a_key_no_url_can_carry_is_invalid_request_before_anything_is_sent() {
    let unreachable = client(&format!("http://127.0.0.1:{}", closed_port()));
    let e = unreachable
        .lease_status(&Key::parse("..").unwrap())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidRequest { .. }), "{e:?}");
}

#[tokio::test]
async fn a_fenced_call_without_a_token_is_token_required() {
    let app = TestApp::spawn().await;
    // The typed client always sends the token, so a gateway that drops the header is played by
    // a proxy answering what the server answers then.
    let gateway = Proxy::start(upstream(&app.instance.base)).await;
    let answer = app
        .request(reqwest::Method::DELETE, "/v1/leases/k")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::PRECONDITION_REQUIRED);
    let detail: serde_json::Value = answer.json().await.unwrap();
    gateway.next_connections(vec![Mode::problem(
        "428 Precondition Required",
        "token_required",
        detail["detail"].as_str().unwrap(),
    )]);
    let c = client(&gateway.base());
    let t = snapfence::domain::FencingToken::new(1).unwrap();
    let e = c.release(&key("k"), t).await.unwrap_err();
    let Error::TokenRequired { detail } = &e else {
        panic!("{e:?}")
    };
    assert!(detail.contains("Fencing-Token"), "{detail}");
    app.stop().await;
}

#[tokio::test]
async fn acquire_while_held_is_lease_held_with_the_holder() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let g = grant(&c, &key("k"), "a", TTL).await;
    let e = c
        .acquire(&key("k"), &AcquireRequest::new(owner("b"), TTL))
        .await
        .unwrap_err();
    let Error::LeaseHeld {
        holder,
        state,
        waiters,
        detail,
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!(holder.owner, "a");
    assert_eq!(holder.expires_at, g.lease.expires_at);
    assert!(detail.contains("held by \"a\""), "{detail}");
    assert_eq!(*state, Some(LeaseState::Held));
    assert_eq!(*waiters, None);
    app.stop().await;
}

#[tokio::test]
async fn acquire_over_a_recovery_record_is_recovery_required_with_the_record() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let g = grant(&c, &key("k"), "a", TTL).await;
    c.abandon(&key("k"), g.lease.token).await.unwrap();
    let e = c
        .acquire(&key("k"), &AcquireRequest::new(owner("b"), TTL))
        .await
        .unwrap_err();
    let Error::RecoveryRequired { recovery, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(recovery.reason, RecoveryReason::Abandoned);
    assert_eq!(recovery.token, g.lease.token);
    app.stop().await;
}

#[tokio::test]
async fn renewing_a_released_lease_is_lease_lost() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let g = grant(&c, &key("k"), "a", TTL).await;
    c.release(&key("k"), g.lease.token).await.unwrap();
    let e = c.renew(&key("k"), g.lease.token, None).await.unwrap_err();
    assert!(matches!(e, Error::LeaseLost { .. }), "{e:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_write_with_a_superseded_token_is_stale_token_with_the_audit_row() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let old = grant(&c, &k, "a", TTL).await.lease.token;
    c.release(&k, old).await.unwrap();
    let new = grant(&c, &k, "b", TTL).await.lease.token;
    let e = c
        .put_snapshot(&k, old, "x", &PutOptions::default())
        .await
        .unwrap_err();
    let Error::StaleToken {
        presented,
        highest,
        audit_id,
        ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!((*presented, *highest), (old, new));
    let logged = c
        .rejections(&snapfence_client::AuditFilter::default())
        .await
        .unwrap();
    assert_eq!(logged.items[0].id, *audit_id);
    assert!(!e.is_indeterminate());
    app.stop().await;
}

#[tokio::test]
async fn a_write_to_a_key_never_leased_is_unknown_token_without_a_highest() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let t = grant(&c, &key("a"), "w", TTL).await.lease.token;
    let e = c.delete_snapshot(&key("never"), t, None).await.unwrap_err();
    let Error::UnknownToken {
        presented, highest, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert_eq!((*presented, *highest), (t, None));
    app.stop().await;
}

#[tokio::test]
async fn an_if_match_that_does_not_match_is_precondition_failed() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    c.put_snapshot(&k, t, "v1", &PutOptions::default())
        .await
        .unwrap();
    let other = snapfence::domain::EntityTagCondition::parse("\"nope\"").unwrap();
    let e = c.delete_snapshot(&k, t, Some(&other)).await.unwrap_err();
    assert!(matches!(e, Error::PreconditionFailed { .. }), "{e:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_snapshot_never_written_is_not_found_also_for_head() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let e = c.get_snapshot(&key("none")).await.unwrap_err();
    let Error::NotFound { detail } = &e else {
        panic!("{e:?}")
    };
    assert!(detail.contains("has no snapshot"), "{detail}");
    let head = c.head_snapshot(&key("none")).await.unwrap_err();
    assert!(matches!(head, Error::NotFound { .. }), "{head:?}");
    let status = c.lease_status(&key("none")).await.unwrap_err();
    assert!(matches!(status, Error::NotFound { .. }), "{status:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_payload_too_large() {
    let app = TestApp::spawn_with(Rules {
        max_snapshot_bytes: 16,
        ..Rules::default()
    })
    .await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let e = c
        .put_snapshot(&k, t, vec![b'x'; 17], &PutOptions::default())
        .await
        .unwrap_err();
    let Error::PayloadTooLarge { detail } = &e else {
        panic!("{e:?}")
    };
    assert!(detail.contains("16 bytes"), "{detail}");
    app.stop().await;
}

#[tokio::test]
async fn a_call_without_a_key_once_keys_exist_is_unauthorized() {
    let app = TestApp::spawn().await;
    app.make_key("ops", Scope::Admin, "").await;
    let e = client(&app.instance.base)
        .lease_status(&key("k"))
        .await
        .unwrap_err();
    let Error::Unauthorized { detail } = &e else {
        panic!("{e:?}")
    };
    assert!(detail.contains("snapfence keys create"), "{detail}");
    app.stop().await;
}

#[tokio::test]
async fn a_key_without_the_scope_is_forbidden() {
    let app = TestApp::spawn().await;
    let reader = app.make_key("reader", Scope::Read, "").await;
    let c = Client::builder(app.instance.base.clone())
        .api_key(reader)
        .build()
        .unwrap();
    let e = c
        .acquire(&key("k"), &AcquireRequest::new(owner("w"), TTL))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Forbidden { .. }), "{e:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_gateways_403_without_a_problem_body_is_forbidden_too() {
    let app = TestApp::spawn().await;
    let gateway = Proxy::start(upstream(&app.instance.base)).await;
    gateway.next_connections(vec![Mode::Answer {
        status: "403 Forbidden",
        content_type: "text/plain",
        body: "denied by policy".into(),
    }]);
    let e = client(&gateway.base()).healthz().await.unwrap_err();
    let Error::Forbidden { detail } = &e else {
        panic!("{e:?}")
    };
    assert!(detail.contains("denied by policy"), "{detail}");
    app.stop().await;
}

#[tokio::test]
async fn a_server_without_its_database_is_unavailable_and_nothing_was_changed() {
    let outage = Outage::start().await;
    let c = client(&outage.base);
    let e = c.readyz().await.unwrap_err();
    assert!(matches!(e, Error::Unavailable { .. }), "{e:?}");
    let write = c
        .acquire(&key("k"), &AcquireRequest::new(owner("w"), TTL))
        .await
        .unwrap_err();
    assert!(matches!(write, Error::Unavailable { .. }), "{write:?}");
    assert!(!write.is_indeterminate(), "503 changed nothing");
    outage.stop().await;
}

#[tokio::test]
async fn no_server_at_all_is_transport_that_never_reached_it() {
    let c = client(&format!("http://127.0.0.1:{}", closed_port()));
    let e = c
        .release(&key("k"), snapfence::domain::FencingToken::new(1).unwrap())
        .await
        .unwrap_err();
    let Error::Transport {
        may_have_reached, ..
    } = &e
    else {
        panic!("{e:?}")
    };
    assert!(!may_have_reached);
    assert!(!e.is_indeterminate());
}

#[tokio::test]
async fn a_stalled_answer_is_a_transport_timeout_that_may_have_reached_it() {
    let app = TestApp::spawn().await;
    let gateway = Proxy::start(upstream(&app.instance.base)).await;
    gateway.stall();
    let c = Client::builder(gateway.base())
        .timeout(Duration::from_millis(300))
        .retry(RetryPolicy::none())
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let e = c
        .acquire(&key("k"), &AcquireRequest::new(owner("w"), TTL))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the timeout held (the stall never ends)"
    );
    let Error::Transport {
        may_have_reached,
        source,
    } = &e
    else {
        panic!("{e:?}")
    };
    assert!(*may_have_reached && source.is_timeout());
    assert!(e.is_indeterminate());
    app.stop().await;
}

#[tokio::test]
async fn a_gateway_error_page_is_unexpected_with_its_status() {
    let app = TestApp::spawn().await;
    let gateway = Proxy::start(upstream(&app.instance.base)).await;
    gateway.next_connections(vec![Mode::Answer {
        status: "502 Bad Gateway",
        content_type: "text/html",
        body: "<html>upstream down</html>".into(),
    }]);
    let c = client(&gateway.base()).with_retry(RetryPolicy::none());
    let e = c.healthz().await.unwrap_err();
    let Error::Unexpected { status, detail, .. } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(*status, StatusCode::BAD_GATEWAY);
    assert!(detail.contains("upstream down"), "{detail}");
    assert!(e.is_indeterminate(), "a write behind a 502 may have landed");
    app.stop().await;
}

#[tokio::test]
async fn an_answer_that_is_not_the_contracts_json_is_protocol() {
    let app = TestApp::spawn().await;
    let gateway = Proxy::start(upstream(&app.instance.base)).await;
    gateway.next_connections(vec![Mode::Answer {
        status: "200 OK",
        content_type: "text/html",
        body: "<html>a login page</html>".into(),
    }]);
    let c = client(&gateway.base()).with_retry(RetryPolicy::none());
    let e = c.lease_status(&key("k")).await.unwrap_err();
    let Error::Protocol { detail } = &e else {
        panic!("{e:?}")
    };
    assert!(detail.contains("not the contract's JSON"), "{detail}");
    app.stop().await;
}
