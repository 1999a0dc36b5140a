//! A TCP proxy on a loopback port that the test controls, put between a client and PostgreSQL:
//! it can cut every connection at once (answers already committed are then lost on the way),
//! stall them (bytes are held, in both directions, until resumed), and move to another target
//! (a failover's virtual address: new connections reach the new server, old ones are cut).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinHandle};

struct Shared {
    target: Mutex<SocketAddr>,
    connections: Mutex<Vec<AbortHandle>>,
    flowing: watch::Sender<bool>,
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
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            connections: Mutex::new(Vec::new()),
            flowing: watch::Sender::new(true),
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

    /// Closes every open connection at once, whatever is in flight on it.
    pub fn cut(&self) {
        for c in self.shared.connections.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// Holds every byte of every connection, new ones included, until [`resume`](Self::resume).
    pub fn stall(&self) {
        self.shared.flowing.send_replace(false);
    }

    /// Lets bytes flow again.
    pub fn resume(&self) {
        self.shared.flowing.send_replace(true);
    }

    /// Sends new connections to `target` and cuts the open ones.
    pub fn retarget(&self, target: SocketAddr) {
        *self.shared.target.lock().unwrap() = target;
        self.cut();
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
        let target = *shared.target.lock().unwrap();
        let flowing = shared.flowing.subscribe();
        let task = tokio::spawn(async move {
            // A target that is down refuses the connection: the client sees it closed, as it
            // would see a server that is gone.
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            tokio::select! {
                () = pump(client_read, server_write, flowing.clone()) => {}
                () = pump(server_read, client_write, flowing) => {}
            }
        });
        let mut open = shared.connections.lock().unwrap();
        open.retain(|c| !c.is_finished());
        open.push(task.abort_handle());
    }
}

/// Copies one direction, holding each chunk while the proxy is stalled. Returns when either side
/// closes, which ends the connection in both directions.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut flowing: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
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
