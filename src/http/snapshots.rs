//! `/v1/snapshots`: fenced writes and deletes, reads, retained versions, and (beyond the
//! contract) the keys that have a snapshot, by prefix.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use futures_util::{FutureExt, StreamExt};
use http_body_util::BodyExt;
use serde::Deserialize;

use super::Routes;
use super::error::ApiError;
use super::extract::{
    ApiQuery, BodyLimit, Context, FENCING_TOKEN, FencingTokenHeader, IfMatch, IfNoneMatch, KeyPath,
    KeyVersionPath, PageParams, SNAPSHOT_VERSION, content_length, key_page, read_limited,
};
use crate::domain::{ETag, EntityTagCondition, Key, Page, SnapshotMeta, Version};
use crate::state::AppState;
use crate::store::idempotency::Gated;
use crate::store::snapshots::list::{self, SnapshotKeysQuery};
use crate::store::snapshots::{self, PutRequest, Read, Snapshot, WriteOutcome, Written};

const SNAPSHOT_TOO_LARGE: &str =
    "Send a smaller snapshot, or raise the server's --max-snapshot-bytes";

/// The content type stored when a write sends none.
const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

/// The snapshot routes. `GET` routes answer `HEAD` too, with the same headers and no body.
pub(super) fn routes() -> Routes {
    Routes::new()
        .route("/v1/snapshots", get(list))
        .route_without_query("/v1/snapshots/{key}", get(read).put(write).delete(delete))
        .route("/v1/snapshots/{key}/versions", get(versions))
        .route_without_query("/v1/snapshots/{key}/versions/{version}", get(read_version))
}

fn refused<T>(key: Key, outcome: WriteOutcome<T>) -> Result<T, ApiError> {
    match outcome {
        WriteOutcome::Accepted(t) => Ok(t),
        WriteOutcome::Refused(refusal) => Err(ApiError::Refused { key, refusal }),
        WriteOutcome::PreconditionFailed => Err(ApiError::PreconditionFailed),
    }
}

fn etag_header(meta: &SnapshotMeta) -> HeaderValue {
    HeaderValue::from_str(meta.etag.as_str()).expect("an ETag is visible ASCII")
}

/// The raw `If-Match` header, as it enters a fenced call's Idempotency-Key fingerprint.
fn raw_if_match(headers: &HeaderMap) -> &[u8] {
    headers
        .get(header::IF_MATCH)
        .map_or(&[], HeaderValue::as_bytes)
}

async fn write(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    FencingTokenHeader(token): FencingTokenHeader,
    IfMatch(if_match): IfMatch,
    Context(mut ctx, idempotency): Context,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let content_type = match headers.get(header::CONTENT_TYPE) {
        None => DEFAULT_CONTENT_TYPE.to_owned(),
        Some(v) => v
            .to_str()
            .map_err(|_| ApiError::InvalidRequest("Content-Type is not visible ASCII".into()))?
            .to_owned(),
    };
    let limit = BodyLimit {
        max_bytes: state.rules.max_snapshot_bytes,
        timeout: state.rules.body_timeout,
        hint: SNAPSHOT_TOO_LARGE,
        budget: state.limits.bodies().clone(),
    };
    let token_bytes = token.get().to_be_bytes();
    let head: [&[u8]; 3] = [
        &token_bytes,
        raw_if_match(&headers),
        content_type.as_bytes(),
    ];
    let length = content_length(&headers);
    // A client that asked to be told to go on (`Expect: 100-continue`) has sent no body yet, and
    // polling the body would tell it to go on before the checks below had their say.
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let (body, in_hand) = if expects_continue {
        (body, false)
    } else {
        arrived_with_head(body, length)
    };
    // A body announced over the limit is refused (413) before anything is read or checked.
    let too_large = length.is_some_and(|n| n > state.rules.max_snapshot_bytes as u64);
    if !in_hand && !too_large {
        // The token is checked before the body is read: an upload that can only be refused
        // is refused (and audited) at once, never received.
        let mut early = ctx.clone();
        idempotency.attach_head(&mut early, &key, &head);
        match snapshots::precheck(&state.db, &key, token, &early).await {
            Ok(Gated::Ran(None) | Gated::KeyReused | Gated::InProgress) => {}
            checked => {
                return idempotency.respond(checked, |refusal| {
                    let refusal = refusal.expect("only a refusal ends a write before its body");
                    Err(ApiError::Refused { key, refusal })
                });
            }
        }
    }
    let body = read_limited(body, length, limit).await?;
    let etag = ETag::of(&body);
    idempotency.attach_put(&mut ctx, &key, &head, etag.as_str().as_bytes());
    let req = PutRequest {
        key: key.clone(),
        token,
        if_match,
        body,
        etag,
        content_type,
    };
    let done = snapshots::put(&state.db, &req, state.rules.keep_versions, &ctx).await;
    idempotency.respond(done, |outcome| {
        let Written { meta, created } = refused(key, outcome)?;
        let status = if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        let etag = etag_header(&meta);
        Ok((status, [(header::ETAG, etag)], Json(meta)).into_response())
    })
}

async fn delete(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    FencingTokenHeader(token): FencingTokenHeader,
    IfMatch(if_match): IfMatch,
    Context(mut ctx, idempotency): Context,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    idempotency.attach(
        &mut ctx,
        "delete",
        &key,
        &[&token.get().to_be_bytes(), raw_if_match(&headers)],
    );
    let done = snapshots::delete(&state.db, &key, token, if_match.as_ref(), &ctx).await;
    idempotency.respond(done, |outcome| {
        refused(key, outcome)?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
}

/// The body, and whether all of it came with the request's head: polled once, without
/// waiting. A small body sent with its head is usually all there; then the write's own statement
/// checks the token, and no round trip is spent on checking it first.
fn arrived_with_head(mut body: Body, length: Option<u64>) -> (Body, bool) {
    match body.frame().now_or_never() {
        // The body had ended: nothing (or nothing more) will come.
        Some(None) => (Body::empty(), true),
        Some(Some(Ok(frame))) => {
            let Ok(data) = frame.into_data() else {
                // Trailers first: no body to speak of; the reader sees it end.
                return (Body::empty(), true);
            };
            let whole = length == Some(data.len() as u64);
            let first = futures_util::stream::once(async { Ok::<_, axum::Error>(data) });
            (
                Body::from_stream(first.chain(body.into_data_stream())),
                whole,
            )
        }
        Some(Some(Err(e))) => (
            Body::from_stream(futures_util::stream::once(async { Err::<Bytes, _>(e) })),
            false,
        ),
        None => (body, false),
    }
}

/// A snapshot as an HTTP answer: its bytes with the contract's headers, or `304` when
/// `If-None-Match` matches (the statement then read no bytes).
fn snapshot_response(
    snapshot: Snapshot,
    read: Read<'_>,
    if_none_match: Option<&EntityTagCondition>,
) -> Response {
    let meta = &snapshot.meta;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag_header(meta));
    headers.insert(FENCING_TOKEN.clone(), HeaderValue::from(meta.token.get()));
    headers.insert(
        SNAPSHOT_VERSION.clone(),
        HeaderValue::from(meta.version.get()),
    );
    let last_modified = meta
        .updated_at
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    headers.insert(
        header::LAST_MODIFIED,
        HeaderValue::from_str(&last_modified).expect("an HTTP date is ASCII"),
    );
    // A GET whose bytes were left unread is one the statement found matching: a 304 either way,
    // never a 200 without its body.
    let unread = matches!(read, Read::Body(_)) && snapshot.body.is_none();
    if unread || if_none_match.is_some_and(|c| c.matches_weak(&meta.etag)) {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    match HeaderValue::from_str(&meta.content_type) {
        Ok(ct) => headers.insert(header::CONTENT_TYPE, ct),
        Err(_) => headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(DEFAULT_CONTENT_TYPE),
        ),
    };
    match snapshot.body {
        Some(body) => (StatusCode::OK, headers, body).into_response(),
        None => {
            // What a GET would send, for a HEAD that did not read the body.
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.size));
            (StatusCode::OK, headers).into_response()
        }
    }
}

/// What a read of `method` takes: a `HEAD` no bytes, a `GET` its bytes unless `If-None-Match`
/// matches.
fn wanted<'a>(method: &Method, if_none_match: Option<&'a EntityTagCondition>) -> Read<'a> {
    if method == Method::HEAD {
        Read::Head
    } else {
        Read::Body(if_none_match)
    }
}

fn no_snapshot(key: &Key) -> ApiError {
    ApiError::NotFound(format!(
        "key {key:?} has no snapshot; write one with PUT and a Fencing-Token"
    ))
}

async fn read(
    State(state): State<AppState>,
    method: Method,
    KeyPath(key): KeyPath,
    IfNoneMatch(if_none_match): IfNoneMatch,
) -> Result<Response, ApiError> {
    let read = wanted(&method, if_none_match.as_ref());
    let snapshot = snapshots::get(&state.db, &key, None, state.rules.keep_versions, read)
        .await?
        .ok_or_else(|| no_snapshot(&key))?;
    Ok(snapshot_response(snapshot, read, if_none_match.as_ref()))
}

async fn read_version(
    State(state): State<AppState>,
    method: Method,
    KeyVersionPath(key, version): KeyVersionPath,
    IfNoneMatch(if_none_match): IfNoneMatch,
) -> Result<Response, ApiError> {
    let version = Version::parse(&version)?;
    let read = wanted(&method, if_none_match.as_ref());
    let keep = state.rules.keep_versions;
    let snapshot = snapshots::get(&state.db, &key, Some(version), keep, read)
        .await?
        .ok_or_else(|| {
            ApiError::NotFound(format!(
                "key {key:?} has no version {}: it was never written, or was pruned or deleted; list /versions for the retained ones",
                version.get()
            ))
        })?;
    Ok(snapshot_response(snapshot, read, if_none_match.as_ref()))
}

async fn versions(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    ApiQuery(params): ApiQuery<PageParams>,
) -> Result<Json<Page<SnapshotMeta>>, ApiError> {
    let (limit, before) = params.checked()?;
    let page = snapshots::versions(&state.db, &key, state.rules.keep_versions, limit, before)
        .await?
        .ok_or_else(|| no_snapshot(&key))?;
    Ok(Json(page))
}

/// The query of a list of snapshot keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
}

/// Beyond the contract: the keys with a current snapshot, in byte order, each with that
/// snapshot's metadata.
async fn list(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Json<Page<SnapshotMeta>>, ApiError> {
    let (prefix, limit, after) = key_page(params.prefix, params.limit, params.cursor.as_deref())?;
    let q = SnapshotKeysQuery {
        prefix,
        limit,
        after,
    };
    Ok(Json(list::list(&state.db, &q).await?))
}
