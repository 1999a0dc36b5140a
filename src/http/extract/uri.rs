//! The request target: the `{key}` path segments and the query, refused when not well
//! percent-encoded, with unknown parameters and bad values as `invalid_request`.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::domain::{Cursor, Key, KeyPrefix, PageLimit};
use crate::http::error::ApiError;

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
