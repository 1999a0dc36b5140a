//! The request's headers: their names, each read once and as visible ASCII, and the extractors of
//! the fencing, metadata and precondition headers.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, header};

use crate::domain::headers as names;
use crate::domain::{EntityTagCondition, FencingToken, Key, Metadata};
use crate::http::error::ApiError;

/// The header that carries a fencing token.
pub static FENCING_TOKEN: HeaderName = HeaderName::from_static(names::FENCING_TOKEN);
/// The header that names the lease whose namespace fences a write (v1.3).
pub static FENCING_KEY: HeaderName = HeaderName::from_static(names::FENCING_KEY);
/// The header that carries a snapshot version's metadata (v1.3).
pub static SNAPSHOT_METADATA: HeaderName = HeaderName::from_static(names::SNAPSHOT_METADATA);
/// The header that carries a snapshot's version.
pub static SNAPSHOT_VERSION: HeaderName = HeaderName::from_static(names::SNAPSHOT_VERSION);
/// The request id header, taken from the request or made.
pub static REQUEST_ID: HeaderName = HeaderName::from_static(names::REQUEST_ID);

pub(in crate::http) fn single_header<'a>(
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
