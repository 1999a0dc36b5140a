//! A TCP proxy on a loopback port, between a client and the server, that the tests steer: it
//! forwards, stalls like a partitioned network, breaks connections, or answers in the server's
//! place as a gateway in front of it would. Nothing is faked inside the client or the server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What the proxy does with a connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Pass bytes both ways.
    Forward,
    /// Hold every byte, both ways, on new and open connections, until the mode changes.
    Stall,
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

#[derive(Debug)]
struct Shared {
    /// The mode of connections without one of their own; read at every chunk.
    mode: Mutex<Mode>,
    /// Modes for the next connections, one each, before they fall back to `mode`.
    next: Mutex<Vec<Mode>>,
    connections: AtomicUsize,
}

impl Shared {
    fn mode(&self) -> Mode {
        self.mode.lock().unwrap().clone()
    }

    async fn until_not_stalled(&self) {
        while self.mode() == Mode::Stall {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A running proxy; dropping it closes every connection.
pub struct Proxy {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
    stop: CancellationToken,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.accept.abort();
    }
}

impl Proxy {
    /// A proxy on a free port in front of `upstream` (`http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str) -> Self {
        Self::start_on(TcpListener::bind("127.0.0.1:0").await.unwrap(), upstream)
    }

    /// A proxy on `listener` in front of `upstream`.
    pub fn start_on(listener: TcpListener, upstream: &str) -> Self {
        let upstream: SocketAddr = upstream
            .trim_start_matches("http://")
            .parse()
            .expect("an http://IP:PORT upstream");
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Forward),
            next: Mutex::new(Vec::new()),
            connections: AtomicUsize::new(0),
        });
        let stop = CancellationToken::new();
        let accept = tokio::spawn({
            let (shared, stop) = (shared.clone(), stop.clone());
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        return;
                    };
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    let own = {
                        let mut next = shared.next.lock().unwrap();
                        (!next.is_empty()).then(|| next.remove(0))
                    };
                    let conn = stop.child_token();
                    tokio::spawn(serve(client, upstream, shared.clone(), own, conn));
                }
            }
        });
        Self {
            base,
            shared,
            accept,
            stop,
        }
    }

    /// Sets the mode of every connection without one of its own, open ones included.
    pub fn set(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    /// Gives each of the next connections one of `modes`, in order.
    pub fn next_connections(&self, modes: Vec<Mode>) {
        self.shared.next.lock().unwrap().extend(modes);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    own: Option<Mode>,
    conn: CancellationToken,
) {
    let (mut client_r, mut client_w) = client.into_split();
    if let Some(mode @ (Mode::Reset | Mode::Answer { .. })) = &own {
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
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (server_r, server_w) = server.into_split();
    let drop_answer = own == Some(Mode::DropAnswer);
    tokio::select! {
        () = conn.cancelled() => {}
        () = to_server(client_r, server_w, &shared) => {}
        () = to_client(server_r, client_w, &shared, drop_answer) => {}
    }
}

async fn to_server(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: &Shared) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                // Keep going until the answer is through; the other direction ends the pair.
                std::future::pending::<()>().await;
            }
            Ok(n) => {
                shared.until_not_stalled().await;
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn to_client(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    shared: &Shared,
    drop_answer: bool,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) if drop_answer => return,
            Ok(n) => {
                shared.until_not_stalled().await;
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
