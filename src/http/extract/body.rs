//! Bodies read within their limits (size, the instance's budget, time) before any statement runs,
//! and JSON bodies parsed from them.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, header};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use memmap2::MmapMut;
use serde::de::DeserializeOwned;

use crate::http::AppState;
use crate::http::error::{ApiError, Unavailability};
use crate::http::limits::BodyBudget;

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
    // Read once without tracking the path, which costs on every field; only a body that fails
    // is read again to name the field.
    if let Ok(value) = serde_json::from_slice(bytes) {
        return Ok(value);
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
