//! `/v1/audit`: the log of refused stale writes and of reconciled recovery records.

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::Routes;
use super::error::ApiError;
use super::extract::ApiQuery;
use crate::domain::{
    Cursor, InvalidInput, Key, Page, PageLimit, Recovery, RecoveryReason, RefusalReason, Rejection,
};
use crate::http::AppState;
use crate::store::audit::{self, AuditQuery};

pub(super) fn routes() -> Routes {
    Routes::new()
        .route("/v1/audit/rejections", get(rejections))
        .route("/v1/audit/recoveries", get(recoveries))
}

/// The query of an audit page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    since: Option<String>,
    #[serde(default)]
    until: Option<String>,
    #[serde(default)]
    limit: Option<i64>,
    #[serde(default)]
    cursor: Option<String>,
}

fn time(name: &str, raw: Option<String>) -> Result<Option<DateTime<Utc>>, InvalidInput> {
    raw.map(|s| {
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| {
                InvalidInput::new(format!(
                    "{name} {s:?} is not an RFC 3339 time ({e}); write e.g. 2026-12-02T13:05:00Z"
                ))
            })
    })
    .transpose()
}

impl AuditParams {
    fn into_query(
        self,
        parse: fn(&str) -> Option<&'static str>,
        reasons: &str,
    ) -> Result<AuditQuery, ApiError> {
        let reason = self
            .reason
            .map(|r| {
                parse(&r).ok_or_else(|| {
                    InvalidInput::new(format!("reason {r:?} is not one of {reasons}"))
                })
            })
            .transpose()?;
        Ok(AuditQuery {
            key: self.key.map(Key::parse).transpose()?,
            reason,
            since: time("since", self.since)?,
            until: time("until", self.until)?,
            limit: PageLimit::new(self.limit)?,
            before_id: self
                .cursor
                .as_deref()
                .map(Cursor::decode_number)
                .transpose()?,
        })
    }
}

async fn rejections(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<AuditParams>,
) -> Result<Json<Page<Rejection>>, ApiError> {
    let q = params.into_query(
        |r| RefusalReason::parse(r).map(RefusalReason::as_str),
        "stale_token, unknown_token",
    )?;
    Ok(Json(audit::rejections(&state.db, &q).await?))
}

async fn recoveries(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<AuditParams>,
) -> Result<Json<Page<Recovery>>, ApiError> {
    let q = params.into_query(
        |r| RecoveryReason::parse(r).map(RecoveryReason::as_str),
        "abandoned, expired, recovery_required",
    )?;
    Ok(Json(audit::recoveries(&state.db, &q).await?))
}
