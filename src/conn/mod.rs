//! Connections, below the requests: the cap on open connections (one more waits in the listen
//! queue, as with nginx), the head and idle timeouts, hyper's limits set above the service's, and
//! hyper's own answers made problem+json.

mod answer;
mod deadline;
mod record;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::connect_info::Connected;
use axum_server::accept::Accept;
use axum_server::{AddrListener, Address, Server};
use futures_util::future::BoxFuture;
use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::http::MAX_URI_BYTES;
use crate::rules::Rules;
use deadline::Deadlines;
use record::Records;
pub use record::Transport;

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
    stream: TcpStream,
    slot: OwnedSemaphorePermit,
    accepted: Instant,
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

/// The most header fields (more is `431`). Not derived from `--max-header-bytes`: hyper allocates
/// arrays of this many per request, and 3,277 cost a quarter of the CPU of small reads.
pub const MAX_HEADER_FIELDS: usize = 100;

/// Hyper's head limits, set so it refuses by size only what the service would.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// hyper's read buffer: twice the target and header limits (whitespace is not counted).
    pub buffer_bytes: usize,
    /// hyper's limit on header fields: [`MAX_HEADER_FIELDS`].
    pub fields: usize,
    /// hyper's HTTP/2 header list limit, which counts 32 bytes more per field.
    pub http2_list_bytes: u32,
}

impl HeadLimits {
    /// The limits for the service's rules.
    pub fn for_rules(rules: &Rules) -> Self {
        let service = MAX_URI_BYTES + rules.max_header_bytes;
        Self {
            buffer_bytes: (2 * service).max(8192),
            fields: MAX_HEADER_FIELDS,
            http2_list_bytes: u32::try_from(8 * service).unwrap_or(u32::MAX),
        }
    }
}

/// Sets hyper's limits above the service's; the head timeout is [`Watched`]'s.
pub fn tune<A>(server: &mut Server<Peer, A>, rules: &Rules) {
    let head = HeadLimits::for_rules(rules);
    let builder = server.http_builder();
    builder
        .http1()
        .max_buf_size(head.buffer_bytes)
        .max_headers(head.fields)
        .header_read_timeout(None::<Duration>);
    builder.http2().max_header_list_size(head.http2_list_bytes);
}

#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    begun: AtomicU64,
    head_unanswered: AtomicBool,
    reader: AtomicWaker,
}

struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.begun.fetch_add(1, Ordering::AcqRel);
        activity.head_unanswered.store(false, Ordering::Release);
        Self(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.reader.wake();
        }
    }
}

/// Counts a connection's requests in flight until hyper has the answer.
#[derive(Clone)]
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S, R> tower::Service<R> for Tracked<S>
where
    S: tower::Service<R>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        let in_flight = InFlight::begin(&self.activity);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let answer = answer.await;
            drop(in_flight);
            answer
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    head: HeadLimits,
    head_timeout: Duration,
    idle_timeout: Duration,
}

/// Wraps each connection in [`Watched`] and its service in [`Tracked`].
#[derive(Debug, Clone)]
pub struct Acceptor<A> {
    inner: A,
    limits: Limits,
}

impl<A> Acceptor<A> {
    /// An acceptor that runs `inner` first, with the rules' limits.
    pub fn new(inner: A, rules: &Rules) -> Self {
        let limits = Limits {
            head: HeadLimits::for_rules(rules),
            head_timeout: rules.head_timeout,
            idle_timeout: rules.idle_timeout,
        };
        Self { inner, limits }
    }
}

impl<A, S> Accept<Admitted, S> for Acceptor<A>
where
    A: Accept<TcpStream, S>,
    A::Future: Send + 'static,
    A::Stream: Transport + Send + 'static,
    A::Service: Send + 'static,
{
    type Stream = Watched<A::Stream>;
    type Service = Tracked<A::Service>;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, admitted: Admitted, service: S) -> Self::Future {
        let Admitted {
            stream,
            slot,
            accepted,
        } = admitted;
        let handshake = self.inner.accept(stream, service);
        let limits = self.limits;
        Box::pin(async move {
            let (stream, service) = handshake.await?;
            let activity = Arc::new(Activity::default());
            let watched = Watched {
                inner: stream,
                activity: Arc::clone(&activity),
                deadlines: Deadlines::new(accepted, limits.head_timeout, limits.idle_timeout),
                http2: None,
                head: limits.head,
                replacing: None,
                records: Records::default(),
                _slot: slot,
            };
            let tracked = Tracked {
                inner: service,
                activity,
            };
            Ok((watched, tracked))
        })
    }
}

/// A connection's stream: its clocks, replaced answers, records, and slot under the cap.
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
    deadlines: Deadlines,
    http2: Option<bool>,
    head: HeadLimits,
    replacing: Option<(Vec<u8>, usize)>,
    records: Records,
    _slot: OwnedSemaphorePermit,
}

const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

impl<S: Transport> Watched<S> {
    fn busy(&self) -> bool {
        self.activity.in_flight.load(Ordering::Acquire) > 0
    }

    fn observe(&mut self) -> bool {
        // In this order, a request beginning between the loads counts as in flight.
        let begun = self.activity.begun.load(Ordering::Acquire);
        let busy = self.busy();
        self.deadlines.observe(busy, begun);
        busy
    }

    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, sent)) = &mut self.replacing {
            if *sent == bytes.len() {
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *sent += n;
        }
        Poll::Ready(Ok(()))
    }

    fn poll_write_records(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.observe();
        let inner = &self.inner;
        let len = self.records.next(bufs, || inner.record_bytes());
        let written = if len == bufs.iter().map(|b| b.len()).sum::<usize>() {
            ready!(self.inner.poll_write_record(cx, bufs))?
        } else {
            let record = record::prefix(bufs, len);
            ready!(self.inner.poll_write_record(cx, &record))?
        };
        self.records.wrote(bufs, written);
        self.deadlines.sent();
        Poll::Ready(Ok(written))
    }

    fn replace(&mut self, cx: &mut Context<'_>, bytes: &[u8]) -> Option<io::Result<usize>> {
        let head_unanswered = self.activity.head_unanswered.load(Ordering::Acquire);
        if self.http2 == Some(true) || !head_unanswered || self.busy() {
            return None;
        }
        let answer = answer::recognise(bytes)?;
        self.replacing = Some((answer::replacement(&answer, &self.head), 0));
        match self.poll_replacement(cx) {
            Poll::Ready(Err(e)) => Some(Err(e)),
            Poll::Ready(Ok(())) | Poll::Pending => Some(Ok(bytes.len())),
        }
    }
}

impl<S: Transport> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Registered before `busy` is read, so an answer handed over in between wakes us.
        this.activity.reader.register(cx.waker());
        let busy = this.observe();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let got = &buf.filled()[before..];
                if !got.is_empty() {
                    let http2 = *this
                        .http2
                        .get_or_insert_with(|| got.starts_with(HTTP2_PREFACE));
                    this.deadlines.received(http2);
                    if !busy {
                        this.activity.head_unanswered.store(true, Ordering::Release);
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.deadlines.poll_expired(cx).map(Err),
        }
    }
}

impl<S: Transport> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        if let Some(replaced) = this.replace(cx, buf) {
            return Poll::Ready(replaced);
        }
        this.poll_write_records(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total <= answer::LONGEST {
            let joined: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            if let Some(replaced) = this.replace(cx, &joined) {
                return Poll::Ready(replaced);
            }
        }
        this.poll_write_records(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_refuses_by_size_only_heads_the_service_refuses_by_size() {
        let rules = Rules::default();
        let head = HeadLimits::for_rules(&rules);
        assert!(head.buffer_bytes > MAX_URI_BYTES + rules.max_header_bytes);
        assert_eq!(head.fields, MAX_HEADER_FIELDS);
    }
}
