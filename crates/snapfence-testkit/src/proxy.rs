//! A TCP proxy on a loopback port that a test steers, put between a client and a server (the
//! snapfence service, or PostgreSQL). It plays the network and the gateways on it: it forwards,
//! stalls every connection like a partition (bytes are held both ways until resumed), cuts every
//! open connection at once, moves to another target (a failover's virtual address), and gives
//! chosen connections their own fate: broken after the request, answered in the server's place,
//! or forwarded with the answer lost. Nothing is faked inside the client or the server.
//!
//! Shared by `tests/client` and `tests/faults` (included with `#[path]`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

/// What the proxy does with one connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Pass bytes both ways (stalled while the proxy is).
    Forward,
    /// Read the request, then close the connection without forwarding it.
    Reset,
    /// Forward the request, then close the connection instead of passing the answer on: the
    /// server acts on a request whose answer the client never gets.
    DropAnswer,
    /// Read the request and answer it in the server's place, then close.
    Answer {
        /// The status line's code and reason, e.g. `401 Unauthorized`.
        status: &'static str,
        /// The answer's content type.
        content_type: &'static str,
        /// The answer's body.
        body: String,
    },
}

impl Mode {
    /// A problem+json answer with the contract's fields.
    pub fn problem(status: &'static str, code: &str, detail: &str) -> Self {
        let number: u16 = status[..3].parse().unwrap();
        let body = serde_json::json!({
            "type": format!("urn:snapfence:problem:{code}"),
            "title": &status[4..],
            "status": number,
            "detail": detail,
            "code": code,
        });
        Self::Answer {
            status,
            content_type: "application/problem+json",
            body: body.to_string(),
        }
    }
}

struct Shared {
    target: Mutex<SocketAddr>,
    /// Modes for the next connections, one each, before they fall back to forwarding.
    next: Mutex<Vec<Mode>>,
    /// The open connections, so that [`Proxy::cut`] can end them.
    open: Mutex<Vec<AbortHandle>>,
    /// False while stalled; every chunk waits for true.
    flowing: watch::Sender<bool>,
    accepted: AtomicUsize,
}

/// A running proxy; dropping it closes its port and every connection.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port for the proxy");
        Self::start_on(listener, target)
    }

    /// Forwards each connection made to `listener` to `target`.
    pub fn start_on(listener: TcpListener, target: SocketAddr) -> Self {
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            next: Mutex::new(Vec::new()),
            open: Mutex::new(Vec::new()),
            flowing: watch::Sender::new(true),
            accepted: AtomicUsize::new(0),
        });
        let accepting = tokio::spawn(accept(listener, shared.clone()));
        Self {
            addr,
            shared,
            accepting,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for HTTP clients.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Holds every byte of every connection, new ones included, until [`resume`](Self::resume).
    pub fn stall(&self) {
        self.shared.flowing.send_replace(false);
    }

    /// Lets bytes flow again.
    pub fn resume(&self) {
        self.shared.flowing.send_replace(true);
    }

    /// Closes every open connection at once, whatever is in flight on it.
    pub fn cut(&self) {
        for c in self.shared.open.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// Sends new connections to `target` and cuts the open ones.
    pub fn retarget(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap() = target;
        self.cut();
    }

    /// Gives each of the next connections one of `modes`, in order.
    pub fn next_connections(&self, modes: Vec<Mode>) {
        self.shared.next.lock().unwrap().extend(modes);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.cut();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let mode = {
            let mut next = shared.next.lock().unwrap();
            (!next.is_empty()).then(|| next.remove(0))
        };
        let target = *shared.target.lock().unwrap();
        let flowing = shared.flowing.subscribe();
        let task = tokio::spawn(serve(
            client,
            target,
            mode.unwrap_or(Mode::Forward),
            flowing,
        ));
        let mut open = shared.open.lock().unwrap();
        open.retain(|c| !c.is_finished());
        open.push(task.abort_handle());
    }
}

async fn serve(client: TcpStream, target: SocketAddr, mode: Mode, flowing: watch::Receiver<bool>) {
    let (mut client_r, mut client_w) = client.into_split();
    if let Mode::Reset | Mode::Answer { .. } = &mode {
        let mut buf = vec![0; 64 * 1024];
        let _ = client_r.read(&mut buf).await;
        if let Mode::Answer {
            status,
            content_type,
            body,
        } = mode
        {
            let answer = format!(
                "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = client_w.write_all(answer.as_bytes()).await;
        }
        return;
    }
    // A target that is down refuses the connection: the client sees it closed, as it would see
    // a server that is gone.
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let (server_r, server_w) = server.into_split();
    let drop_answer = mode == Mode::DropAnswer;
    tokio::select! {
        () = to_server(client_r, server_w, flowing.clone()) => {}
        () = to_client(server_r, client_w, flowing, drop_answer) => {}
    }
}

/// Copies the client's bytes to the server. When the client half-closes, the server is told so
/// and the answer may still come back: the other direction ends the pair.
async fn to_server(from: OwnedReadHalf, mut to: OwnedWriteHalf, flowing: watch::Receiver<bool>) {
    pump(from, &mut to, flowing).await;
    let _ = to.shutdown().await;
    std::future::pending::<()>().await;
}

/// Copies the server's bytes to the client, or with `drop_answer` ends the connection as the
/// first of them arrives.
async fn to_client(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    flowing: watch::Receiver<bool>,
    drop_answer: bool,
) {
    if drop_answer {
        let _ = from.read(&mut [0; 1]).await;
        return;
    }
    pump(from, &mut to, flowing).await;
}

/// Copies one direction until it closes, holding each chunk while the proxy is stalled.
async fn pump(
    mut from: OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mut flowing: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if flowing.wait_for(|f| *f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
