//! Authentication and authorization of `/v1`: every refusal comes before the handler, so a 403
//! never says whether something exists.

use axum::extract::{FromRequestParts, Query, RawPathParams, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use super::limits::HeldAdmission;
use crate::domain::{Key, Presented, Principal, Scope};
use crate::http::AppState;
use crate::store;

const NEEDS_KEY: &str = "this server requires an API key: send `Authorization: Bearer sf_…` (an operator makes one with `snapfence keys create`)";
const BAD_KEY: &str =
    "the API key is not valid: it is malformed, unknown or revoked; ask an operator for a live key";

fn required_scope(method: &Method, path: &str) -> Scope {
    if path.starts_with("/v1/audit/") {
        Scope::Admin
    } else if method == Method::GET || method == Method::HEAD {
        Scope::Read
    } else {
        Scope::Write
    }
}

fn presented(req: &Request) -> Result<Option<Presented>, ApiError> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    // The scheme is case-insensitive (RFC 9110, 11.1).
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("Bearer"))
        .map(|(_, token)| token.trim())
        .ok_or(ApiError::Unauthorized(BAD_KEY))?;
    Presented::parse(token)
        .map(Some)
        .ok_or(ApiError::Unauthorized(BAD_KEY))
}

/// Authenticates, checks scope and prefix, admits under the key's limits, and leaves the
/// [`Principal`] in the request's extensions.
pub async fn authorize(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let presented = presented(&req)?;
    let lookup = store::keys::authenticate(&state.db, &state.keys, presented.as_ref()).await?;
    let principal = match (presented, lookup.principal) {
        (Some(_), Some(principal)) => principal,
        (Some(_), None) => return Err(ApiError::Unauthorized(BAD_KEY)),
        (None, _) if !lookup.any_live && state.rules.anonymous_without_keys => {
            return Ok(next.run(req).await);
        }
        (None, _) => return Err(ApiError::Unauthorized(NEEDS_KEY)),
    };
    let (mut parts, body) = req.into_parts();
    let needed = required_scope(&parts.method, parts.uri.path());
    if principal.scope < needed {
        return Err(ApiError::Forbidden(format!(
            "key {:?} has scope {}; this call needs {}",
            principal.name,
            principal.scope.as_str(),
            needed.as_str()
        )));
    }
    if !principal.prefix.is_empty() {
        check_prefix(&principal, &mut parts, &state).await?;
    }
    let admission = state
        .limits
        .admit(&principal.name)
        .map_err(ApiError::TooManyRequests)?;
    parts.extensions.insert(principal.clone());
    let admission = HeldAdmission::new(admission);
    parts.extensions.insert(admission.clone());
    let mut response = next.run(Request::from_parts(parts, body)).await;
    drop(admission);
    response.extensions_mut().insert(principal);
    Ok(response)
}

/// A key confined to a prefix may name only keys under it, wherever the request names one.
async fn check_prefix(
    principal: &Principal,
    parts: &mut axum::http::request::Parts,
    state: &AppState,
) -> Result<(), ApiError> {
    let outside = || {
        ApiError::Forbidden(format!(
            "key {:?} is confined to keys under {:?}",
            principal.name, principal.prefix
        ))
    };
    // A namespace fence (v1.3) must be covered too.
    if let Some(fence) = super::extract::fencing_key(&parts.headers)? {
        if !principal.covers(&fence) {
            return Err(outside());
        }
        if parts.uri.path() == "/v1/txn" {
            return Ok(());
        }
    }
    let params = RawPathParams::from_request_parts(parts, state)
        .await
        .map_err(|_| outside())?;
    if let Some((_, raw)) = params.iter().find(|(name, _)| *name == "key") {
        let key = Key::parse(raw)?;
        return if principal.covers(&key) {
            Ok(())
        } else {
            Err(outside())
        };
    }
    let Query(query) = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map_err(|e| ApiError::InvalidRequest(e.body_text()))?;
    let name = if parts.uri.path().starts_with("/v1/audit/") {
        "key"
    } else {
        "prefix"
    };
    let mut named = query.iter().filter(|(n, _)| n == name).map(|(_, v)| v);
    match (named.next(), named.next()) {
        (Some(_), Some(_)) => Err(ApiError::InvalidRequest(format!(
            "send the query parameter `{name}` once"
        ))),
        (Some(named), None) if principal.covers_prefix(named) => Ok(()),
        _ => Err(outside()),
    }
}
