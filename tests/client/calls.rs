//! Each call of the client against the real server: what it sends, and what it reads back.

use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use serde_json::json;
use snapfence::domain::{
    ETag, EntityTagCondition, KeyPrefix, LeaseState, Metadata, PageLimit, RecoveryReason, Scope,
    Version,
};
use snapfence_client::RefusalReason;
use snapfence_client::{
    AcquireRequest, AuditFilter, AuditOperation, Client, LeaseFilter, PageRequest, PutOptions,
};

use crate::harness::{TestApp, https_instance, rules};
use crate::support::{client, grant, key, owner};

const TTL: Duration = Duration::from_secs(30);

#[tokio::test]
async fn acquire_returns_the_lease_with_every_field() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let request = AcquireRequest::new(owner("worker-7"), TTL)
        .metadata(Metadata::new(json!({"pid": 4242})).unwrap())
        .crash_recovery(true);
    let g = c.acquire(&key("jobs/42"), &request).await.unwrap();
    assert_eq!(g.lease.key, key("jobs/42"));
    assert_eq!(g.lease.owner, owner("worker-7"));
    assert_eq!(g.lease.ttl_ms.get(), 30_000);
    assert_eq!(g.lease.metadata.unwrap().as_json(), &json!({"pid": 4242}));
    assert!(g.lease.crash_recovery && !g.lease.recovery_required);
    assert_eq!(
        (g.lease.expires_at - g.lease.acquired_at).num_milliseconds(),
        30_000
    );
    assert!(g.recovered.is_none());
    app.stop().await;
}

#[tokio::test]
async fn a_reconciled_acquire_returns_the_record_it_replaced() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("deploy");
    let first = grant(&c, &k, "deployer-1", TTL).await;
    c.abandon(&k, first.lease.token).await.unwrap();
    let request = AcquireRequest::new(owner("deployer-2"), TTL).reconciled(true);
    let second = c.acquire(&k, &request).await.unwrap();
    let recovered = second.recovered.expect("the replaced record");
    assert_eq!(recovered.reason, RecoveryReason::Abandoned);
    assert_eq!(recovered.token, first.lease.token);
    assert!(second.lease.token > first.lease.token);
    app.stop().await;
}

#[tokio::test]
async fn a_reconciling_acquire_returns_the_record_it_keeps_and_reconciled_moves_it_to_the_audit_log()
 {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("deploy");
    let first = grant(&c, &k, "deployer-1", TTL).await;
    c.abandon(&k, first.lease.token).await.unwrap();
    let request = AcquireRequest::new(owner("deployer-2"), TTL).reconciling(true);
    let second = c.acquire(&k, &request).await.unwrap();
    assert!(second.recovered.is_none());
    let kept = second.recovery.expect("the kept record");
    assert_eq!(kept.reason, RecoveryReason::Abandoned);
    assert_eq!(kept.token, first.lease.token);
    let status = c.lease_status(&k).await.unwrap();
    assert_eq!(status.state, LeaseState::Held);
    assert_eq!(status.recovery.as_ref(), Some(&kept));

    let lease = c.reconciled(&k, second.lease.token).await.unwrap();
    assert_eq!(lease, second.lease);
    assert_eq!(c.lease_status(&k).await.unwrap().recovery, None);
    let rows = c.recoveries(&AuditFilter::default()).await.unwrap().items;
    let operations: Vec<AuditOperation> = rows.iter().map(|r| r.operation).collect();
    assert_eq!(
        operations,
        [AuditOperation::Reconciled, AuditOperation::Reconciling]
    );
    assert_eq!(rows[0].presented_token, Some(second.lease.token));
    assert_eq!(rows[0].recovery, kept);
    app.stop().await;
}

#[tokio::test]
async fn reconciled_with_a_token_that_is_not_the_live_lease_is_lease_lost() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("deploy");
    let first = grant(&c, &k, "deployer-1", TTL).await;
    c.abandon(&k, first.lease.token).await.unwrap();
    let request = AcquireRequest::new(owner("deployer-2"), TTL).reconciling(true);
    let second = c.acquire(&k, &request).await.unwrap();
    c.release(&k, second.lease.token).await.unwrap();
    let e = c.reconciled(&k, second.lease.token).await.unwrap_err();
    assert!(
        matches!(e, snapfence_client::Error::LeaseLost { .. }),
        "{e:?}"
    );
    let status = c.lease_status(&k).await.unwrap();
    assert_eq!(status.state, LeaseState::RecoveryPending);
    assert_eq!(status.recovery.unwrap().token, first.lease.token);
    app.stop().await;
}

#[tokio::test]
async fn an_acquire_request_refuses_reconciled_and_reconciling_together() {
    let both = AcquireRequest::new(owner("w"), TTL)
        .reconciled(true)
        .reconciling(true);
    assert!(both.checked_reconcile().is_err());
    let plain = serde_json::to_value(AcquireRequest::new(owner("w"), TTL)).unwrap();
    assert!(plain.get("reconciling").is_none(), "sent only when true");
    let one = serde_json::to_value(AcquireRequest::new(owner("w"), TTL).reconciling(true)).unwrap();
    assert_eq!(one["reconciling"], true);
}

#[tokio::test]
async fn renew_extends_the_lease_and_keeps_its_token() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let g = grant(&c, &k, "w", TTL).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renewed = c.renew(&k, g.lease.token, None).await.unwrap();
    assert_eq!(renewed.token, g.lease.token);
    assert!(renewed.expires_at > g.lease.expires_at);
    assert_eq!(renewed.ttl_ms, g.lease.ttl_ms);
    app.stop().await;
}

#[tokio::test]
async fn renew_with_a_ttl_sets_the_new_ttl() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let g = grant(&c, &k, "w", TTL).await;
    let renewed = c
        .renew(&k, g.lease.token, Some(Duration::from_secs(90)))
        .await
        .unwrap();
    assert_eq!(renewed.ttl_ms.get(), 90_000);
    app.stop().await;
}

#[tokio::test]
async fn release_frees_the_key_at_once() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let g = grant(&c, &k, "a", TTL).await;
    c.release(&k, g.lease.token).await.unwrap();
    assert_eq!(
        c.lease_status(&k).await.unwrap().state,
        LeaseState::Released
    );
    let next = grant(&c, &k, "b", TTL).await;
    assert!(next.lease.token > g.lease.token);
    app.stop().await;
}

#[tokio::test]
async fn abandon_unlocks_but_leaves_a_recovery_record() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let g = grant(&c, &k, "a", TTL).await;
    c.abandon(&k, g.lease.token).await.unwrap();
    let status = c.lease_status(&k).await.unwrap();
    assert_eq!(status.state, LeaseState::RecoveryPending);
    assert_eq!(status.recovery.unwrap().reason, RecoveryReason::Abandoned);
    app.stop().await;
}

#[tokio::test]
async fn require_recovery_marks_the_live_lease() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let g = grant(&c, &k, "a", TTL).await;
    c.require_recovery(&k, g.lease.token).await.unwrap();
    let status = c.lease_status(&k).await.unwrap();
    assert_eq!(status.state, LeaseState::Held);
    assert!(status.lease.recovery_required);
    c.release(&k, g.lease.token).await.unwrap();
    let after = c.lease_status(&k).await.unwrap();
    assert_eq!(after.state, LeaseState::RecoveryPending);
    assert_eq!(
        after.recovery.unwrap().reason,
        RecoveryReason::RecoveryRequired
    );
    app.stop().await;
}

#[tokio::test]
async fn lease_status_shows_the_state_the_newest_lease_and_the_newest_token() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let g = grant(&c, &k, "a", TTL).await;
    let status = c.lease_status(&k).await.unwrap();
    assert_eq!(status.key, k);
    assert_eq!(status.state, LeaseState::Held);
    assert_eq!(status.lease, g.lease);
    assert_eq!(status.newest_token, g.lease.token);
    assert!(status.recovery.is_none());
    app.stop().await;
}

#[tokio::test]
async fn list_leases_pages_through_every_key_once_with_its_filters() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    for name in ["jobs/1", "jobs/2", "jobs/3", "other"] {
        grant(&c, &key(name), "w", TTL).await;
    }
    let released = grant(&c, &key("jobs/4"), "w", TTL).await;
    c.release(&key("jobs/4"), released.lease.token)
        .await
        .unwrap();

    let mut filter = LeaseFilter {
        prefix: Some(KeyPrefix::parse("jobs/").unwrap()),
        page: PageRequest {
            limit: Some(PageLimit::new(Some(2)).unwrap()),
            cursor: None,
        },
        ..LeaseFilter::default()
    };
    let mut seen = Vec::new();
    loop {
        let page = c.list_leases(&filter).await.unwrap();
        assert!(page.items.len() <= 2);
        seen.extend(page.items.into_iter().map(|s| s.key.to_string()));
        match page.next_cursor {
            Some(cursor) => filter.page.cursor = Some(cursor),
            None => break,
        }
    }
    assert_eq!(seen, ["jobs/1", "jobs/2", "jobs/3", "jobs/4"]);

    let held = LeaseFilter {
        state: Some(LeaseState::Released),
        ..LeaseFilter::default()
    };
    let page = c.list_leases(&held).await.unwrap();
    let keys: Vec<_> = page.items.iter().map(|s| s.key.to_string()).collect();
    assert_eq!(keys, ["jobs/4"]);
    app.stop().await;
}

#[tokio::test]
async fn put_snapshot_creates_then_replaces_and_reports_which() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let first = c
        .put_snapshot(&k, t, "v1", &PutOptions::default())
        .await
        .unwrap();
    assert!(first.created);
    assert_eq!(first.meta.version.get(), 1);
    assert_eq!(first.meta.etag, ETag::of(b"v1"));
    assert_eq!(first.meta.size, 2);
    assert_eq!(first.meta.content_type, "application/octet-stream");
    let second = c
        .put_snapshot(&k, t, "v2", &PutOptions::default())
        .await
        .unwrap();
    assert!(!second.created);
    assert_eq!(second.meta.version.get(), 2);
    app.stop().await;
}

#[tokio::test]
async fn put_snapshot_stores_the_content_type_given() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let options = PutOptions {
        content_type: Some("application/json".into()),
        ..PutOptions::default()
    };
    c.put_snapshot(&k, t, r#"{"step":1}"#, &options)
        .await
        .unwrap();
    let read = c.get_snapshot(&k).await.unwrap();
    assert_eq!(read.head.content_type, "application/json");
    app.stop().await;
}

#[tokio::test]
async fn put_snapshot_with_if_match_writes_only_over_that_etag() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let v1 = c
        .put_snapshot(&k, t, "v1", &PutOptions::default())
        .await
        .unwrap();
    let on_v1 = PutOptions {
        if_match: Some(EntityTagCondition::from(&v1.meta.etag)),
        ..PutOptions::default()
    };
    let v2 = c.put_snapshot(&k, t, "v2", &on_v1).await.unwrap();
    assert_eq!(v2.meta.version.get(), 2);
    let again = c.put_snapshot(&k, t, "v3", &on_v1).await;
    assert!(
        matches!(
            again,
            Err(snapfence_client::Error::PreconditionFailed { .. })
        ),
        "{again:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn get_snapshot_returns_the_body_as_stored_with_its_headers() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let body = Bytes::from_static(b"\x00\xffbinary");
    let written = c
        .put_snapshot(&k, t, body.clone(), &PutOptions::default())
        .await
        .unwrap();
    let read = c.get_snapshot(&k).await.unwrap();
    assert_eq!(read.body, body);
    assert_eq!(read.head.key, k);
    assert_eq!(read.head.etag, written.meta.etag);
    assert_eq!(read.head.token, t);
    assert_eq!(read.head.version, written.meta.version);
    assert_eq!(read.head.size, body.len() as u64);
    let age = Utc::now() - read.head.last_modified;
    assert!(age.num_seconds() < 60, "Last-Modified is recent: {age}");
    app.stop().await;
}

#[tokio::test]
async fn get_snapshot_if_none_match_answers_none_while_unchanged() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let v1 = c
        .put_snapshot(&k, t, "v1", &PutOptions::default())
        .await
        .unwrap();
    let cached = EntityTagCondition::from(&v1.meta.etag);
    assert!(
        c.get_snapshot_if_none_match(&k, &cached)
            .await
            .unwrap()
            .is_none()
    );
    c.put_snapshot(&k, t, "v2", &PutOptions::default())
        .await
        .unwrap();
    let fresh = c.get_snapshot_if_none_match(&k, &cached).await.unwrap();
    assert_eq!(fresh.unwrap().body, "v2");
    app.stop().await;
}

#[tokio::test]
async fn head_snapshot_returns_the_headers_without_the_body() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    let written = c
        .put_snapshot(&k, t, "twelve bytes", &PutOptions::default())
        .await
        .unwrap();
    let head = c.head_snapshot(&k).await.unwrap();
    assert_eq!(head.etag, written.meta.etag);
    assert_eq!(head.size, 12);
    assert_eq!(head.version, written.meta.version);
    app.stop().await;
}

#[tokio::test]
async fn get_version_returns_a_retained_version() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    for body in ["v1", "v2", "v3"] {
        c.put_snapshot(&k, t, body, &PutOptions::default())
            .await
            .unwrap();
    }
    let v2 = c
        .get_version(&k, Version::parse("2").unwrap())
        .await
        .unwrap();
    assert_eq!(v2.body, "v2");
    assert_eq!(v2.head.version.get(), 2);
    app.stop().await;
}

#[tokio::test]
async fn list_versions_lists_newest_first_a_page_at_a_time() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    for body in ["v1", "v2", "v3"] {
        c.put_snapshot(&k, t, body, &PutOptions::default())
            .await
            .unwrap();
    }
    let mut page = PageRequest {
        limit: Some(PageLimit::new(Some(2)).unwrap()),
        cursor: None,
    };
    let first = c.list_versions(&k, &page).await.unwrap();
    page.cursor = first.next_cursor.clone();
    let second = c.list_versions(&k, &page).await.unwrap();
    let versions: Vec<i64> = first
        .items
        .iter()
        .chain(&second.items)
        .map(|v| v.version.get())
        .collect();
    assert_eq!(versions, [3, 2, 1]);
    assert!(second.next_cursor.is_none());
    assert_eq!(first.items[0].etag, ETag::of(b"v3"));
    app.stop().await;
}

#[tokio::test]
async fn delete_snapshot_removes_it() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    c.put_snapshot(&k, t, "v1", &PutOptions::default())
        .await
        .unwrap();
    c.delete_snapshot(&k, t, None).await.unwrap();
    let gone = c.get_snapshot(&k).await;
    assert!(
        matches!(gone, Err(snapfence_client::Error::NotFound { .. })),
        "{gone:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn find_write_finds_the_version_of_a_token_and_body_even_when_superseded() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    c.put_snapshot(&k, t, "mine", &PutOptions::default())
        .await
        .unwrap();
    c.put_snapshot(&k, t, "later", &PutOptions::default())
        .await
        .unwrap();
    let found = c.find_write(&k, t, &ETag::of(b"mine")).await.unwrap();
    assert_eq!(found.unwrap().version.get(), 1);
    let never = c.find_write(&k, t, &ETag::of(b"never")).await.unwrap();
    assert!(never.is_none());
    let unwritten = c
        .find_write(&key("empty"), t, &ETag::of(b"mine"))
        .await
        .unwrap();
    assert!(unwritten.is_none(), "a key without snapshot has no write");
    app.stop().await;
}

#[tokio::test]
async fn rejections_lists_refused_writes_with_every_filter() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let (a, b) = (key("a"), key("b"));
    let old = grant(&c, &a, "w1", TTL).await.lease.token;
    c.release(&a, old).await.unwrap();
    let new = grant(&c, &a, "w2", TTL).await.lease.token;
    let before = Utc::now() - chrono::Duration::seconds(5);
    let stale = c.put_snapshot(&a, old, "x", &PutOptions::default()).await;
    assert!(stale.is_err());
    let unknown = c.put_snapshot(&b, new, "x", &PutOptions::default()).await;
    assert!(unknown.is_err());

    let all = c.rejections(&AuditFilter::default()).await.unwrap();
    assert_eq!(all.items.len(), 2);
    assert!(all.items[0].id > all.items[1].id, "newest first");
    let first = &all.items[1];
    assert_eq!(first.key, a);
    assert_eq!(first.reason, RefusalReason::StaleToken);
    assert_eq!(first.presented_token, old);
    assert_eq!(first.highest_token, Some(new));
    assert_eq!(first.holder, Some(owner("w2")));
    assert_eq!(first.operation, AuditOperation::Put);
    assert!(first.request_id.is_some() && first.remote_addr.is_some());

    let by_key = AuditFilter {
        key: Some(b.clone()),
        ..AuditFilter::default()
    };
    let page = c.rejections(&by_key).await.unwrap();
    assert_eq!(page.items.len(), 1);
    assert_eq!(page.items[0].reason, RefusalReason::UnknownToken);
    assert_eq!(page.items[0].highest_token, None);

    let by_reason = AuditFilter {
        reason: Some(RefusalReason::StaleToken),
        ..AuditFilter::default()
    };
    assert_eq!(c.rejections(&by_reason).await.unwrap().items.len(), 1);

    let in_window = AuditFilter {
        since: Some(before),
        until: Some(Utc::now() + chrono::Duration::seconds(5)),
        ..AuditFilter::<RefusalReason>::default()
    };
    assert_eq!(c.rejections(&in_window).await.unwrap().items.len(), 2);
    let after = AuditFilter {
        since: Some(Utc::now() + chrono::Duration::seconds(5)),
        ..AuditFilter::<RefusalReason>::default()
    };
    assert!(c.rejections(&after).await.unwrap().items.is_empty());

    let paged = AuditFilter {
        page: PageRequest {
            limit: Some(PageLimit::new(Some(1)).unwrap()),
            cursor: None,
        },
        ..AuditFilter::<RefusalReason>::default()
    };
    let one = c.rejections(&paged).await.unwrap();
    assert_eq!(one.items.len(), 1);
    let rest = AuditFilter {
        page: PageRequest {
            limit: None,
            cursor: one.next_cursor,
        },
        ..AuditFilter::<RefusalReason>::default()
    };
    assert_eq!(c.rejections(&rest).await.unwrap().items.len(), 1);
    app.stop().await;
}

#[tokio::test]
async fn recoveries_lists_reconciled_records_with_their_filters() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("deploy");
    let first = grant(&c, &k, "deployer-1", TTL).await;
    c.abandon(&k, first.lease.token).await.unwrap();
    let reconciled = AcquireRequest::new(owner("deployer-2"), TTL).reconciled(true);
    let second = c.acquire(&k, &reconciled).await.unwrap();

    let all = c.recoveries(&AuditFilter::default()).await.unwrap();
    assert_eq!(all.items.len(), 1);
    let row = &all.items[0];
    assert_eq!(row.key, k);
    assert_eq!(row.reason, RecoveryReason::Abandoned);
    assert_eq!(row.operation, AuditOperation::Reconcile);
    assert_eq!(row.presented_token, None);
    assert_eq!(row.highest_token, second.lease.token);
    assert_eq!(row.recovery.token, first.lease.token);
    assert_eq!(row.reconciled_by, owner("deployer-2"));

    let other_reason = AuditFilter {
        reason: Some(RecoveryReason::Expired),
        ..AuditFilter::default()
    };
    assert!(c.recoveries(&other_reason).await.unwrap().items.is_empty());
    let other_key = AuditFilter {
        key: Some(key("elsewhere")),
        ..AuditFilter::<RecoveryReason>::default()
    };
    assert!(c.recoveries(&other_key).await.unwrap().items.is_empty());
    app.stop().await;
}

#[tokio::test]
async fn healthz_answers_ok() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    assert_eq!(c.healthz().await.unwrap().status, "ok");
    app.stop().await;
}

#[tokio::test]
async fn readyz_answers_ready_with_a_migrated_database() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    assert_eq!(c.readyz().await.unwrap().status, "ready");
    app.stop().await;
}

#[tokio::test]
async fn a_key_with_slashes_spaces_and_unicode_is_one_key_on_the_server() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("jobs/42 ü?#%&");
    let t = grant(&c, &k, "w", TTL).await.lease.token;
    c.put_snapshot(&k, t, "x", &PutOptions::default())
        .await
        .unwrap();
    assert_eq!(c.lease_status(&k).await.unwrap().key, k);
    let listed = c.list_leases(&LeaseFilter::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].key, k);
    assert_eq!(c.get_snapshot(&k).await.unwrap().head.key, k);
    app.stop().await;
}

#[tokio::test]
async fn an_api_key_is_sent_with_every_call_and_names_the_principal() {
    let app = TestApp::spawn().await;
    let token = app.make_key("worker-key", Scope::Write, "jobs/").await;
    let c = Client::builder(app.instance.base.clone())
        .api_key(token)
        .build()
        .unwrap();
    let k = key("jobs/1");
    let old = grant(&c, &k, "w", TTL).await.lease.token;
    c.release(&k, old).await.unwrap();
    grant(&c, &k, "w", TTL).await;
    let refused = c.put_snapshot(&k, old, "x", &PutOptions::default()).await;
    assert!(refused.is_err());
    let admin = app.make_key("ops", Scope::Admin, "").await;
    let audit = Client::builder(app.instance.base.clone())
        .api_key(admin)
        .build()
        .unwrap()
        .rejections(&AuditFilter::default())
        .await
        .unwrap();
    assert_eq!(audit.items[0].principal.as_deref(), Some("worker-key"));
    app.stop().await;
}

#[tokio::test]
async fn the_client_speaks_https_to_a_server_whose_certificate_it_was_given() {
    let (instance, cert) = https_instance(rules()).await;

    let trusting = Client::builder(instance.base.clone())
        .root_certificates_pem(cert)
        .build()
        .unwrap();
    assert_eq!(trusting.readyz().await.unwrap().status, "ready");
    let untrusting = client(&instance.base).with_retry(snapfence_client::RetryPolicy::none());
    let e = untrusting.healthz().await.unwrap_err();
    assert!(
        matches!(
            e,
            snapfence_client::Error::Transport {
                may_have_reached: false,
                ..
            }
        ),
        "a certificate it does not trust is refused before anything is sent: {e:?}"
    );
    instance.stop().await;
}

/// Waits until `key`'s queue on the server holds `n` waiters.
async fn until_queued(app: &TestApp, key: &str, n: i64) {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let queued: i64 = sqlx::query_scalar("SELECT count(*) FROM lease_waiters WHERE key = $1")
            .bind(key)
            .fetch_one(app.db())
            .await
            .unwrap();
        if queued == n {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{key} never had {n} waiters"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn acquire_with_a_wait_longer_than_the_clients_timeout_is_granted_when_the_holder_releases() {
    let app = TestApp::spawn().await;
    // An attempt's bound is the timeout plus the wait, so a wait outlasts the timeout.
    let c = Client::builder(&app.instance.base)
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let held = grant(&c, &key("k"), "holder", TTL).await;
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move {
            let request = AcquireRequest::new(owner("waiter"), TTL).wait(Duration::from_secs(20));
            c.acquire(&key("k"), &request).await
        })
    };
    until_queued(&app, "k", 1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.release(&key("k"), held.lease.token).await.unwrap();
    let g = waiting.await.unwrap().unwrap();
    assert_eq!(g.lease.owner, owner("waiter"));
    assert!(g.lease.token > held.lease.token);
    app.stop().await;
}

#[tokio::test]
async fn acquire_with_a_wait_that_runs_out_is_lease_held() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    grant(&c, &key("k"), "holder", TTL).await;
    let request = AcquireRequest::new(owner("waiter"), TTL).wait(Duration::from_millis(200));
    let e = c.acquire(&key("k"), &request).await.unwrap_err();
    assert!(
        matches!(e, snapfence_client::Error::LeaseHeld { .. }),
        "{e:?}"
    );
    app.stop().await;
}
