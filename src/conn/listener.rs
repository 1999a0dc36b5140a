//! The cap on open connections: one more is not accepted and waits in the listen queue, as with
//! nginx.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::connect_info::Connected;
use axum_server::{AddrListener, Address};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// A client's address as [`Listener`] hands it over (axum-server names a listener by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

impl Address for Peer {
    type Stream = Admitted;
    type Listener = Listener;
}

impl Connected<Peer> for SocketAddr {
    fn connect_info(peer: Peer) -> Self {
        peer.0
    }
}

/// An accepted connection and its place under the cap, given back when dropped.
pub struct Admitted {
    pub(super) stream: TcpStream,
    pub(super) slot: OwnedSemaphorePermit,
    pub(super) accepted: Instant,
}

/// A listener that accepts a connection only while fewer than its cap are open.
pub struct Listener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
}

impl Listener {
    /// Accepts from `listener`, keeping at most `max_connections` open.
    pub fn new(listener: TcpListener, max_connections: usize) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(max_connections)),
        }
    }
}

impl AddrListener<Admitted, Peer> for Listener {
    async fn bind_to(_: Peer) -> io::Result<Self> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "bind a TcpListener and wrap it in conn::Listener",
        ))
    }

    async fn accept_stream(&self) -> io::Result<(Admitted, Peer)> {
        // While no slot is free nothing is accepted; connections wait in the listen queue.
        let slot = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (stream, addr) = self.listener.accept().await?;
        let admitted = Admitted {
            stream,
            slot,
            accepted: Instant::now(),
        };
        Ok((admitted, Peer(addr)))
    }

    fn get_local_addr(&self) -> io::Result<Peer> {
        self.listener.local_addr().map(Peer)
    }
}
