//! Extractors: requests into validated domain values, malformed ones into an [`ApiError`] naming
//! the fault.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use memmap2::MmapMut;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::{ApiError, Unavailability};
use super::idempotency::IdempotencyHeader;
use super::limits::BodyBudget;
use crate::domain::{
    Cursor, EntityTagCondition, FencingToken, Key, KeyPrefix, Metadata, PageLimit, Principal,
};
use crate::state::AppState;
use crate::store::RequestContext;

/// The header that carries a fencing token.
pub static FENCING_TOKEN: HeaderName = HeaderName::from_static("fencing-token");
/// The header that names the lease whose namespace fences a write (v1.3).
pub static FENCING_KEY: HeaderName = HeaderName::from_static("fencing-key");
/// The header that carries a snapshot version's metadata (v1.3).
pub static SNAPSHOT_METADATA: HeaderName = HeaderName::from_static("snapshot-metadata");
/// The header that carries a snapshot's version.
pub static SNAPSHOT_VERSION: HeaderName = HeaderName::from_static("snapshot-version");
/// The request id header, taken from the request or made.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The largest JSON request body.
pub const MAX_JSON_BYTES: usize = 64 * 1024;
const JSON_TOO_LARGE: &str =
    "Lease request bodies are small JSON objects; metadata may be at most 4 KiB";

/// A JSON body whatever its `Content-Type` (so `curl -d` works); errors are `invalid_request`.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let length = content_length(req.headers());
        let limit = BodyLimit {
            max_bytes: MAX_JSON_BYTES,
            timeout: state.rules.body_timeout,
            hint: JSON_TOO_LARGE,
            budget: state.limits.bodies().clone(),
        };
        let bytes = read_limited(req.into_body(), length, limit).await?;
        Ok(ApiJson(json_body(&bytes)?))
    }
}

/// A JSON request body as `T`, errors as `invalid_request` naming the field.
pub fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::InvalidRequest(
            "a JSON object body is required; see openapi.yaml for its fields".into(),
        ));
    }
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            ApiError::InvalidRequest(format!("request body: {inner}"))
        } else {
            ApiError::InvalidRequest(format!("request body field `{path}`: {inner}"))
        }
    })?;
    json.end()
        .map_err(|e| ApiError::InvalidRequest(format!("request body: {e}")))?;
    Ok(value)
}

/// Query parameters, with unknown parameters and bad values reported as `invalid_request`.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(q)| ApiQuery(q))
            .map_err(|e: QueryRejection| ApiError::InvalidRequest(e.body_text()))
    }
}

/// The query of a list paged by id or version: `limit` and `cursor`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageParams {
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
}

impl PageParams {
    /// The page size, and the id or version the page resumes after.
    pub fn checked(&self) -> Result<(PageLimit, Option<i64>), ApiError> {
        let limit = PageLimit::new(self.limit)?;
        let after = self
            .cursor
            .as_deref()
            .map(Cursor::decode_number)
            .transpose()?;
        Ok((limit, after))
    }
}

/// A page of keys under `prefix`, `limit` of them, after the cursor's key.
pub fn key_page(
    prefix: Option<String>,
    limit: Option<i64>,
    cursor: Option<&str>,
) -> Result<(KeyPrefix, PageLimit, Option<String>), ApiError> {
    Ok((
        KeyPrefix::parse(prefix.unwrap_or_default())?,
        PageLimit::new(limit)?,
        cursor.map(Cursor::decode).transpose()?,
    ))
}

/// Refuses a query on calls taking none: `?versionId=3` would silently read the current version.
pub async fn no_query(req: Request, next: Next) -> Result<Response, ApiError> {
    match req.uri().query().filter(|q| !q.is_empty()) {
        None => Ok(next.run(req).await),
        Some(q) => Err(ApiError::InvalidRequest(format!(
            "this call takes no query parameters, got {q:?}; see openapi.yaml for its headers and body"
        ))),
    }
}

/// Refuses a query with malformed escapes or invalid UTF-8, as such a path is.
pub async fn strict_query(req: Request, next: Next) -> Result<Response, ApiError> {
    if let Some(query) = req.uri().query() {
        for part in query.split('&') {
            let bad = !crate::domain::well_escaped(part)
                || percent_encoding::percent_decode_str(part)
                    .decode_utf8()
                    .is_err();
            if bad {
                return Err(ApiError::InvalidRequest(format!(
                    "the query parameter {part:?} is not well percent-encoded UTF-8; encode each value's bytes as %XX (a `%` itself is %25)"
                )));
            }
        }
    }
    Ok(next.run(req).await)
}

/// The `{key}` path segment, percent-decoded and validated.
pub struct KeyPath(pub Key);

impl<S: Send + Sync> FromRequestParts<S> for KeyPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        well_escaped(parts.uri.path())?;
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(path_error)?;
        Ok(Self(Key::parse(raw)?))
    }
}

/// The `{key}` and `{version}` path segments.
pub struct KeyVersionPath(pub Key, pub String);

impl<S: Send + Sync> FromRequestParts<S> for KeyVersionPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        well_escaped(parts.uri.path())?;
        let Path((key, version)) = Path::<(String, String)>::from_request_parts(parts, state)
            .await
            .map_err(path_error)?;
        Ok(Self(Key::parse(key)?, version))
    }
}

/// Refuses a `%` that starts no escape: leniently, `a%ZZb` and `a%25ZZb` would name one key.
fn well_escaped(path: &str) -> Result<(), ApiError> {
    if crate::domain::well_escaped(path) {
        Ok(())
    } else {
        Err(ApiError::InvalidRequest(format!(
            "the path {path:?} has a `%` that is not followed by two hex digits; percent-encode the key as one path segment (a `%` in a key is %25)"
        )))
    }
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::InvalidRequest(format!(
        "{}; percent-encode the key as one path segment (e.g. jobs%2F42)",
        e.body_text()
    ))
}

pub(super) fn single_header<'a>(
    headers: &'a HeaderMap,
    name: &HeaderName,
) -> Result<Option<&'a str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::InvalidRequest(format!(
            "send the {name} header once"
        )));
    }
    first
        .to_str()
        .map(Some)
        .map_err(|_| ApiError::InvalidRequest(format!("the {name} header is not visible ASCII")))
}

/// The `Fencing-Token` header: missing is `428 token_required`, malformed `400 invalid_request`.
pub struct FencingTokenHeader(pub FencingToken);

impl<S: Send + Sync> FromRequestParts<S> for FencingTokenHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let raw = single_header(&parts.headers, &FENCING_TOKEN)?.ok_or(ApiError::TokenRequired)?;
        Ok(Self(FencingToken::parse_header(raw)?))
    }
}

/// The `Fencing-Key` header, percent-decoded as a path key is; `None` when not sent.
pub fn fencing_key(headers: &HeaderMap) -> Result<Option<Key>, ApiError> {
    let Some(raw) = single_header(headers, &FENCING_KEY)? else {
        return Ok(None);
    };
    Key::from_segment(raw)
        .map(Some)
        .map_err(|e| ApiError::InvalidRequest(format!("the Fencing-Key header: {e}")))
}

/// The optional `Fencing-Key` header of a fenced write (v1.3): the lease that fences it.
pub struct FencingKeyHeader(pub Option<Key>);

impl<S: Send + Sync> FromRequestParts<S> for FencingKeyHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Ok(Self(fencing_key(&parts.headers)?))
    }
}

/// The optional `Snapshot-Metadata` header (v1.3): a JSON object of at most 4 KiB, kept as sent.
pub struct SnapshotMetadataHeader(pub Option<Metadata>);

impl<S: Send + Sync> FromRequestParts<S> for SnapshotMetadataHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let Some(raw) = single_header(&parts.headers, &SNAPSHOT_METADATA)? else {
            return Ok(Self(None));
        };
        let value: serde_json::Value = serde_json::from_str(raw).map_err(|e| {
            ApiError::InvalidRequest(format!(
                "the Snapshot-Metadata header is not JSON ({e}); send a JSON object, e.g. {{\"step\": 7}}"
            ))
        })?;
        Ok(Self(Some(Metadata::new(value).map_err(|e| {
            ApiError::InvalidRequest(format!("Snapshot-Metadata: {e}"))
        })?)))
    }
}

macro_rules! entity_tag_header {
    ($name:ident, $header:expr, $doc:literal) => {
        #[doc = $doc]
        pub struct $name(pub Option<EntityTagCondition>);

        impl<S: Send + Sync> FromRequestParts<S> for $name {
            type Rejection = ApiError;

            async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
                let raw = single_header(&parts.headers, &$header)?;
                Ok(Self(raw.map(EntityTagCondition::parse).transpose()?))
            }
        }
    };
}

entity_tag_header!(
    IfMatch,
    header::IF_MATCH,
    "The optional `If-Match` header of a fenced write."
);
entity_tag_header!(
    IfNoneMatch,
    header::IF_NONE_MATCH,
    "The optional `If-None-Match` header of a read."
);

/// A changing call's context (for the audit log and the Idempotency-Key's scope) and key.
pub struct Context(pub RequestContext, pub IdempotencyHeader);

impl<S: Send + Sync> FromRequestParts<S> for Context {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let request_id = parts
            .headers
            .get(&REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let remote_addr = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| addr.to_string());
        let idempotency = IdempotencyHeader::from_request_parts(parts, state).await?;
        let principal = parts.extensions.get::<Principal>();
        Ok(Self(
            RequestContext {
                request_id,
                remote_addr,
                principal: principal.map(|p| p.name.clone()),
                key_id: principal.map(|p| p.id),
                idempotency: None,
            },
            idempotency,
        ))
    }
}

/// How much of a body the server reads, and for how long.
#[derive(Debug, Clone)]
pub struct BodyLimit {
    /// The most bytes accepted.
    pub max_bytes: usize,
    /// How long the whole body may take to arrive.
    pub timeout: Duration,
    /// What to tell a client whose body is too large.
    pub hint: &'static str,
    /// The instance's budget for the bodies being received, which this one is charged to.
    pub budget: Arc<BodyBudget>,
}

/// Reads a body within `limit`: 413 past `max_bytes`, 503 past the body budget, 408 past `timeout`,
/// each as early as the length or bytes show. The body is whole before any statement runs, so no
/// refusal leaves a change behind.
pub async fn read_limited(
    body: Body,
    content_length: Option<u64>,
    limit: BodyLimit,
) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::PayloadTooLarge {
        limit: limit.max_bytes,
        hint: limit.hint,
    };
    let over_budget = || {
        ApiError::Unavailable(Unavailability::BodyBudget {
            limit: limit.budget.limit(),
        })
    };
    let announced = match content_length.map(usize::try_from) {
        Some(Ok(n)) if n <= limit.max_bytes => Some(n),
        Some(_) => return Err(too_large()),
        None => None,
    };
    let mut charge = limit.budget.charge();
    if announced.is_some_and(|n| !charge.cover(n)) {
        return Err(over_budget());
    }
    let read = async {
        let mut buf = BodyBuffer::for_length(announced);
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::InvalidRequest(format!("the request body could not be read: {e}"))
            })?;
            let total = buf.len() + chunk.len();
            if total > limit.max_bytes {
                return Err(too_large());
            }
            if !charge.cover(total) {
                return Err(over_budget());
            }
            buf.extend(&chunk);
        }
        Ok(buf.freeze())
    };
    let body = tokio::time::timeout(limit.timeout, read)
        .await
        .map_err(|_| ApiError::RequestTimeout(limit.timeout))??;
    crate::store::restart_deadline();
    Ok(charge.hold(body))
}

const MAPPED_FROM: usize = 512 * 1024;

/// The heap, or an anonymous mapping for a large announced body (freed heap blocks grow it for
/// good).
enum BodyBuffer {
    Heap(BytesMut),
    Mapped(MmapMut, usize),
}

impl BodyBuffer {
    fn for_length(content_length: Option<usize>) -> Self {
        let heap = |n: usize| Self::Heap(BytesMut::with_capacity(n));
        match content_length {
            Some(n) if n >= MAPPED_FROM => MmapMut::map_anon(n)
                .map(|map| Self::Mapped(map, 0))
                .unwrap_or_else(|_| heap(n)),
            n => heap(n.unwrap_or(0)),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Heap(b) => b.len(),
            Self::Mapped(_, filled) => *filled,
        }
    }

    fn extend(&mut self, chunk: &[u8]) {
        match self {
            Self::Heap(b) => b.extend_from_slice(chunk),
            Self::Mapped(map, filled) if *filled + chunk.len() <= map.len() => {
                map[*filled..*filled + chunk.len()].copy_from_slice(chunk);
                *filled += chunk.len();
            }
            Self::Mapped(map, filled) => {
                let mut heap = BytesMut::with_capacity(*filled + chunk.len());
                heap.extend_from_slice(&map[..*filled]);
                heap.extend_from_slice(chunk);
                *self = Self::Heap(heap);
            }
        }
    }

    fn freeze(self) -> Bytes {
        match self {
            Self::Heap(b) => b.freeze(),
            Self::Mapped(map, filled) => Bytes::from_owner(map).slice(..filled),
        }
    }
}

/// The `Content-Length` of a request, if it sent a valid one.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_announced_body_is_gathered_in_a_mapping_of_its_size() {
        let n = MAPPED_FROM + 3;
        let mut buf = BodyBuffer::for_length(Some(n));
        assert!(matches!(buf, BodyBuffer::Mapped(ref map, 0) if map.len() == n));
        let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        for piece in body.chunks(1000) {
            buf.extend(piece);
        }
        assert_eq!(buf.len(), n);
        assert_eq!(buf.freeze(), body);
    }

    #[test]
    fn a_body_shorter_or_longer_than_announced_is_kept_whole() {
        let n = MAPPED_FROM;
        let mut short = BodyBuffer::for_length(Some(n));
        short.extend(b"only this");
        assert_eq!(short.freeze(), &b"only this"[..]);
        let mut long = BodyBuffer::for_length(Some(n));
        long.extend(&vec![7; n]);
        long.extend(b"more");
        assert!(matches!(long, BodyBuffer::Heap(_)));
        let all = long.freeze();
        assert_eq!((all.len(), &all[n..]), (n + 4, &b"more"[..]));
    }

    #[test]
    fn a_small_or_unannounced_body_is_gathered_on_the_heap() {
        assert!(matches!(BodyBuffer::for_length(None), BodyBuffer::Heap(_)));
        let small = BodyBuffer::for_length(Some(MAPPED_FROM - 1));
        assert!(matches!(small, BodyBuffer::Heap(_)));
    }
}
