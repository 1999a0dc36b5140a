//! A connection's stream and its service, sharing the count of its requests in flight: the stream
//! keeps the head and idle clocks by it, and replaces hyper's bare answer to a head only while no
//! request is in flight.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use futures_util::future::BoxFuture;
use futures_util::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::deadline::Deadlines;
use super::record::{self, Records, Transport};
use super::{HeadLimits, Limits, answer};

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

/// The stream and the service of a connection accepted at `accepted`, holding `slot` until closed.
pub(super) fn pair<S, T>(
    stream: S,
    service: T,
    slot: OwnedSemaphorePermit,
    accepted: Instant,
    limits: Limits,
) -> (Watched<S>, Tracked<T>) {
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
    (watched, tracked)
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
