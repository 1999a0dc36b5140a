//! `GET /v1/watch`: the changes to keys as a stream that outlives its connections.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt, stream};
use reqwest::{Method, StatusCode, header};
use snapfence_types::headers::{LAST_EVENT_ID, WATCH_AFTER};
use snapfence_types::{ChangeData, ChangeEvent, ChangeId, ChangeKind, KeyPrefix};

use crate::trace::TraceContext;
use crate::transport::Call;
use crate::{Client, Error, Result};

/// What a watch follows ([`Client::watch`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// Only the keys that start with this; every key when `None`. An API key scoped to a
    /// prefix may watch only within it.
    pub prefix: Option<KeyPrefix>,
    /// Deliver the changes after this one (e.g. the `id` of the last event a previous watch
    /// gave you; [`ChangeId::ORIGIN`] for the oldest retained change). `None`: the changes from
    /// the moment the watch first connects.
    pub since: Option<ChangeId>,
}

impl WatchOptions {
    /// Every key, from now on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only the keys that start with `prefix`.
    pub fn prefix(mut self, prefix: KeyPrefix) -> Self {
        self.prefix = Some(prefix);
        self
    }

    /// The changes after `since`.
    pub fn since(mut self, since: ChangeId) -> Self {
        self.since = Some(since);
        self
    }
}

/// The changes a [`Client::watch`] delivers, in id order, each once: a [`Stream`] of
/// `Result<ChangeEvent, Error>` that ends only after an error (the last item) or when dropped.
pub struct Watch {
    inner: Pin<Box<dyn Stream<Item = Result<ChangeEvent>> + Send>>,
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Watch(..)")
    }
}

impl Stream for Watch {
    type Item = Result<ChangeEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl Watch {
    /// The next change, or the error that ended the watch; `None` after that error. The same
    /// as `StreamExt::next`, without importing a stream trait.
    pub async fn next(&mut self) -> Option<Result<ChangeEvent>> {
        StreamExt::next(self).await
    }
}

impl Client {
    /// `GET /v1/watch`: the changes to the keys under [`WatchOptions::prefix`], as they
    /// commit, in id order, each once.
    ///
    /// The watch outlives its connections. When the server ends a stream (it does after its
    /// `--max-watch`, and when it shuts down) the watch reconnects at once; when a connection
    /// breaks or goes silent for longer than [`ClientBuilder::watch_idle_timeout`](crate::ClientBuilder::watch_idle_timeout),
    /// it reconnects after the [`RetryPolicy`](crate::RetryPolicy)'s backoff. Either way it
    /// sends the id of the last event it received as `Last-Event-ID`, and the server resumes
    /// after it: nothing is missed and nothing comes twice. Before the first event it sends the
    /// id the server said the stream starts after (the `Watch-After` header), so a watch
    /// without [`WatchOptions::since`] that is cut off at once misses nothing either.
    ///
    /// It ends with an error, as its last item, when:
    /// - resuming is impossible: [`Error::Compacted`] (the id is older than the retained
    ///   history; read the state again and start a new watch without `since`);
    /// - the server refuses it: [`Error::Unauthorized`], [`Error::Forbidden`] (a prefix outside
    ///   the API key's), [`Error::InvalidRequest`] (also a `since` above the newest change id);
    /// - the API key is revoked while the watch is open: the server ends the stream with a
    ///   `revoked` event and the watch ends with [`Error::Unauthorized`], without reconnecting;
    /// - [`RetryPolicy::max_attempts`](crate::RetryPolicy::max_attempts) attempts in a row fail
    ///   to connect (the last failure);
    /// - an event cannot be read ([`Error::Protocol`]).
    ///
    /// Events of kinds this client does not know (a newer server's) are skipped.
    ///
    /// Every connection carries the trace context current when the watch was made
    /// ([`trace`](crate::trace)), wherever the watch is polled.
    pub fn watch(&self, options: &WatchOptions) -> Watch {
        let follow = Follow {
            client: self.clone(),
            trace: TraceContext::current(),
            prefix: options.prefix.clone(),
            since: options.since,
            last: None,
            open: None,
            failures: 0,
            delivered: false,
            ended: false,
        };
        let changes = stream::unfold(follow, |mut follow| async move {
            let item = follow.next().await?;
            Some((item, follow))
        });
        Watch {
            inner: Box::pin(changes),
        }
    }
}

/// The events of one connection.
type Events = Pin<
    Box<
        dyn Stream<
                Item = std::result::Result<
                    eventsource_stream::Event,
                    EventStreamError<reqwest::Error>,
                >,
            > + Send,
    >,
>;

/// A watch's state between its items.
struct Follow {
    client: Client,
    /// The trace context of the call that made the watch, sent on every connection.
    trace: Option<TraceContext>,
    prefix: Option<KeyPrefix>,
    /// Where the caller asked to start.
    since: Option<ChangeId>,
    /// The id of the last event received: where the next connection resumes.
    last: Option<ChangeId>,
    open: Option<Events>,
    /// Failed attempts since a connection last opened.
    failures: u32,
    /// Whether the open connection has delivered an event.
    delivered: bool,
    ended: bool,
}

/// The event that ends a stream whose API key was revoked (no change: it has no id); its data
/// is the `401 unauthorized` problem.
const REVOKED: &str = "revoked";

/// How the watch names its request in messages.
const CALL: Call<'static> = Call {
    method: Method::GET,
    path: "/v1/watch",
};

impl Follow {
    /// The next change, or the error that ends the watch; `None` once it has ended.
    async fn next(&mut self) -> Option<Result<ChangeEvent>> {
        while !self.ended {
            if self.open.is_none() {
                match connect(&self.client, self.trace.as_ref(), &self.resume()).await {
                    Ok((after, events)) => {
                        // Before its first event, a watch resumes from where the server said
                        // its stream starts, so a cut then misses nothing either.
                        self.last = self.last.or(after);
                        self.open = Some(events);
                        self.failures = 0;
                        self.delivered = false;
                    }
                    Err(e) => {
                        if let Err(e) = self.retry(e).await {
                            return self.end(e);
                        }
                    }
                }
                continue;
            }
            let events = self.open.as_mut().expect("a connection is open");
            match events.next().await {
                Some(Ok(event)) if event.event == REVOKED => {
                    // The server ended the stream because the API key was revoked: resuming
                    // with it would be refused, so the watch ends here, with the refusal.
                    self.open = None;
                    let mut headers = header::HeaderMap::new();
                    headers.insert(
                        header::CONTENT_TYPE,
                        header::HeaderValue::from_static("application/problem+json"),
                    );
                    let error = Error::from_answer(
                        StatusCode::UNAUTHORIZED,
                        &headers,
                        event.data.as_bytes(),
                        &CALL,
                    );
                    return self.end(error);
                }
                Some(Ok(event)) => {
                    self.delivered = true;
                    match self.change(event) {
                        Ok(Some(change)) => return Some(Ok(change)),
                        Ok(None) => {}
                        Err(e) => return self.end(e),
                    }
                }
                Some(Err(e)) => {
                    self.open = None;
                    let e = match e {
                        EventStreamError::Transport(e) => Error::transport(e),
                        unreadable => Error::Protocol {
                            detail: format!(
                                "the watch's event stream is not readable: {unreadable}"
                            ),
                        },
                    };
                    if let Err(e) = self.retry(e).await {
                        return self.end(e);
                    }
                }
                None => {
                    self.open = None;
                    // The server ends streams now and then, and the watch goes on at once; but
                    // one that ends them before sending anything must not be asked in a loop.
                    if !self.delivered {
                        tokio::time::sleep(self.client.retry.backoff(1)).await;
                    }
                }
            }
        }
        None
    }

    /// Where the next connection resumes.
    fn resume(&self) -> Resume {
        Resume {
            prefix: self.prefix.clone(),
            since: self.since,
            last: self.last,
        }
    }

    /// The change an event stands for; `None` for a kind this client does not know, which is
    /// passed over (its id still counts, so that a resumed watch does not send it again).
    fn change(&mut self, event: eventsource_stream::Event) -> Result<Option<ChangeEvent>> {
        let id = ChangeId::parse(&event.id).map_err(|e| Error::Protocol {
            detail: format!("a watch event without a change id the watch could resume from: {e}"),
        })?;
        self.last = Some(id);
        let Some(kind) = ChangeKind::parse(&event.event) else {
            tracing::debug!(%id, kind = %event.event, "skipping a change of a kind this client does not know");
            return Ok(None);
        };
        let data: ChangeData = serde_json::from_str(&event.data).map_err(|e| Error::Protocol {
            detail: format!("the data of change {id} ({kind}) is not the contract's JSON: {e}"),
        })?;
        Ok(Some(ChangeEvent {
            id,
            event: kind,
            data,
        }))
    }

    /// After a failed attempt: waits before the next one, or gives the failure back when it
    /// ends the watch (it will not pass by itself, or too many attempts failed in a row).
    async fn retry(&mut self, error: Error) -> Result<()> {
        self.failures += 1;
        if !error.is_transient() || self.failures >= self.client.retry.max_attempts {
            return Err(error);
        }
        self.client
            .pause_before_retry(&CALL, &error, self.failures)
            .await;
        Ok(())
    }

    /// Ends the watch with `error` as its last item.
    fn end(&mut self, error: Error) -> Option<Result<ChangeEvent>> {
        self.ended = true;
        Some(Err(error))
    }
}

/// What a connection asks for.
struct Resume {
    prefix: Option<KeyPrefix>,
    since: Option<ChangeId>,
    last: Option<ChangeId>,
}

/// Opens a connection that resumes after the last event received; with the change id its
/// stream starts after (`Watch-After`), when the server says it. A function, not a method of
/// [`Follow`]: a borrow of it held while the request waits would need its open connection to be
/// `Sync`, which the byte stream is not.
async fn connect(
    client: &Client,
    trace: Option<&TraceContext>,
    resume: &Resume,
) -> Result<(Option<ChangeId>, Events)> {
    let mut request = client
        .begin(&client.watch_http, CALL.method, CALL.path, trace)
        .header(header::ACCEPT, "text/event-stream");
    // The same URL every time, as an EventSource sends it; the header, which the server
    // prefers, says how far the watch got.
    let mut query = Vec::new();
    if let Some(prefix) = &resume.prefix {
        query.push(("prefix", prefix.as_str().to_owned()));
    }
    if let Some(since) = resume.since {
        query.push(("since", since.to_string()));
    }
    request = request.query(&query);
    if let Some(last) = resume.last {
        request = request.header(LAST_EVENT_ID, last.to_string());
    }
    let response = request.send().await.map_err(Error::transport)?;
    let status = response.status();
    if status != StatusCode::OK {
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(Error::transport)?;
        return Err(Error::from_answer(status, &headers, &body, &CALL));
    }
    let is_events = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    if !is_events {
        return Err(Error::Protocol {
            detail: format!("the answer to {CALL} is not text/event-stream"),
        });
    }
    let after = response
        .headers()
        .get(WATCH_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| ChangeId::parse(v).ok());
    Ok((after, Box::pin(response.bytes_stream().eventsource())))
}
