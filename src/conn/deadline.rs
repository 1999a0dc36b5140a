//! A connection's head timeout and idle timeout. hyper's `header_read_timeout` cannot be both: it
//! arms when a keep-alive connection goes idle, so the longer idle timeout could never be reached.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request's head, since the accept or the next request's first byte.
    Head,
    /// A request is in flight: no clock runs (the body timeout and database bound cover it).
    Busy,
    /// No request in flight: the idle timeout runs from the last byte sent or received.
    Idle,
}

pub(super) struct Deadlines {
    head: Duration,
    idle: Duration,
    phase: Phase,
    begun: u64,
    timer: Pin<Box<Sleep>>,
}

impl Deadlines {
    pub(super) fn new(accepted: Instant, head: Duration, idle: Duration) -> Self {
        Self {
            head,
            idle,
            phase: Phase::Head,
            begun: 0,
            timer: Box::pin(tokio::time::sleep_until(accepted + head)),
        }
    }

    pub(super) fn observe(&mut self, busy: bool, begun: u64) {
        let answered_unseen = begun != self.begun;
        self.begun = begun;
        match (busy, self.phase) {
            (true, _) => self.phase = Phase::Busy,
            (false, Phase::Busy) => self.enter(Phase::Idle),
            (false, Phase::Head | Phase::Idle) if answered_unseen => self.enter(Phase::Idle),
            (false, Phase::Head | Phase::Idle) => {}
        }
    }

    /// Bytes arrived: on an idle HTTP/1 connection they start a head, whose clock later bytes do
    /// not move.
    pub(super) fn received(&mut self, http2: bool) {
        match (self.phase, http2) {
            (Phase::Idle, false) => self.enter(Phase::Head),
            (Phase::Idle, true) => self.enter(Phase::Idle),
            (Phase::Head | Phase::Busy, _) => {}
        }
    }

    pub(super) fn sent(&mut self) {
        if self.phase == Phase::Idle {
            self.enter(Phase::Idle);
        }
    }

    pub(super) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if self.phase == Phase::Busy {
            return Poll::Pending;
        }
        self.timer.as_mut().poll(cx).map(|()| {
            let (what, after) = match self.phase {
                Phase::Head => ("no request head arrived", self.head),
                Phase::Busy | Phase::Idle => ("the connection idled", self.idle),
            };
            tracing::debug!(?after, "closing a connection: {what} within its timeout");
            io::Error::new(io::ErrorKind::TimedOut, format!("{what} within {after:?}"))
        })
    }

    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        let after = match phase {
            Phase::Head => self.head,
            Phase::Idle => self.idle,
            Phase::Busy => return,
        };
        self.timer.as_mut().reset(Instant::now() + after);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(60);

    fn expired(d: &mut Deadlines) -> bool {
        let waker = std::task::Waker::noop();
        d.poll_expired(&mut Context::from_waker(waker)).is_ready()
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_connection_has_the_head_timeout_from_its_accept() {
        let mut d = Deadlines::new(Instant::now(), HEAD, IDLE);
        tokio::time::advance(HEAD - Duration::from_millis(1)).await;
        assert!(!expired(&mut d));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(expired(&mut d));
    }

    #[tokio::test(start_paused = true)]
    async fn no_clock_runs_while_a_request_is_in_flight() {
        let mut d = Deadlines::new(Instant::now(), HEAD, IDLE);
        d.observe(true, 1);
        tokio::time::advance(IDLE * 10).await;
        assert!(!expired(&mut d));
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_has_the_idle_timeout_not_the_head_timeout() {
        let mut d = Deadlines::new(Instant::now(), HEAD, IDLE);
        d.observe(true, 1);
        d.observe(false, 1);
        tokio::time::advance(HEAD * 2).await;
        assert!(!expired(&mut d));
        tokio::time::advance(IDLE - HEAD * 2).await;
        assert!(expired(&mut d));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_begun_and_answered_between_two_observations_starts_the_idle_clock() {
        let mut d = Deadlines::new(Instant::now(), HEAD, IDLE);
        tokio::time::advance(HEAD / 2).await;
        d.observe(false, 1);
        tokio::time::advance(HEAD).await;
        assert!(!expired(&mut d));
        tokio::time::advance(IDLE - HEAD).await;
        assert!(expired(&mut d));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_byte_on_an_idle_http1_connection_starts_a_head_that_later_bytes_do_not_extend()
     {
        let mut d = Deadlines::new(Instant::now(), HEAD, IDLE);
        d.observe(true, 1);
        d.observe(false, 1);
        d.received(false);
        tokio::time::advance(HEAD / 2).await;
        d.received(false);
        tokio::time::advance(HEAD / 2).await;
        assert!(expired(&mut d));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_sent_or_http2_frames_received_keep_an_idle_connection_alive() {
        let mut d = Deadlines::new(Instant::now(), HEAD, IDLE);
        d.observe(true, 1);
        d.observe(false, 1);
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        d.sent();
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        d.received(true);
        tokio::time::advance(IDLE - Duration::from_secs(1)).await;
        assert!(!expired(&mut d));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(expired(&mut d));
    }
}
