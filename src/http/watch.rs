//! `/v1/watch`: changes as server-sent events, resumed with `Last-Event-ID`; see
//! [`crate::store::watch`].

use std::convert::Infallible;

use std::future::Future;
use std::pin::Pin;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{Stream, StreamExt, stream};
use serde::Deserialize;

use super::Routes;
use super::error::ApiError;
use super::extract::ApiQuery;
use super::limits::HeldAdmission;
use crate::domain::headers::{LAST_EVENT_ID, WATCH_AFTER};
use crate::domain::{ChangeId, KeyPrefix, Principal};
use crate::http::AppState;
use crate::store::watch::{Opened, Watch};

pub(super) fn routes() -> Routes {
    Routes::new().route("/v1/watch", get(watch))
}

/// The query of a watch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchParams {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    since: Option<String>,
}

/// The block ending a stream whose key was revoked: no `id:`, so the last id stays the last
/// change's; its `data:` is the `401` problem.
pub const REVOKED_EVENT: &str = "revoked";

type Revoked = Pin<Box<dyn Future<Output = ()> + Send>>;

async fn watch(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
    held: Option<Extension<HeldAdmission>>,
    headers: HeaderMap,
    ApiQuery(params): ApiQuery<WatchParams>,
) -> Result<Response, ApiError> {
    let prefix = KeyPrefix::parse(params.prefix.unwrap_or_default())?;
    // A reconnecting EventSource sends its first URL's `since` and a newer `Last-Event-ID`.
    let since = params.since.as_deref().map(ChangeId::parse).transpose()?;
    let last_event_id = axum::http::HeaderName::from_static(LAST_EVENT_ID);
    let last = super::extract::single_header(&headers, &last_event_id)?
        .map(ChangeId::parse)
        .transpose()?;
    let since = last.or(since);
    let streaming = state
        .limits
        .admit_watch(principal.as_ref().map(|Extension(p)| p.name.as_str()))
        .map_err(ApiError::TooManyRequests)?;
    let in_flight = held.and_then(|Extension(held)| held.take());
    let watch = match state.changes.watch(&prefix, since).await? {
        Opened::Watching(watch) => watch,
        Opened::Compacted { horizon } => {
            return Err(ApiError::Compacted {
                since: since.unwrap_or(ChangeId::ORIGIN),
                horizon,
            });
        }
        Opened::Future { newest } => {
            let asked = since.unwrap_or(ChangeId::ORIGIN);
            return Err(ApiError::InvalidRequest(format!(
                "change {asked} has not happened: the newest change id is {newest}. Resume with the id of the last event you received (or since=0 for the oldest change kept, or without since for the next change)"
            )));
        }
    };
    // The start, as a header and an id-only event, so a client cut off early resumes there.
    let start = watch.position();
    let ends = tokio::time::sleep(state.rules.max_watch);
    let opening = stream::once(async move { Ok(Event::default().id(start.to_string())) });
    // The stream ends once its key's revocation is confirmed here.
    let revoked: Revoked = match principal {
        Some(Extension(principal)) => {
            let (keys, pool) = (state.keys.clone(), (*state.db).clone());
            Box::pin(async move {
                while let Err(e) = keys.revoked(&pool, principal.id).await {
                    tracing::warn!(error = %e, "cannot tell whether a watch's API key is live; asking again");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
            })
        }
        None => Box::pin(std::future::pending()),
    };
    let changes = opening.chain(events(watch, revoked)).map(move |event| {
        let _held = (&streaming, &in_flight);
        event
    });
    let sse = Sse::new(changes.take_until(ends))
        .keep_alive(KeepAlive::new().interval(state.rules.watch_heartbeat));
    let mut response = sse.into_response();
    let headers = response.headers_mut();
    headers.insert(WATCH_AFTER, HeaderValue::from(start.get()));
    // Buffering proxies (nginx) would hold the events back.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The changes as SSE events; a read failure ends the stream with a comment.
fn events(watch: Watch, revoked: Revoked) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold(Some((watch, revoked)), |state| async move {
        let (mut watch, mut revoked) = state?;
        let next = tokio::select! {
            biased;
            () = &mut revoked => {
                let problem = ApiError::Unauthorized(REVOKED_DETAIL).problem_json();
                return Some((Ok(Event::default().event(REVOKED_EVENT).data(problem)), None));
            }
            next = watch.next() => next,
        };
        let event = match next? {
            Ok(change) => Event::default()
                .id(change.id.to_string())
                .event(change.event.as_str())
                .json_data(&change.data)
                .expect("a change serializes"),
            Err(e) => {
                tracing::warn!(error = %e, "a watch cannot read the history of changes; ending it");
                return Some((
                    Ok(Event::default().comment(
                        "the database cannot be read now; resume with Last-Event-ID in a second",
                    )),
                    None,
                ));
            }
        };
        Some((Ok(event), Some((watch, revoked))))
    })
}

const REVOKED_DETAIL: &str = "the API key of this watch was revoked, so the stream ended; resuming with it is refused 401. Ask an operator for a live key, then resume with Last-Event-ID";
