//! What an answer of the service, or its absence, says about a call: the [`Outcome`] the
//! checker judges.

use reqwest::{Response, StatusCode};
use serde_json::Value;

use crate::checker::{Answer, Call, INDETERMINATE, Outcome, UNREPORTED_GRANT, Version};

/// What an answer (or its absence) says about the call; `owner` is the owner an acquire asked
/// for, which no other call's lease has.
pub(super) async fn outcome(
    call: &Call,
    owner: &str,
    answer: reqwest::Result<Response>,
) -> Outcome {
    let r = match answer {
        Ok(r) => r,
        Err(e) => return Outcome::Indeterminate(transport_error(&e)),
    };
    let status = r.status();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        // The contract's two 503s: `unavailable` promises that nothing changed, `indeterminate`
        // does not. Anything else (a proxy's 503, a body that cannot be read) promises nothing.
        let code = r
            .json::<Value>()
            .await
            .ok()
            .and_then(|p| p["code"].as_str().map(str::to_owned));
        return match code.as_deref() {
            Some("unavailable") => Outcome::NoEffect,
            Some("indeterminate") => Outcome::Indeterminate(INDETERMINATE.into()),
            _ => Outcome::Indeterminate(format!("503 with the code {code:?}")),
        };
    }
    if matches!(call, Call::Get) && status == StatusCode::OK {
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let seen = (|| {
            Some(Version {
                version: header("snapshot-version")?.parse().ok()?,
                token: header("fencing-token")?.parse().ok()?,
                etag: header("etag")?,
            })
        })();
        return match seen {
            Some(v) => Outcome::Ok(Answer::Read(Some(v))),
            None => Outcome::Unexpected("a snapshot without its headers".into()),
        };
    }
    let body: Value = match r.bytes().await {
        Ok(bytes) if bytes.is_empty() => Value::Null,
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => return Outcome::Unexpected(format!("{status} with a body that is not JSON")),
        },
        Err(e) => return Outcome::Indeterminate(transport_error(&e)),
    };
    let number = |field: &str| body[field].as_i64();
    match (call, status.as_u16()) {
        (Call::Acquire { .. }, 201) => number("token").map_or_else(
            || Outcome::Unexpected(format!("a grant without a token: {body}")),
            |token| Outcome::Ok(Answer::Granted { token }),
        ),
        (Call::Renew { .. }, 200) | (Call::Release { .. }, 204) => Outcome::Ok(Answer::Done),
        (Call::Put { .. }, 200 | 201) => number("version").map_or_else(
            || Outcome::Unexpected(format!("a write without a version: {body}")),
            |version| Outcome::Ok(Answer::Written { version }),
        ),
        (Call::Get, 404) => Outcome::Ok(Answer::Read(None)),
        (Call::Txn { puts, .. }, 200) => {
            let versions: Option<Vec<i64>> = body["results"]
                .as_array()
                .and_then(|results| results.iter().map(|r| r["version"].as_i64()).collect());
            match versions {
                Some(versions) if versions.len() == puts.len() => {
                    Outcome::Ok(Answer::Committed { versions })
                }
                _ => Outcome::Unexpected(format!(
                    "a committed transaction without a version for each of its {} puts: {body}",
                    puts.len()
                )),
            }
        }
        (Call::Acquire { .. }, 409) if body["holder"]["owner"] == owner => {
            Outcome::Unexpected(UNREPORTED_GRANT.into())
        }
        (_, 409 | 412) => match body["code"].as_str() {
            Some(code) => Outcome::Refused {
                code: code.to_owned(),
                audit_id: number("audit_id"),
            },
            None => Outcome::Unexpected(format!("{status} without a code: {body}")),
        },
        _ => Outcome::Unexpected(format!("{status}: {body}")),
    }
}

fn transport_error(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection refused".into()
    } else {
        "connection lost".into()
    }
}
