//! Connections, below the requests: the cap on open connections (`listener.rs`), each connection's
//! stream with the head and idle timeouts (`watched.rs`), hyper's limits set above the service's,
//! and hyper's own answers made problem+json.

mod answer;
mod deadline;
mod listener;
mod record;
mod watched;

use std::io;
use std::time::Duration;

use axum_server::Server;
use axum_server::accept::Accept;
use futures_util::future::BoxFuture;
use tokio::net::TcpStream;

use crate::http::MAX_URI_BYTES;
use crate::rules::Rules;
pub use listener::{Admitted, Listener, Peer};
pub use record::Transport;
pub use watched::{Tracked, Watched};

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
            Ok(watched::pair(stream, service, slot, accepted, limits))
        })
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
