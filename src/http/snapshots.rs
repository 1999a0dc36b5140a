//! `/v1/snapshots`, and (beyond the contract) the keys that have a snapshot, by prefix.

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
    ApiQuery, BodyLimit, Context, FENCING_KEY, FENCING_TOKEN, FencingKeyHeader, FencingTokenHeader,
    IfMatch, IfNoneMatch, KeyPath, KeyVersionPath, PageParams, SNAPSHOT_METADATA, SNAPSHOT_VERSION,
    SnapshotMetadataHeader, content_length, key_page, read_limited,
};
use crate::domain::{
    ETag, EntityTagCondition, Key, ListOrder, Metadata, Page, SnapshotMeta, Version,
};
use crate::http::AppState;
use crate::store::idempotency::Gated;
use crate::store::snapshots::list::{self, SnapshotKeysQuery};
use crate::store::snapshots::{self, Fenced, PutRequest, Read, Snapshot, WriteOutcome, Written};

const SNAPSHOT_TOO_LARGE: &str =
    "Send a smaller snapshot, or raise the server's --max-snapshot-bytes";

const DEFAULT_CONTENT_TYPE: &str = "application/octet-stream";

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

pub(super) fn fence_of(key: &Key, header: Option<Key>) -> Result<Key, ApiError> {
    match header {
        None => Ok(key.clone()),
        Some(fence) if key.in_namespace_of(&fence) => Ok(fence),
        Some(fence) => Err(ApiError::InvalidRequest(format!(
            "key {key:?} is not in the namespace of the Fencing-Key {fence:?} (that key itself, or keys beginning with {:?}); name the lease that covers the key, or leave Fencing-Key out to fence the key by its own lease",
            format!("{fence}/")
        ))),
    }
}

fn key_header(key: &Key) -> HeaderValue {
    HeaderValue::from_str(&key.to_segment()).expect("a percent-encoded key is visible ASCII")
}

fn metadata_header(metadata: &Metadata) -> HeaderValue {
    HeaderValue::from_str(&metadata.to_header()).expect("escaped JSON is ASCII")
}

fn raw_if_match(headers: &HeaderMap) -> &[u8] {
    headers
        .get(header::IF_MATCH)
        .map_or(&[], HeaderValue::as_bytes)
}

#[allow(clippy::too_many_arguments)]
async fn write(
    State(state): State<AppState>,
    KeyPath(key): KeyPath,
    FencingTokenHeader(token): FencingTokenHeader,
    FencingKeyHeader(fence): FencingKeyHeader,
    SnapshotMetadataHeader(metadata): SnapshotMetadataHeader,
    IfMatch(if_match): IfMatch,
    Context(mut ctx, idempotency): Context,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let fence = fence_of(&key, fence)?;
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
    let metadata_text = metadata.as_ref().map(|m| m.as_json().to_string());
    let head: [&[u8]; 5] = [
        &token_bytes,
        raw_if_match(&headers),
        content_type.as_bytes(),
        fence.as_str().as_bytes(),
        metadata_text.as_deref().unwrap_or("").as_bytes(),
    ];
    let length = content_length(&headers);
    // A client waiting on `Expect: 100-continue` is told to go on only once the checks pass.
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let (body, in_hand) = if expects_continue {
        (body, false)
    } else {
        arrived_with_head(body, length)
    };
    let too_large = length.is_some_and(|n| n > state.rules.max_snapshot_bytes as u64);
    if !in_hand && !too_large {
        // Checked before the body is read: a doomed upload is refused and audited at once.
        let mut early = ctx.clone();
        idempotency.attach_head(&mut early, &key, &head);
        let target = Fenced {
            key: &key,
            fence: &fence,
            token,
        };
        match snapshots::precheck(&state.db, target, &early).await {
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
        fence,
        token,
        if_match,
        body,
        etag,
        content_type,
        metadata,
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
    FencingKeyHeader(fence): FencingKeyHeader,
    IfMatch(if_match): IfMatch,
    Context(mut ctx, idempotency): Context,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let fence = fence_of(&key, fence)?;
    idempotency.attach(
        &mut ctx,
        "delete",
        &key,
        &[
            &token.get().to_be_bytes(),
            raw_if_match(&headers),
            fence.as_str().as_bytes(),
        ],
    );
    let target = Fenced {
        key: &key,
        fence: &fence,
        token,
    };
    let done = snapshots::delete(&state.db, target, if_match.as_ref(), &ctx).await;
    idempotency.respond(done, |outcome| {
        refused(key, outcome)?;
        Ok(StatusCode::NO_CONTENT.into_response())
    })
}

fn arrived_with_head(mut body: Body, length: Option<u64>) -> (Body, bool) {
    match body.frame().now_or_never() {
        Some(None) => (Body::empty(), true),
        Some(Some(Ok(frame))) => {
            let Ok(data) = frame.into_data() else {
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
    if let Some(fence) = &meta.fencing_key {
        headers.insert(FENCING_KEY.clone(), key_header(fence));
    }
    if let Some(metadata) = &meta.metadata {
        headers.insert(SNAPSHOT_METADATA.clone(), metadata_header(metadata));
    }
    let last_modified = meta
        .updated_at
        .format("%a, %d %b %Y %H:%M:%S GMT")
        .to_string();
    headers.insert(
        header::LAST_MODIFIED,
        HeaderValue::from_str(&last_modified).expect("an HTTP date is ASCII"),
    );
    // Unread bytes mean the statement found a match: 304, never a 200 without its body.
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
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(meta.size));
            (StatusCode::OK, headers).into_response()
        }
    }
}

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
    #[serde(default)]
    start_after: Option<String>,
    #[serde(default)]
    order: ListOrder,
    #[serde(default)]
    include: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<ListParams>,
) -> Result<Response, ApiError> {
    let (prefix, limit, after) = key_page(params.prefix, params.limit, params.cursor.as_deref())?;
    let with_metadata = match params.include.as_deref() {
        None | Some("") => false,
        Some("metadata") => true,
        Some(other) => {
            return Err(ApiError::InvalidRequest(format!(
                "include {other:?} is not `metadata`, the only thing a listing can include"
            )));
        }
    };
    let start_after = params
        .start_after
        .map(crate::domain::KeyPrefix::parse)
        .transpose()
        .map_err(|e| ApiError::InvalidRequest(format!("start_after: {e}")))?;
    let after = after.or_else(|| start_after.map(|s| s.as_str().to_owned()));
    let q = SnapshotKeysQuery {
        prefix,
        limit,
        after,
        order: params.order,
    };
    let page = list::list(&state.db, &q).await?;
    if !with_metadata {
        // Without `include=metadata` an item has no `metadata` member at all.
        let mut json = serde_json::to_value(&page).expect("a page serializes");
        if let Some(items) = json["items"].as_array_mut() {
            for item in items {
                item.as_object_mut().map(|o| o.remove("metadata"));
            }
        }
        return Ok(Json(json).into_response());
    }
    Ok(Json(page).into_response())
}
