//! Connection limits: the head timeout, the idle timeout and the cap on open connections, and
//! that connections which send nothing cannot keep anyone else from being served.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::harness::{TestApp, https_instance, rules};
use crate::raw;

/// A generous ceiling on how late a connection may be closed after its timeout, on a loaded
/// machine.
const LATE: Duration = Duration::from_secs(15);

/// How early a close may seem, measured from the client's side of the accept.
const EARLY: Duration = Duration::from_millis(100);

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";

/// Waits for the server to close `stream` and returns how long that took from `since`.
async fn closed_after(stream: &mut TcpStream, since: Instant, timeout: Duration) -> Duration {
    raw::closed(stream, timeout + LATE).await;
    since.elapsed()
}

/// Raises this process's soft limit on open files as far as the hard limit allows; returns it.
pub(crate) fn raise_file_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let wanted = hard.min(1 << 16);
    if wanted > soft && setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).is_ok() {
        wanted
    } else {
        soft
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_do_not_keep_others_from_being_answered() {
    // Both ends of every connection are files of this process; a few hundred are left for the
    // database, the client and the other tests running alongside.
    let silent_count = 2000.min((raise_file_limit().saturating_sub(600) / 2) as usize);
    assert!(
        silent_count >= 500,
        "the open-file limit leaves room for {silent_count} connections only"
    );
    let mut r = rules();
    // Longer than the test, so that every silent connection stays open throughout.
    r.head_timeout = Duration::from_secs(300);
    let app = TestApp::spawn_with(r).await;
    let mut silent = Vec::with_capacity(silent_count);
    for _ in 0..silent_count {
        silent.push(raw::connect(&app.instance.base).await);
    }
    // A new connection for every call: being accepted is part of being answered.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let ceiling = Duration::from_secs(5);
    for i in 0..20 {
        let health = client.get(format!("{}/healthz", app.instance.base)).send();
        let health = tokio::time::timeout(ceiling, health).await;
        assert_eq!(
            health.expect("healthz within 5 s").unwrap().status(),
            StatusCode::OK
        );
        let acquire = client
            .post(format!("{}/v1/leases/k{i}", app.instance.base))
            .json(&json!({"owner": "w", "ttl_ms": 30000}))
            .send();
        let acquire = tokio::time::timeout(ceiling, acquire).await;
        assert_eq!(
            acquire.expect("an acquire within 5 s").unwrap().status(),
            StatusCode::CREATED
        );
    }
    let still_open = silent.iter().filter(|s| raw::open_and_silent(s)).count();
    assert_eq!(
        still_open, silent_count,
        "every silent connection was held throughout"
    );
    drop(silent);
    app.stop().await;
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_at_the_head_timeout() {
    let mut r = rules();
    r.head_timeout = Duration::from_secs(1);
    let app = TestApp::spawn_with(r).await;
    let mut stream = raw::connect(&app.instance.base).await;
    let since = Instant::now();
    let after = closed_after(&mut stream, since, app.rules.head_timeout).await;
    assert!(
        after >= app.rules.head_timeout - EARLY,
        "closed after {after:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_closed_at_the_head_timeout() {
    let mut r = rules();
    r.head_timeout = Duration::from_secs(1);
    let app = TestApp::spawn_with(r).await;
    let stream = raw::connect(&app.instance.base).await;
    let since = Instant::now();
    let (mut reader, mut writer) = stream.into_split();
    // Four bytes per head timeout: every read sees a byte well within it, so only a clock on
    // the whole head closes the connection. The whole head would take longer to send than the
    // ceiling below, so a close within it came before the head could have been complete.
    let head = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: {}\r\n\r\n",
        "p".repeat(40)
    );
    let every = Duration::from_millis(250);
    assert!(every * head.len() as u32 > app.rules.head_timeout + LATE);
    let trickle = tokio::spawn(async move {
        for byte in head.bytes() {
            if writer.write_all(&[byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(every).await;
        }
    });
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(app.rules.head_timeout + LATE, async {
        use tokio::io::AsyncReadExt;
        if let Ok(n @ 1..) = reader.read(&mut buf).await {
            panic!("an answer to a head that never arrived: {:?}", &buf[..n]);
        }
    });
    closed.await.expect("closed within the ceiling");
    let after = since.elapsed();
    assert!(
        after >= app.rules.head_timeout - EARLY,
        "closed after {after:?}"
    );
    trickle.abort();
    app.stop().await;
}

#[tokio::test]
async fn a_keep_alive_connection_may_idle_longer_than_the_head_timeout() {
    let mut r = rules();
    r.head_timeout = Duration::from_millis(500);
    r.idle_timeout = Duration::from_secs(60);
    let app = TestApp::spawn_with(r).await;
    let mut stream = raw::connect(&app.instance.base).await;
    stream.write_all(HEALTHZ).await.unwrap();
    assert_eq!(raw::read_answer(&mut stream).await.status, 200);
    tokio::time::sleep(app.rules.head_timeout * 3).await;
    stream.write_all(HEALTHZ).await.unwrap();
    assert_eq!(raw::read_answer(&mut stream).await.status, 200);
    app.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
    let mut r = rules();
    r.head_timeout = Duration::from_millis(500);
    r.idle_timeout = Duration::from_secs(2);
    let app = TestApp::spawn_with(r).await;
    let mut stream = raw::connect(&app.instance.base).await;
    stream.write_all(HEALTHZ).await.unwrap();
    assert_eq!(raw::read_answer(&mut stream).await.status, 200);
    let since = Instant::now();
    let after = closed_after(&mut stream, since, app.rules.idle_timeout).await;
    assert!(
        after >= app.rules.idle_timeout - EARLY,
        "closed after {after:?}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_connection_over_the_cap_waits_until_another_closes() {
    let mut r = rules();
    r.max_connections = 3;
    r.head_timeout = Duration::from_secs(300);
    let app = TestApp::spawn_with(r).await;
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(raw::connect(&app.instance.base).await);
    }
    // Connections are accepted in the order they arrive, so this one is the fourth.
    let mut waiting = raw::connect(&app.instance.base).await;
    waiting.write_all(HEALTHZ).await.unwrap();
    let early = tokio::time::timeout(Duration::from_secs(1), raw::read_answer(&mut waiting));
    assert!(
        early.await.is_err(),
        "answered while three connections were open"
    );
    drop(open.pop());
    assert_eq!(raw::read_answer(&mut waiting).await.status, 200);
    drop(open);
    app.stop().await;
}

#[tokio::test]
async fn a_tls_connection_that_never_handshakes_is_closed_at_the_head_timeout() {
    let mut r = rules();
    r.head_timeout = Duration::from_secs(1);
    let (instance, _) = https_instance(r.clone()).await;
    let port = instance.base.rsplit(':').next().unwrap();
    let mut stream = TcpStream::connect(format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    let since = Instant::now();
    let after = closed_after(&mut stream, since, r.head_timeout).await;
    assert!(after >= r.head_timeout - EARLY, "closed after {after:?}");
    instance.stop().await;
}
