//! The caller's W3C trace context, sent with every request a call makes, so that the server's
//! span of each request is a child of the caller's span (`docs/operations.md`, "Traces").
//!
//! Run the calls inside [`scope`]:
//!
//! ```no_run
//! use snapfence_client::trace::{self, TraceContext};
//! use snapfence_client::{Client, Key, PutOptions};
//!
//! # async fn example(
//! #     client: Client,
//! #     key: Key,
//! #     token: snapfence_client::FencingToken,
//! #     incoming_traceparent: &str,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! // E.g. the `traceparent` of the request this service is handling, or its own span's.
//! let context = TraceContext::parse(incoming_traceparent)?;
//! trace::scope(context, async {
//!     // Every attempt of every call in here sends `traceparent: 00-<trace id>-<span id>-<flags>`.
//!     client.put_snapshot(&key, token, "state", &PutOptions::default()).await
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```
//!
//! Outside any scope no `traceparent` is sent (with the `opentelemetry` feature, the current
//! OpenTelemetry span's context is sent instead, if there is one: [`TraceContext::current`]), and
//! each request's server span starts a trace of its own.
//!
//! What a call starts that outlives it keeps the context current when it started: a [`Watch`]
//! reconnects in the trace it was opened in, wherever it is polled, and a [`LeaseKeeper`]
//! (also the one behind an [`Election`]'s [`Leadership`]) renews, and releases when dropped, in
//! the trace it was started in. The context is a task-local value: a task spawned inside the
//! scope does not inherit it (run its future in a `scope` of its own).
//!
//! [`Watch`]: crate::Watch
//! [`LeaseKeeper`]: crate::LeaseKeeper
//! [`Election`]: crate::Election
//! [`Leadership`]: crate::Leadership

use std::fmt;
use std::str::FromStr;

use reqwest::RequestBuilder;
use reqwest::header::HeaderValue;

use crate::{Error, Result};

/// The W3C header that carries the caller's trace id, span id and flags.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header that carries vendors' trace data alongside [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

/// The longest `traceparent` an error message quotes.
const QUOTED: usize = 80;
/// The most members a `tracestate` may have (W3C).
const MAX_MEMBERS: usize = 32;

tokio::task_local! {
    /// The context of the enclosing [`scope`]; `None` for a scope that sends none.
    static CURRENT: Option<TraceContext>;
}

/// A caller's W3C trace context: its `traceparent` (trace id, the caller's span id and the trace
/// flags), and a `tracestate` if it has one. Cheap to clone.
///
/// Made by [`parse`](Self::parse) from a `traceparent` header's value, which must be well formed
/// (see there), so that only a valid context ever reaches the wire.
#[derive(Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The `traceparent` as sent: version `00`, 55 characters.
    traceparent: HeaderValue,
    tracestate: Option<HeaderValue>,
}

impl TraceContext {
    /// Reads a `traceparent` value as W3C Trace Context defines it:
    /// `version-traceid-parentid-flags`, each field lowercase hex of 2, 32, 16 and 2 digits,
    /// neither id all zeros, version `ff` invalid. Version `00` is exactly that; a higher version
    /// may carry more fields after a further `-`, and its trace id, span id and sampled flag are
    /// taken and sent as version `00`, as W3C asks of a parser that knows only `00`.
    ///
    /// A malformed value is [`Error::InvalidRequest`], nothing else: no request is made. W3C asks
    /// a receiver of an invalid `traceparent` to start a new trace, so a service forwarding its
    /// own callers' headers usually ignores the error and sends no context:
    /// `trace::scope(TraceContext::parse(header).ok(), call)`.
    pub fn parse(traceparent: &str) -> Result<Self> {
        let fields = Fields::parse(traceparent.as_bytes()).map_err(|why| {
            let quoted: String = traceparent.chars().take(QUOTED).collect();
            let more = if quoted.len() < traceparent.len() {
                "…"
            } else {
                ""
            };
            Error::invalid(format!(
                "traceparent {quoted:?}{more} is not a W3C trace context: {why}; expected \
                 00-<32 lowercase hex digits>-<16 lowercase hex digits>-<2 lowercase hex digits>, \
                 neither id all zeros"
            ))
        })?;
        Ok(Self::from_fields(&fields))
    }

    fn from_fields(fields: &Fields<'_>) -> Self {
        let rendered = format!(
            "00-{}-{}-{:02x}",
            fields.trace_id, fields.span_id, fields.flags
        );
        Self {
            traceparent: HeaderValue::from_str(&rendered).expect("hex digits and dashes"),
            tracestate: None,
        }
    }

    /// The same context with the caller's `tracestate` (the header's value, list members
    /// separated by commas). A `tracestate` that is not valid W3C (more than 32 members, a
    /// member that is not `key=value` with a key and value as W3C spells them, a key given
    /// twice) is discarded, as W3C asks of a receiver, and the context goes without one; so is
    /// an empty one. [`tracestate`](Self::tracestate) says what is kept.
    #[must_use]
    pub fn with_tracestate(mut self, tracestate: &str) -> Self {
        self.tracestate = valid_tracestate(tracestate)
            .and_then(|list| HeaderValue::from_str(&list).ok())
            .or_else(|| {
                if !tracestate.trim().is_empty() {
                    tracing::debug!(
                        tracestate,
                        "discarding a tracestate that is not valid W3C trace context"
                    );
                }
                None
            });
        self
    }

    /// The `traceparent` header's value as sent: `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> &str {
        self.traceparent.to_str().expect("ASCII")
    }

    /// The `tracestate` header's value as sent, if any.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate
            .as_ref()
            .map(|v| v.to_str().expect("printable ASCII"))
    }

    /// The trace id: 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent()[3..35]
    }

    /// The caller's span id, the parent of the server's spans: 16 lowercase hex digits.
    pub fn span_id(&self) -> &str {
        &self.traceparent()[36..52]
    }

    /// Whether the caller's trace is sampled (its flags' low bit): the server records the
    /// request's span only then.
    pub fn is_sampled(&self) -> bool {
        let flags = u8::from_str_radix(&self.traceparent()[53..55], 16).expect("hex digits");
        flags & 1 == 1
    }

    /// The context a request sent now carries: the one of the innermost [`scope`] (`None` in a
    /// scope of `None`); outside any scope, with the `opentelemetry` feature, the current
    /// OpenTelemetry context's span, if valid (`TraceContext::from_otel`); else `None`.
    pub fn current() -> Option<Self> {
        match CURRENT.try_with(Clone::clone) {
            Ok(scoped) => scoped,
            Err(_) => Self::ambient(),
        }
    }

    #[cfg(not(feature = "opentelemetry"))]
    fn ambient() -> Option<Self> {
        None
    }

    #[cfg(feature = "opentelemetry")]
    fn ambient() -> Option<Self> {
        Self::from_otel(&opentelemetry::Context::current())
    }

    /// The context of `cx`'s span as the W3C propagator of OpenTelemetry would inject it
    /// (version `00`, the sampled flag only, its trace state); `None` when it has no valid span.
    /// With `tracing-opentelemetry`, the context of a `tracing` span is
    /// `tracing::Span::current().context()` (`OpenTelemetrySpanExt`).
    #[cfg(feature = "opentelemetry")]
    pub fn from_otel(cx: &opentelemetry::Context) -> Option<Self> {
        use opentelemetry::trace::{TraceContextExt, TraceFlags};

        let span = cx.span();
        let context = span.span_context();
        if !context.is_valid() {
            return None;
        }
        let trace_id = format!("{:032x}", context.trace_id());
        let span_id = format!("{:016x}", context.span_id());
        let fields = Fields {
            trace_id: &trace_id,
            span_id: &span_id,
            flags: (context.trace_flags() & TraceFlags::SAMPLED).to_u8(),
        };
        Some(Self::from_fields(&fields).with_tracestate(&context.trace_state().header()))
    }

    /// Adds the context's headers to a request.
    pub(crate) fn apply(&self, request: RequestBuilder) -> RequestBuilder {
        let request = request.header(TRACEPARENT, self.traceparent.clone());
        match &self.tracestate {
            Some(state) => request.header(TRACESTATE, state.clone()),
            None => request,
        }
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.traceparent())
            .field("tracestate", &self.tracestate())
            .finish()
    }
}

/// The `traceparent` value.
impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.traceparent())
    }
}

/// [`TraceContext::parse`].
impl FromStr for TraceContext {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// Runs `calls` with `context` as the trace context of every request they make (see the
/// [module](self)); `None` sends none, also where an outer scope or OpenTelemetry has one.
/// Scopes nest: the innermost wins.
pub fn scope<F: Future>(
    context: impl Into<Option<TraceContext>>,
    calls: F,
) -> impl Future<Output = F::Output> {
    CURRENT.scope(context.into(), calls)
}

/// The fields of a valid `traceparent`.
struct Fields<'a> {
    trace_id: &'a str,
    span_id: &'a str,
    flags: u8,
}

impl<'a> Fields<'a> {
    fn parse(value: &'a [u8]) -> std::result::Result<Self, &'static str> {
        const LEN: usize = 55;
        if value.len() < LEN {
            return Err("too short");
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return Err("its fields are not separated by '-' where they should be");
        }
        let version = hex(&value[0..2]).ok_or("the version is not 2 lowercase hex digits")?;
        let trace_id = hex_text(&value[3..35]).ok_or("the trace id is not lowercase hex")?;
        let span_id = hex_text(&value[36..52]).ok_or("the parent id is not lowercase hex")?;
        let flags = hex(&value[53..55]).ok_or("the flags are not 2 lowercase hex digits")?;
        if version == 0xff {
            return Err("version ff is invalid");
        }
        if version == 0 && value.len() != LEN {
            return Err("version 00 has exactly 4 fields");
        }
        if value.len() > LEN && value[LEN] != b'-' {
            return Err("the flags are not 2 lowercase hex digits");
        }
        if trace_id.bytes().all(|b| b == b'0') {
            return Err("the trace id is all zeros");
        }
        if span_id.bytes().all(|b| b == b'0') {
            return Err("the parent id is all zeros");
        }
        Ok(Self {
            trace_id,
            span_id,
            // Of a later version only the sampled flag is known.
            flags: if version == 0 { flags } else { flags & 1 },
        })
    }
}

/// Lowercase hex digits, as text.
fn hex_text(digits: &[u8]) -> Option<&str> {
    digits
        .iter()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        .then(|| std::str::from_utf8(digits).expect("ASCII"))
}

/// Two lowercase hex digits, as a byte.
fn hex(digits: &[u8]) -> Option<u8> {
    u8::from_str_radix(hex_text(digits)?, 16).ok()
}

/// A W3C `tracestate` with its empty members and optional whitespace left out; `None` when it
/// is invalid or holds no member.
fn valid_tracestate(value: &str) -> Option<String> {
    let members: Vec<&str> = value
        .split(',')
        .map(|m| m.trim_matches([' ', '\t']))
        .filter(|m| !m.is_empty())
        .collect();
    if members.is_empty() || members.len() > MAX_MEMBERS {
        return None;
    }
    let mut keys = Vec::with_capacity(members.len());
    for member in &members {
        let (key, value) = member.split_once('=')?;
        if !valid_key(key) || !valid_value(value) || keys.contains(&key) {
            return None;
        }
        keys.push(key);
    }
    Some(members.join(","))
}

/// `lcalpha 0*255(lcalpha / DIGIT / "_" / "-" / "*" / "/")`, or
/// `tenant@system` with a tenant of up to 241 and a system of up to 14 such characters, the
/// tenant starting with a letter or digit and the system with a letter.
fn valid_key(key: &str) -> bool {
    let rest = |s: &[u8]| {
        s.iter()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/'))
    };
    match key.split_once('@') {
        None => {
            let b = key.as_bytes();
            (1..=256).contains(&b.len()) && b[0].is_ascii_lowercase() && rest(&b[1..])
        }
        Some((tenant, system)) => {
            let (t, s) = (tenant.as_bytes(), system.as_bytes());
            (1..=241).contains(&t.len())
                && (t[0].is_ascii_lowercase() || t[0].is_ascii_digit())
                && rest(&t[1..])
                && (1..=14).contains(&s.len())
                && s[0].is_ascii_lowercase()
                && rest(&s[1..])
        }
    }
}

/// Up to 256 printable ASCII characters but `,` and `=`, the last not a space.
fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    (1..=256).contains(&b.len())
        && b.iter()
            .all(|&c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
        && b[b.len() - 1] != b' '
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    fn parent(flags: &str) -> String {
        format!("00-{TRACE}-{SPAN}-{flags}")
    }

    #[test]
    fn a_version_00_traceparent_is_sent_as_given() {
        let context = TraceContext::parse(&parent("01")).unwrap();
        assert_eq!(context.traceparent(), parent("01"));
        assert_eq!(context.trace_id(), TRACE);
        assert_eq!(context.span_id(), SPAN);
        assert!(context.is_sampled());
        assert_eq!(context.tracestate(), None);
        assert_eq!(context.to_string(), parent("01"));
        assert_eq!(parent("01").parse::<TraceContext>().unwrap(), context);

        let unsampled = TraceContext::parse(&parent("00")).unwrap();
        assert!(!unsampled.is_sampled());
        // Flags this client does not know are the caller's: passed on.
        assert_eq!(
            TraceContext::parse(&parent("02")).unwrap().traceparent(),
            parent("02")
        );
    }

    #[test]
    fn a_later_versions_ids_and_sampled_flag_are_sent_as_version_00() {
        let later = format!("cc-{TRACE}-{SPAN}-03-what-comes-next");
        assert_eq!(
            TraceContext::parse(&later).unwrap().traceparent(),
            parent("01")
        );
        let exact = format!("01-{TRACE}-{SPAN}-02");
        assert_eq!(
            TraceContext::parse(&exact).unwrap().traceparent(),
            parent("00")
        );
    }

    #[test]
    fn a_malformed_traceparent_is_an_invalid_request() {
        let upper_trace = format!("00-{}-{SPAN}-01", TRACE.to_uppercase());
        let cases = [
            (String::new(), "too short"),
            (parent("1"), "too short"),
            (format!("{}-", parent("01")), "exactly 4 fields"),
            (format!("{}-00", parent("01")), "exactly 4 fields"),
            (format!("ff-{TRACE}-{SPAN}-01"), "version ff"),
            (format!("0g-{TRACE}-{SPAN}-01"), "version is not"),
            (format!("0A-{TRACE}-{SPAN}-01"), "version is not"),
            (upper_trace, "trace id is not"),
            (
                format!("00-{TRACE}-{}-01", SPAN.replace('f', "F")),
                "parent id is not",
            ),
            (parent("0X"), "flags are not"),
            (
                format!("00-{}-{SPAN}-01", "0".repeat(32)),
                "trace id is all zeros",
            ),
            (
                format!("00-{TRACE}-{}-01", "0".repeat(16)),
                "parent id is all zeros",
            ),
            (format!("00_{TRACE}-{SPAN}-01"), "separated"),
            (format!("00-{TRACE}_{SPAN}-01"), "separated"),
            (format!("01-{TRACE}-{SPAN}-01x"), "flags are not"),
            (format!(" {}", parent("01")), "separated"),
        ];
        for (value, why) in cases {
            match TraceContext::parse(&value) {
                Err(Error::InvalidRequest { detail }) => {
                    assert!(detail.contains(why), "{value:?}: {detail}");
                }
                other => panic!("{value:?}: {other:?}"),
            }
        }
        let long = format!("00-{}", "a".repeat(200));
        let Err(Error::InvalidRequest { detail }) = TraceContext::parse(&long) else {
            panic!("a long value is refused");
        };
        assert!(detail.len() < 300, "{detail}");
    }

    #[test]
    fn a_valid_tracestate_is_kept_and_an_invalid_one_discarded() {
        let context = TraceContext::parse(&parent("01")).unwrap();
        let with = |state: &str| context.clone().with_tracestate(state);
        assert_eq!(
            with("congo=t61rcWkgMzE, rojo=00f067aa0ba902b7").tracestate(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        assert_eq!(
            with(" ,tenant1@vendor=a b c,, x/y*_-z=v").tracestate(),
            Some("tenant1@vendor=a b c,x/y*_-z=v")
        );
        let full: Vec<String> = (0..32).map(|i| format!("k{i}=v")).collect();
        assert!(with(&full.join(",")).tracestate().is_some());
        let over: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        for invalid in [
            "",
            " , ",
            "novalue",
            "Upper=v",
            "1key=v",
            "k=",
            "k=a,b",
            "k=v=w",
            "k=a\tb",
            "k=caf\u{e9}",
            "k=v,k=w",
            "@vendor=v",
            "t@=v",
            "t@1vendor=v",
            "t@vendorvendorvend=v",
            &over.join(","),
        ] {
            assert_eq!(with(invalid).tracestate(), None, "{invalid:?}");
            assert_eq!(with(invalid).traceparent(), parent("01"));
        }
    }

    #[tokio::test]
    async fn the_innermost_scope_is_current_and_none_outside() {
        let outer = TraceContext::parse(&parent("01")).unwrap();
        let inner = TraceContext::parse(&format!("00-{TRACE}-{}-01", "1".repeat(16))).unwrap();
        assert_eq!(TraceContext::current(), None);
        scope(outer.clone(), async {
            assert_eq!(TraceContext::current(), Some(outer.clone()));
            scope(inner.clone(), async {
                assert_eq!(TraceContext::current(), Some(inner.clone()));
            })
            .await;
            scope(None, async {
                assert_eq!(TraceContext::current(), None);
            })
            .await;
            assert_eq!(TraceContext::current(), Some(outer.clone()));
            // A spawned task does not inherit it.
            let spawned = tokio::spawn(async { TraceContext::current() });
            assert_eq!(spawned.await.unwrap(), None);
        })
        .await;
        assert_eq!(TraceContext::current(), None);
    }

    /// A server on loopback that answers each request with the next of `statuses`, then `204`,
    /// each on a connection of its own; and the heads of the requests it got, lowercased.
    async fn recording_server(
        statuses: &'static [u16],
    ) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorded = heads.clone();
        tokio::spawn(async move {
            for n in 0.. {
                let (mut conn, _) = listener.accept().await.unwrap();
                let mut head = Vec::new();
                let mut buf = [0; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    let read = conn.read(&mut buf).await.unwrap();
                    assert!(read > 0, "the request ended before its head did");
                    head.extend_from_slice(&buf[..read]);
                }
                recorded
                    .lock()
                    .unwrap()
                    .push(String::from_utf8(head).unwrap().to_lowercase());
                let status = statuses.get(n).copied().unwrap_or(204);
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                conn.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        (base, heads)
    }

    #[tokio::test]
    async fn every_attempt_of_a_call_in_a_scope_carries_its_context_and_none_outside() {
        let (base, heads) = recording_server(&[503]).await;
        let client = crate::Client::builder(base)
            .retry(crate::RetryPolicy {
                max_attempts: 3,
                initial_backoff: std::time::Duration::from_millis(1),
                max_backoff: std::time::Duration::from_millis(1),
            })
            .build()
            .unwrap();
        let key = snapfence_types::Key::parse("jobs/1").unwrap();
        let token = snapfence_types::FencingToken::new(7).unwrap();
        let context = TraceContext::parse(&parent("01"))
            .unwrap()
            .with_tracestate("vendor=value");
        scope(context, client.release(&key, token)).await.unwrap();
        client.release(&key, token).await.unwrap();

        let heads = heads.lock().unwrap().clone();
        assert_eq!(
            heads.len(),
            3,
            "a refused attempt, its retry, a call outside: {heads:?}"
        );
        for head in &heads[..2] {
            assert!(head.starts_with("delete /v1/leases/jobs%2f1 "), "{head}");
            assert!(
                head.contains(&format!("\r\ntraceparent: {}\r\n", parent("01"))),
                "{head}"
            );
            assert!(head.contains("\r\ntracestate: vendor=value\r\n"), "{head}");
        }
        assert!(!heads[2].contains("traceparent"), "{}", heads[2]);
        assert!(!heads[2].contains("tracestate"), "{}", heads[2]);
    }

    #[cfg(feature = "opentelemetry")]
    #[test]
    fn the_current_opentelemetry_span_is_sent_outside_any_scope() {
        use opentelemetry::trace::{
            SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
        };

        let state = TraceState::from_key_value([("vendor", "value")]).unwrap();
        let span = SpanContext::new(
            TraceId::from_hex(TRACE).unwrap(),
            SpanId::from_hex(SPAN).unwrap(),
            TraceFlags::SAMPLED,
            true,
            state,
        );
        assert_eq!(TraceContext::current(), None);
        let _attached = opentelemetry::Context::new()
            .with_remote_span_context(span)
            .attach();
        let current = TraceContext::current().expect("the attached span's context");
        assert_eq!(current.traceparent(), parent("01"));
        assert_eq!(current.tracestate(), Some("vendor=value"));
        // An explicit scope wins, a scope of `None` included.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let other = TraceContext::parse(&format!("00-{TRACE}-{}-00", "2".repeat(16))).unwrap();
        let scoped = runtime.block_on(scope(other.clone(), async { TraceContext::current() }));
        assert_eq!(scoped, Some(other));
        let none = runtime.block_on(scope(None, async { TraceContext::current() }));
        assert_eq!(none, None);
    }

    #[cfg(feature = "opentelemetry")]
    #[test]
    fn an_opentelemetry_context_without_a_valid_span_sends_nothing() {
        assert_eq!(
            TraceContext::from_otel(&opentelemetry::Context::new()),
            None
        );
    }
}
