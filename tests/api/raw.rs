//! HTTP/1.1 on a bare TCP socket, for what no HTTP library sends: malformed heads, conflicting
//! lengths, heads a byte at a time, connections that send nothing.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A generous ceiling on anything the server is expected to do at once.
const CEILING: Duration = Duration::from_secs(30);

/// An answer as it came off the wire.
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Answer {
    /// The value of a header sent once.
    pub fn header(&self, name: &str) -> Option<&str> {
        let mut values = self.headers.iter().filter(|(n, _)| n == name);
        let value = values.next().map(|(_, v)| v.as_str());
        assert!(values.next().is_none(), "{name} sent twice");
        value
    }

    /// Asserts a problem+json answer of `status` and `code` with an `x-request-id`; returns its
    /// body.
    pub fn problem(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status, status, "status");
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json")
        );
        let id = self.header("x-request-id").expect("an x-request-id");
        assert!(!id.is_empty());
        let body: Value = serde_json::from_slice(&self.body).expect("a JSON body");
        assert_eq!(
            (body["code"].as_str(), body["status"].as_u64()),
            (Some(code), Some(u64::from(status))),
            "{body}"
        );
        assert!(body["detail"].as_str().is_some_and(|d| !d.is_empty()));
        body
    }
}

/// `127.0.0.1:PORT` of an instance's `http://127.0.0.1:PORT`.
pub fn addr(base: &str) -> &str {
    base.strip_prefix("http://").expect("a plain HTTP instance")
}

/// A new connection to the instance at `base`.
pub async fn connect(base: &str) -> TcpStream {
    TcpStream::connect(addr(base)).await.expect("connecting")
}

/// Reads one answer from `stream` (a connection, or its reading half): its head, then as many
/// body bytes as `Content-Length` says.
pub async fn read_answer(stream: &mut (impl AsyncRead + Unpin)) -> Answer {
    let read = async {
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        let head_end = loop {
            if let Some(i) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let n = stream.read(&mut chunk).await.expect("reading an answer");
            assert!(n > 0, "closed before an answer: {bytes:?}");
            bytes.extend_from_slice(&chunk[..n]);
        };
        let head = std::str::from_utf8(&bytes[..head_end]).expect("an ASCII head");
        let mut lines = head.trim_end().split("\r\n");
        let status = lines.next().unwrap()[9..12].parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse().unwrap());
        let mut body = bytes[head_end..].to_vec();
        while body.len() < length {
            let n = stream.read(&mut chunk).await.expect("reading a body");
            assert!(n > 0, "closed within a body");
            body.extend_from_slice(&chunk[..n]);
        }
        Answer {
            status,
            headers,
            body,
        }
    };
    tokio::time::timeout(CEILING, read)
        .await
        .expect("an answer within the ceiling")
}

/// Sends `request` on a new connection and reads the answer.
pub async fn exchange(base: &str, request: &[u8]) -> Answer {
    let mut stream = connect(base).await;
    // The server may answer and close before it has read everything (a head over its limit):
    // what could not be sent does not matter.
    let _ = stream.write_all(request).await;
    read_answer(&mut stream).await
}

/// Waits until the server closes `stream` (an end of file or a reset), within `ceiling`; the
/// server must send nothing first.
pub async fn closed(stream: &mut TcpStream, ceiling: Duration) {
    let mut buf = [0u8; 1024];
    let closed = async {
        if let Ok(n @ 1..) = stream.read(&mut buf).await {
            panic!("bytes where a close was expected: {:?}", &buf[..n]);
        }
    };
    tokio::time::timeout(ceiling, closed)
        .await
        .expect("closed within the ceiling");
}

/// Whether the server still holds `stream` open, having sent nothing on it.
pub fn open_and_silent(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(stream.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}
