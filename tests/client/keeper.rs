//! `LeaseKeeper` against the real server: it renews for as long as it is kept, and `lost()`
//! fires while the server still holds the lease when renewals stop getting through, or as soon
//! as a renewal says the lease is gone. A grant that waited in the queue is kept as a fresh
//! lease; a process frozen past its deadline learns of the loss at its next check.

use std::time::Duration;

use nix::sys::signal::Signal;
use snapfence::domain::LeaseState;
use snapfence_client::{
    AcquireRequest, AuditFilter, Error, KeeperOptions, LeaseKeeper, LostReason, PutOptions,
};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::election::child::Proc;
use crate::harness::TestApp;
use crate::proxy::Proxy;
use crate::support::{client, grant, key, owner, upstream};

fn request(ttl_ms: u64) -> AcquireRequest {
    AcquireRequest::new(owner("keeper"), Duration::from_millis(ttl_ms))
}

#[tokio::test]
async fn a_keeper_renews_its_lease_past_several_ttls() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    // Each renewal has over a second to get through before the lease would lapse: time enough
    // on a loaded machine.
    let options = KeeperOptions::default().margin(Duration::from_millis(500));
    let keeper = LeaseKeeper::acquire(&c, &k, &request(3000), options)
        .await
        .unwrap();
    let granted = keeper.lease();
    tokio::time::sleep(Duration::from_millis(10500)).await;
    assert!(keeper.lost_reason().is_none(), "{:?}", keeper.lost_reason());
    let status = c.lease_status(&k).await.unwrap();
    assert_eq!(status.state, LeaseState::Held);
    assert_eq!(status.lease.token, granted.token, "renewal keeps the token");
    assert!(
        status.lease.expires_at - granted.expires_at >= chrono::Duration::milliseconds(7500),
        "renewed along: {} then {}",
        granted.expires_at,
        status.lease.expires_at
    );
    keeper.release().await.unwrap();
    app.stop().await;
}

#[tokio::test]
async fn lost_fires_while_the_server_still_holds_the_lease_when_renewals_are_blocked() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let direct = client(&app.instance.base);
    let k = key("k");
    // A margin of 3 s: what this test does once lost() fires (it is the holder that must
    // stop) fits in it on a loaded machine.
    let options = KeeperOptions::default().margin(Duration::from_millis(3000));
    let keeper = LeaseKeeper::acquire(&client(&proxy.base()), &k, &request(6000), options)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    proxy.stall();

    timeout(Duration::from_secs(15), keeper.lost().cancelled())
        .await
        .expect("lost() fired");
    let lost_at = Instant::now();
    assert!(lost_at < keeper.deadline());
    let status = direct.lease_status(&k).await.unwrap();
    assert_eq!(
        status.state,
        LeaseState::Held,
        "no one else can have taken over yet"
    );
    assert!(matches!(
        keeper.lost_reason(),
        Some(LostReason::Lapsing { .. })
    ));

    // Another holder takes over only once the lease has expired on the server.
    let other = loop {
        match direct
            .acquire(
                &k,
                &AcquireRequest::new(owner("other"), Duration::from_secs(30)),
            )
            .await
        {
            Ok(g) => break g,
            Err(Error::LeaseHeld { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => panic!("{e:?}"),
        }
    };
    assert!(other.lease.token > keeper.token());
    assert!(
        lost_at.elapsed() >= Duration::from_millis(500),
        "lost() fired well before the takeover ({:?} before)",
        lost_at.elapsed()
    );
    drop(keeper);
    app.stop().await;
}

#[tokio::test]
async fn lost_fires_with_lease_lost_once_another_holder_has_taken_over() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let keeper = LeaseKeeper::acquire(&c, &k, &request(1500), KeeperOptions::default())
        .await
        .unwrap();
    // Its token leaks and is released behind its back; someone else acquires.
    c.release(&k, keeper.token()).await.unwrap();
    c.acquire(
        &k,
        &AcquireRequest::new(owner("other"), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    timeout(Duration::from_secs(10), keeper.lost().cancelled())
        .await
        .expect("lost() fired at the next renewal");
    assert!(matches!(keeper.lost_reason(), Some(LostReason::LeaseLost)));
    let checked = keeper.check().unwrap_err();
    assert!(
        matches!(checked, Error::LeaseLost { .. }),
        "the keeper's loss is the contract's lease_lost: {checked:?}"
    );
    let e = keeper.release().await.unwrap_err();
    assert!(
        matches!(e, Error::LeaseLost { .. }),
        "the newer holder is untouched: {e:?}"
    );
    assert_eq!(
        c.lease_status(&k).await.unwrap().lease.owner,
        owner("other")
    );
    app.stop().await;
}

#[tokio::test]
async fn lost_fires_before_the_deadline_when_the_server_is_stopped() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    // This test sees lost() fire within the 3 s margin on a loaded machine.
    let margin = Duration::from_millis(3000);
    let options = KeeperOptions::default().margin(margin);
    let keeper = LeaseKeeper::acquire(&c, &key("k"), &request(6000), options)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let TestApp { instance, .. } = app;
    instance.stop().await;

    timeout(Duration::from_secs(15), keeper.lost().cancelled())
        .await
        .expect("lost() fired");
    let now = Instant::now();
    let deadline = keeper.deadline();
    assert!(
        now < deadline,
        "fired {:?} after the deadline",
        now - deadline
    );
    assert!(
        deadline - now <= margin + Duration::from_millis(100),
        "fired at the margin, not long before: {:?} left",
        deadline - now
    );
    let Some(LostReason::Lapsing {
        last_error: Some(e),
    }) = keeper.lost_reason()
    else {
        panic!("{:?}", keeper.lost_reason())
    };
    assert!(matches!(*e, Error::Transport { .. }), "{e:?}");
    drop(keeper);
}

#[tokio::test]
async fn release_frees_the_key_at_once() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let keeper = LeaseKeeper::acquire(&c, &k, &request(30_000), KeeperOptions::default())
        .await
        .unwrap();
    keeper.release().await.unwrap();
    assert_eq!(
        c.lease_status(&k).await.unwrap().state,
        LeaseState::Released
    );
    c.acquire(
        &k,
        &AcquireRequest::new(owner("next"), Duration::from_secs(30)),
    )
    .await
    .unwrap();
    app.stop().await;
}

#[tokio::test]
async fn dropping_a_keeper_releases_its_lease() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let keeper = LeaseKeeper::acquire(&c, &k, &request(30_000), KeeperOptions::default())
        .await
        .unwrap();
    drop(keeper);
    let until = Instant::now() + Duration::from_secs(30);
    while c.lease_status(&k).await.unwrap().state != LeaseState::Released {
        assert!(Instant::now() < until, "released in the background");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.stop().await;
}

#[tokio::test]
async fn a_margin_that_leaves_no_time_to_renew_is_refused_before_acquiring() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let options = KeeperOptions::default().margin(Duration::from_secs(2));
    let e = LeaseKeeper::acquire(&c, &key("k"), &request(2000), options)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::InvalidRequest { .. }), "{e:?}");
    let status = c.lease_status(&key("k")).await.unwrap_err();
    assert!(
        matches!(status, Error::NotFound { .. }),
        "nothing was acquired"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_grant_after_a_long_wait_is_kept_and_the_work_runs_to_its_end() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    let held = grant(&c, &k, "other", Duration::from_secs(30)).await;
    let held_since = Instant::now();
    let waiting = tokio::spawn({
        let (c, k) = (c.clone(), k.clone());
        let request = request(2000).wait(Duration::from_secs(20));
        async move { LeaseKeeper::acquire(&c, &k, &request, KeeperOptions::default()).await }
    });
    let until = Instant::now() + Duration::from_secs(30);
    while c.lease_status(&k).await.unwrap().waiters < 1 {
        assert!(Instant::now() < until, "the keeper never queued");
        sleep(Duration::from_millis(20)).await;
    }
    // Queued twice the TTL behind the holder.
    sleep_until(held_since + Duration::from_secs(4)).await;
    c.release(&k, held.lease.token).await.unwrap();
    let keeper = waiting.await.unwrap().expect("granted after the wait");

    // Three seconds of work, past the TTL, each write checked first.
    let options = PutOptions::default();
    for step in 0..6 {
        let state = format!("step {step}");
        keeper
            .fenced(|token| c.put_snapshot(&k, token, state, &options))
            .await
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        sleep(Duration::from_millis(500)).await;
    }
    assert!(keeper.lost_reason().is_none(), "{:?}", keeper.lost_reason());
    keeper.release().await.unwrap();
    app.stop().await;
}

#[tokio::test]
async fn a_process_frozen_past_its_ttl_finds_the_loss_at_its_next_check_before_writing() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let k = key("k");
    // A keeper with a 2 s TTL in a process of its own.
    let mut holder = Proc::start(&app.instance.base, "holder", "k", "frozen");
    let token = holder.token().await;

    holder.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    // Another holder takes the key once the frozen one's lease has expired, so that a write
    // of the frozen one would be refused, and recorded.
    let until = stopped + Duration::from_secs(15);
    let other = loop {
        match c
            .acquire(
                &k,
                &AcquireRequest::new(owner("other"), Duration::from_secs(30)),
            )
            .await
        {
            Ok(g) => break g,
            Err(Error::LeaseHeld { .. }) if Instant::now() < until => {
                sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("{e:?}"),
        }
    };
    assert!(other.lease.token > token);
    // A write is the first thing it is asked to do when it wakes.
    holder.send("fenced").await;
    holder.signal(Signal::SIGCONT);

    assert_eq!(holder.next().await, "fenced lost");
    let refused = c.rejections(&AuditFilter::default()).await.unwrap();
    assert!(
        refused.items.iter().all(|r| r.presented_token != token),
        "nothing was sent: {:?}",
        refused.items
    );
    let e = c.get_snapshot(&k).await.unwrap_err();
    assert!(
        matches!(e, Error::NotFound { .. }),
        "nothing written: {e:?}"
    );
    drop(holder);
    app.stop().await;
}

#[tokio::test]
async fn check_reads_the_clock_when_the_renewal_task_could_not_run() {
    let app = TestApp::spawn().await;
    let c = client(&app.instance.base);
    let keeper = LeaseKeeper::acquire(&c, &key("k"), &request(1000), KeeperOptions::default())
        .await
        .unwrap();
    // This test's runtime has one thread: blocked past the deadline, as in a frozen process,
    // it runs no renewal and no timer, and nothing runs between the wake and the check.
    std::thread::sleep(Duration::from_millis(1200));
    let checked = keeper.check();
    assert!(
        matches!(checked, Err(Error::LeaseLost { .. })),
        "{checked:?}"
    );
    assert!(
        matches!(keeper.lost_reason(), Some(LostReason::Overdue)),
        "{:?}",
        keeper.lost_reason()
    );
    assert!(keeper.lost().is_cancelled(), "lost() fires with the check");
    drop(keeper);
    app.stop().await;
}

#[tokio::test]
async fn a_write_in_flight_when_the_lease_is_lost_runs_to_its_answer() {
    let app = TestApp::spawn().await;
    let proxy = Proxy::start(upstream(&app.instance.base)).await;
    let through = client(&proxy.base());
    let k = key("k");
    // Lost 1.5 s before the deadline: the write held until then still lands in time.
    let options = KeeperOptions::default().margin(Duration::from_millis(1500));
    let keeper = LeaseKeeper::acquire(&through, &k, &request(3000), options)
        .await
        .unwrap();
    let put = PutOptions::default();
    proxy.stall();

    let lost = keeper.lost();
    let (written, ()) = tokio::join!(
        keeper.fenced(|token| through.put_snapshot(&k, token, "in flight", &put)),
        async {
            timeout(Duration::from_secs(10), lost.cancelled())
                .await
                .expect("lost() fired while the write was held");
            proxy.resume();
        }
    );
    assert!(
        matches!(keeper.lost_reason(), Some(LostReason::Lapsing { .. })),
        "{:?}",
        keeper.lost_reason()
    );
    let written = written.expect("the write's own answer, not the loss");
    let stored = client(&app.instance.base).get_snapshot(&k).await.unwrap();
    assert_eq!(stored.head.version, written.meta.version);
    assert_eq!(stored.head.token, keeper.token());
    drop(keeper);
    app.stop().await;
}
