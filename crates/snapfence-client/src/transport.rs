//! One call on the wire: attempts, retries, answers read whole, and the path segment of a key.

use std::fmt;

use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;
use snapfence_types::Key;
use snapfence_types::headers::IDEMPOTENCY_KEY;

use crate::retry::{CallKind, OnRetry};
use crate::trace::TraceContext;
use crate::{Client, Error, Result};

/// A buffered answer: every answer of the contract is small except snapshot bodies, which the
/// server bounds, so reading the body within the attempt lets a read that breaks halfway be
/// retried like any other failed attempt.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// A request as messages name it: `GET /v1/leases/jobs%2F42`.
pub(crate) struct Call<'a> {
    pub(crate) method: Method,
    pub(crate) path: &'a str,
}

impl fmt::Display for Call<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

impl Client {
    /// The one place a request is begun, on `http` (the calls' connections, or the watches'):
    /// `method` on `path` under the base URL, with the caller's trace context `trace` (the
    /// [`TraceContext::current`] of the call, or the one a watch or keeper kept).
    pub(crate) fn begin(
        &self,
        http: &reqwest::Client,
        method: Method,
        path: &str,
        trace: Option<&TraceContext>,
    ) -> RequestBuilder {
        let request = http.request(method, format!("{}{path}", self.base));
        match trace {
            Some(trace) => trace.apply(request),
            None => request,
        }
    }

    /// Sends a request, retrying the attempts that `kind` allows, and returns the answer when
    /// its status is one of `ok`; any other status becomes its [`Error`]. A change carries a
    /// fresh `Idempotency-Key`, the same on every attempt, and every attempt the caller's trace
    /// context as it was when the call began.
    pub(crate) async fn send(
        &self,
        kind: CallKind,
        call: Call<'_>,
        ok: &[StatusCode],
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<Answer> {
        let trace = TraceContext::current();
        let idempotency_key = (kind == CallKind::Change).then(|| uuid::Uuid::new_v4().to_string());
        let mut attempt = 1;
        // Whether an earlier attempt of this change may have taken effect: then an answer that
        // says "nothing changed" speaks for its own attempt only, not for the call.
        let mut earlier_unknown = false;
        loop {
            let begun = self.begin(&self.http, call.method.clone(), call.path, trace.as_ref());
            let mut request = build(begun);
            if let Some(key) = &idempotency_key {
                request = request.header(IDEMPOTENCY_KEY, key);
            }
            let error = match attempt_once(request).await {
                Ok(answer) if ok.contains(&answer.status) => return Ok(answer),
                Ok(answer) => {
                    Error::from_answer(answer.status, &answer.headers, &answer.body, &call)
                }
                Err(e) => Error::transport(e),
            };
            if attempt >= self.retry.max_attempts || !kind.may_retry(&error) {
                return Err(if earlier_unknown {
                    error.after_unknown_attempt(&call)
                } else {
                    error
                });
            }
            earlier_unknown |= kind == CallKind::Change
                && (error.is_indeterminate() || matches!(error, Error::RequestInProgress { .. }));
            self.pause_before_retry(&call, &error, attempt).await;
            attempt += 1;
        }
    }

    /// Waits before retry `attempt` (1-based) of `call`, which failed with `error`, and tells
    /// the [`on_retry`](crate::ClientBuilder::on_retry) hook how long.
    pub(crate) async fn pause_before_retry(&self, call: &Call<'_>, error: &Error, attempt: u32) {
        // A server that said when to come back is believed, over the backoff.
        let pause = error.retry_after().map_or_else(
            || self.retry.backoff(attempt),
            |asked| asked.max(self.retry.backoff(attempt)),
        );
        tracing::debug!(%call, attempt, error = %error, ?pause, "retrying");
        if let Some(OnRetry(f)) = &self.on_retry {
            f(error, pause);
        }
        tokio::time::sleep(pause).await;
    }

    /// [`send`](Self::send), then the answer's JSON body as `T`.
    pub(crate) async fn send_json<T: DeserializeOwned>(
        &self,
        kind: CallKind,
        call: Call<'_>,
        ok: &[StatusCode],
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<T> {
        let what = call.to_string();
        let answer = self.send(kind, call, ok, build).await?;
        serde_json::from_slice(&answer.body).map_err(|e| Error::Protocol {
            detail: format!("the answer to {what} is not the contract's JSON: {e}"),
        })
    }

    /// A `GET` of `path`, retried as reads are, and its JSON body as `T`.
    pub(crate) async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<T> {
        self.send_json(
            CallKind::Read,
            Call {
                method: Method::GET,
                path,
            },
            &[StatusCode::OK],
            build,
        )
        .await
    }
}

/// One attempt, the body read to its end.
async fn attempt_once(request: RequestBuilder) -> reqwest::Result<Answer> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
}

/// A key as one path segment ([`Key::to_segment`]). `.` and `..` are refused: URL parsers (WHATWG, and so reqwest) resolve them as dot segments,
/// also when percent-encoded, so no URL can name such a key.
pub(crate) fn segment(key: &Key) -> Result<String> {
    if matches!(key.as_str(), "." | "..") {
        return Err(Error::invalid(format!(
            "key {key:?} cannot be sent in a URL path, where it means a directory; choose another key"
        )));
    }
    Ok(key.to_segment())
}

/// The text of header `name` of an answer that must carry it.
pub(crate) fn header_text<'a>(answer: &'a Answer, name: &str, path: &str) -> Result<&'a str> {
    answer
        .headers
        .get(name)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .ok_or_else(|| Error::Protocol {
            detail: format!("the answer to {path} has no valid {name} header"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_percent_encoded_segment() {
        let key = |s: &str| Key::parse(s).unwrap();
        assert_eq!(segment(&key("jobs/42")).unwrap(), "jobs%2F42");
        assert_eq!(segment(&key("a b%é")).unwrap(), "a%20b%25%C3%A9");
        assert_eq!(segment(&key("v1.2~x_y-z")).unwrap(), "v1.2~x_y-z");
        assert_eq!(segment(&key("...")).unwrap(), "...");
        assert!(segment(&key(".")).is_err());
        assert!(segment(&key("..")).is_err());
    }
}
