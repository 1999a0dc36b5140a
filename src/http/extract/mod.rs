//! Extractors: requests into validated domain values, malformed ones into an [`ApiError`] naming
//! the fault. The headers (`headers.rs`), the path and query (`uri.rs`) and the bodies (`body.rs`)
//! each have a module; a changing call's context, which joins them, is here.

mod body;
mod headers;
mod uri;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use super::error::ApiError;
use super::idempotency::IdempotencyHeader;
use crate::domain::Principal;
use crate::store::RequestContext;
pub use body::{ApiJson, BodyLimit, MAX_JSON_BYTES, content_length, json_body, read_limited};
pub(super) use headers::single_header;
pub use headers::{
    FENCING_KEY, FENCING_TOKEN, FencingKeyHeader, FencingTokenHeader, IfMatch, IfNoneMatch,
    REQUEST_ID, SNAPSHOT_METADATA, SNAPSHOT_VERSION, SnapshotMetadataHeader, fencing_key,
};
pub use uri::{ApiQuery, KeyPath, KeyVersionPath, PageParams, key_page, no_query, strict_query};

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
