//! The end state of a run, read through the API once the clients are done.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use super::in_path;
use crate::checker::{AuditRow, FinalState, Version};

/// What the service holds at the end: every version of every key and the whole rejections
/// log, read through the API of the service at `base`. Retried for a while, since the service
/// may still be reconnecting after the last fault.
pub async fn final_state(base: &str, keys: &[String]) -> FinalState {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match read_final_state(&http, base, keys).await {
            Ok(state) => return state,
            Err(e) if Instant::now() < deadline => {
                eprintln!("reading the final state: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("could not read the final state: {e}"),
        }
    }
}

async fn read_final_state(
    http: &reqwest::Client,
    base: &str,
    keys: &[String],
) -> Result<FinalState, String> {
    let mut end = FinalState::default();
    for key in keys {
        let mut versions: Vec<Version> = pages(
            http,
            &format!("{base}/v1/snapshots/{}/versions", in_path(key)),
        )
        .await?
        .into_iter()
        .map(|v| Version {
            version: v["version"].as_i64().unwrap_or_default(),
            token: v["token"].as_i64().unwrap_or_default(),
            etag: v["etag"].as_str().unwrap_or_default().to_owned(),
        })
        .collect();
        versions.reverse();
        if !versions.is_empty() {
            end.versions.insert(key.clone(), versions);
        }
    }
    end.rejections = pages(http, &format!("{base}/v1/audit/rejections"))
        .await?
        .into_iter()
        .map(|r| AuditRow {
            id: r["id"].as_i64().unwrap_or_default(),
            request_id: r["request_id"].as_str().map(str::to_owned),
            key: r["key"].as_str().unwrap_or_default().to_owned(),
            reason: r["reason"].as_str().unwrap_or_default().to_owned(),
            presented_token: r["presented_token"].as_i64().unwrap_or_default(),
            operation: r["operation"].as_str().unwrap_or_default().to_owned(),
            fencing_key: r["fencing_key"].as_str().unwrap_or_default().to_owned(),
        })
        .collect();
    Ok(end)
}

/// Every item of a paged list; a list of a key with no snapshot is empty.
async fn pages(http: &reqwest::Client, url: &str) -> Result<Vec<Value>, String> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut request = http.get(url).query(&[("limit", "1000")]);
        if let Some(c) = &cursor {
            request = request.query(&[("cursor", c)]);
        }
        let r = request.send().await.map_err(|e| e.to_string())?;
        if r.status() == StatusCode::NOT_FOUND {
            return Ok(items);
        }
        if r.status() != StatusCode::OK {
            return Err(format!("{url} answered {}", r.status()));
        }
        let page: Value = r.json().await.map_err(|e| e.to_string())?;
        items.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(items),
        }
    }
}
