//! Writes the kernel takes whole or not at all, one watch event each, so the idle cut of a stalled
//! stream falls between events. A write with `MSG_EOR` ends its segment buffer, so the next is
//! refused whole (`EAGAIN`) when there is no room.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, Interest};
use tokio::net::TcpStream;

/// Where an event ends over HTTP/1.1: the SSE blank line, then the chunk's CRLF.
const EVENT_END: &[u8; 4] = b"\n\n\r\n";

/// How far into a write event ends are looked for: beyond any event (~1.2 KB).
const SCAN_BYTES: usize = 64 * 1024;

/// A connection's byte stream that can write a record its client gets whole or not at all.
pub trait Transport: AsyncRead + AsyncWrite + Unpin {
    /// Writes a prefix of `bufs` as one record (see [`Transport::record_bytes`]).
    fn poll_write_record(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>>;

    /// The most bytes a record may hold and still be taken whole.
    fn record_bytes(&self) -> usize;
}

impl Transport for TcpStream {
    fn poll_write_record(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.poll_write_ready(cx))?;
            let sent = self.try_io(Interest::WRITABLE, || {
                SockRef::from(&*self).send_vectored_with_flags(bufs, libc::MSG_EOR)
            });
            match sent {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                sent => return Poll::Ready(sent),
            }
        }
    }

    fn record_bytes(&self) -> usize {
        // SACK blocks take up to 40 bytes of the reported MSS.
        const OPTIONS: usize = 40;
        const MIN_MSS: usize = 536;
        let mss = SockRef::from(self)
            .tcp_mss()
            .map_or(MIN_MSS, |mss| mss as usize);
        mss.saturating_sub(OPTIONS).max(1)
    }
}

/// rustls may take part of a write, so over TLS a stream may still be cut inside an event.
impl Transport for tokio_rustls::server::TlsStream<TcpStream> {
    fn poll_write_record(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self).poll_write_vectored(cx, bufs)
    }

    fn record_bytes(&self) -> usize {
        16 * 1024
    }
}

#[derive(Debug, Default)]
pub(super) struct Records {
    matched: usize,
}

impl Records {
    /// The next record's length: up to the last event end within `record_bytes`, else the first.
    pub(super) fn next(&self, bufs: &[IoSlice<'_>], record_bytes: impl FnOnce() -> usize) -> usize {
        let mut limit = Some(record_bytes);
        let mut cap = usize::MAX;
        let mut last = None;
        let mut matched = self.matched;
        let mut offset = 0;
        for buf in bufs {
            let scan = &buf[..buf.len().min(SCAN_BYTES.saturating_sub(offset))];
            let mut at = 0;
            while at < scan.len() {
                if matched == 0 {
                    // Only a newline begins an event end, so bodies with few newlines cost little.
                    match memchr::memchr(b'\n', &scan[at..]) {
                        Some(skip) => at += skip,
                        None => break,
                    }
                }
                matched = step(matched, scan[at]);
                at += 1;
                if matched == EVENT_END.len() {
                    matched = step(0, b'\n');
                    let end = offset + at;
                    if let Some(limit) = limit.take() {
                        cap = limit();
                    }
                    if end > cap {
                        return last.unwrap_or(end);
                    }
                    last = Some(end);
                }
            }
            offset += buf.len();
        }
        last.unwrap_or(offset)
    }

    pub(super) fn wrote(&mut self, bufs: &[IoSlice<'_>], written: usize) {
        let tail = EVENT_END.len() - 1;
        let (from, start) = if written >= tail {
            (written - tail, 0)
        } else {
            (0, self.matched)
        };
        let mut matched = start;
        let mut offset = 0;
        for buf in bufs {
            let within = |at: usize| at.saturating_sub(offset).min(buf.len());
            for &byte in &buf[within(from)..within(written)] {
                matched = match step(matched, byte) {
                    4 => step(0, byte),
                    m => m,
                };
            }
            offset += buf.len();
        }
        self.matched = matched;
    }
}

pub(super) fn prefix<'a>(bufs: &'a [IoSlice<'a>], mut len: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::new();
    for buf in bufs {
        if len == 0 {
            break;
        }
        let take = buf.len().min(len);
        out.push(IoSlice::new(&buf[..take]));
        len -= take;
    }
    out
}

fn step(matched: usize, byte: u8) -> usize {
    match (matched, byte) {
        (0 | 1, b'\n') => matched + 1,
        (2, b'\n') => 2,
        (2, b'\r') => 3,
        (3, b'\n') => 4,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(records: &Records, bytes: &[&[u8]], limit: usize) -> usize {
        let bufs: Vec<IoSlice<'_>> = bytes.iter().map(|b| IoSlice::new(b)).collect();
        records.next(&bufs, || limit)
    }

    const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";

    #[test]
    fn a_write_without_an_event_end_is_one_record() {
        let records = Records::default();
        assert_eq!(record(&records, &[HEAD], 10), HEAD.len());
        assert_eq!(record(&records, &[b"0\r\n\r\n"], 10), 5);
    }

    #[test]
    fn a_record_ends_at_the_last_event_end_within_the_limit() {
        let records = Records::default();
        let events: &[&[u8]] = &[
            b"7\r\n", b"id: 1", b"\n\n", b"\r\n", b"7\r\n", b"id: 2", b"\n\n", b"\r\n", b"3\r\n",
        ];
        assert_eq!(record(&records, events, 100), 24);
        assert_eq!(record(&records, events, 23), 12);
    }

    #[test]
    fn an_event_longer_than_the_limit_is_a_record_of_its_own() {
        let records = Records::default();
        let events: &[&[u8]] = &[b"7\r\nid: 1\n\n\r\n7\r\nid: 2\n\n\r\n"];
        assert_eq!(record(&records, events, 4), 12);
    }

    #[test]
    fn an_event_end_past_the_scanned_bytes_is_not_looked_for() {
        let records = Records::default();
        let body = vec![b'x'; SCAN_BYTES];
        let events: &[&[u8]] = &[&body, b"\n\n\r\n"];
        assert_eq!(record(&records, events, 100), SCAN_BYTES + 4);
    }

    #[test]
    fn an_event_end_begun_by_the_last_write_is_finished_by_the_next() {
        let mut records = Records::default();
        let first = [IoSlice::new(b"7\r\nid: 1\n\n")];
        records.wrote(&first, 10);
        assert_eq!(record(&records, &[b"\r\n7\r\nid: 2\n\n\r\n"], 100), 14);
        assert_eq!(record(&records, &[b"\r\n7\r\nid: 2\n\n\r\n"], 10), 2);
    }

    #[test]
    fn a_write_taken_in_part_leaves_what_its_last_bytes_began() {
        let mut records = Records::default();
        let bufs = [IoSlice::new(b"id: 1\n"), IoSlice::new(b"\n\r\nid")];
        records.wrote(&bufs, 8);
        assert_eq!(records.matched, 3);
        records.wrote(&[IoSlice::new(b"\nx")], 1);
        assert_eq!(records.matched, 1);
    }
}
