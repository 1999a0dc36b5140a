//! HTTP/1.1 on a bare TCP socket, for what no HTTP library does: send a head a byte at a
//! time, connect and send nothing, keep a connection to watch for its close.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// A generous ceiling on anything the server is expected to do at once.
const CEILING: Duration = Duration::from_secs(30);

/// An answer as it came off the wire.
pub struct Answer {
    /// The status code.
    pub status: u16,
}

/// `127.0.0.1:PORT` of an instance's `http://127.0.0.1:PORT`.
pub fn addr(base: &str) -> &str {
    base.strip_prefix("http://").expect("a plain HTTP instance")
}

/// A new connection to the instance at `base`.
pub async fn connect(base: &str) -> TcpStream {
    TcpStream::connect(addr(base)).await.expect("connecting")
}

/// Reads one answer from `stream`: its head, then as many body bytes as `Content-Length` says.
pub async fn read_answer(stream: &mut TcpStream) -> Answer {
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
        let mut body = bytes.len() - head_end;
        while body < length {
            let n = stream.read(&mut chunk).await.expect("reading a body");
            assert!(n > 0, "closed within a body");
            body += n;
        }
        Answer { status }
    };
    tokio::time::timeout(CEILING, read)
        .await
        .expect("an answer within the ceiling")
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
