//! `Idempotency-Key` on changing calls: the header, the fingerprint, and the store's gate as an
//! answer.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::domain::headers::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};
use crate::domain::{IdempotencyKey, Key};
use crate::store::idempotency::{Gated, Idempotency};
use crate::store::{RequestContext, StoreError};

static IDEMPOTENCY_KEY_HEADER: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);
static REPLAYED_HEADER: HeaderName = HeaderName::from_static(IDEMPOTENT_REPLAYED);

const REVOKED: &str = "the API key was revoked before this request could run; nothing was \
    changed. Ask an operator for a live key";

const PUT_HEAD: &str = "put-head";

/// The SHA-256 of operation, key and `parts`, each length-prefixed so no two requests collide.
fn fingerprint(operation: &str, key: &Key, parts: &[&[u8]]) -> [u8; 32] {
    let mut digest = Sha256::new();
    for part in [operation.as_bytes(), key.as_str().as_bytes()]
        .iter()
        .chain(parts)
    {
        digest.update((part.len() as u64).to_be_bytes());
        digest.update(part);
    }
    digest.finalize().into()
}

/// The optional `Idempotency-Key` header of a changing call.
pub struct IdempotencyHeader(pub Option<IdempotencyKey>);

impl<S: Send + Sync> FromRequestParts<S> for IdempotencyHeader {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        // Sent twice it names two requests: refused, like two Fencing-Token headers.
        if parts
            .headers
            .get_all(&IDEMPOTENCY_KEY_HEADER)
            .iter()
            .nth(1)
            .is_some()
        {
            return Err(ApiError::InvalidRequest(
                "send the Idempotency-Key header once: two name two different requests".into(),
            ));
        }
        let Some(value) = parts.headers.get(&IDEMPOTENCY_KEY_HEADER) else {
            return Ok(Self(None));
        };
        let text = value.to_str().map_err(|_| {
            ApiError::InvalidRequest(
                "Idempotency-Key must be visible ASCII characters (a UUID is a good choice)".into(),
            )
        })?;
        Ok(Self(Some(IdempotencyKey::parse(text)?)))
    }
}

impl IdempotencyHeader {
    /// Puts the key, if sent, into `ctx` with the request's fingerprint over `operation`, key and
    /// `parts`.
    pub fn attach(&self, ctx: &mut RequestContext, operation: &str, key: &Key, parts: &[&[u8]]) {
        ctx.idempotency = self.0.as_ref().map(|k| Idempotency {
            key: k.clone(),
            fingerprint: fingerprint(operation, key, parts),
            head_fingerprint: None,
        });
    }

    /// For a PUT before its body: the fingerprint of its head alone, under which a refusal made
    /// before the body is recorded (it is the answer to any body).
    pub fn attach_head(&self, ctx: &mut RequestContext, key: &Key, head: &[&[u8]]) {
        self.attach(ctx, PUT_HEAD, key, head);
    }

    /// For a PUT with its body: as [`attach`](Self::attach), also answering to a head-only record.
    pub fn attach_put(&self, ctx: &mut RequestContext, key: &Key, head: &[&[u8]], etag: &[u8]) {
        let mut parts = head.to_vec();
        parts.push(etag);
        self.attach(ctx, "put", key, &parts);
        if let Some(i) = &mut ctx.idempotency {
            i.head_fingerprint = Some(fingerprint(PUT_HEAD, key, head));
        }
    }

    /// The answer of a changing call: `render` makes it (again, with `Idempotent-Replayed: true`,
    /// on a replay); the gate's refusals become their problems.
    pub fn respond<T>(
        &self,
        done: Result<Gated<T>, StoreError>,
        render: impl FnOnce(T) -> Result<Response, ApiError>,
    ) -> Result<Response, ApiError> {
        let key = self.0.clone();
        match done {
            Ok(Gated::Ran(t)) => render(t),
            Ok(Gated::Replayed(t)) => {
                let mut response = render(t).unwrap_or_else(IntoResponse::into_response);
                response
                    .headers_mut()
                    .insert(REPLAYED_HEADER.clone(), HeaderValue::from_static("true"));
                Ok(response)
            }
            Ok(Gated::KeyReused) => Err(ApiError::IdempotencyKeyReused(
                key.expect("only a key can be reused"),
            )),
            Ok(Gated::InProgress) => Err(ApiError::RequestInProgress(
                key.expect("only a key can be in progress"),
            )),
            Ok(Gated::Revoked) => Err(ApiError::Unauthorized(REVOKED)),
            Err(e @ StoreError::Indeterminate(_)) => Err(match key {
                Some(key) => ApiError::IndeterminateRetry {
                    cause: e.into(),
                    key,
                },
                None => e.into(),
            }),
            Err(e) => Err(e.into()),
        }
    }
}
