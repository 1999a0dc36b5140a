//! The snapshot calls: fenced writes and deletes, reads, versions, and finding a write whose
//! outcome is unknown.

use std::fmt;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use reqwest::header;
use reqwest::{Method, RequestBuilder, StatusCode};
use snapfence_types::headers::{FENCING_KEY, FENCING_TOKEN, SNAPSHOT_METADATA, SNAPSHOT_VERSION};
use snapfence_types::{
    ETag, EntityTagCondition, FencingToken, Key, Metadata, Page, SnapshotMeta, TxnBody, TxnOpBody,
    Version,
};

use crate::retry::CallKind;
use crate::transport::{Answer, Call, header_text, segment};
use crate::{
    Client, Error, PageRequest, PutOptions, Result, Snapshot, SnapshotFilter, SnapshotHead,
    TxnAnswer, TxnOp, Written,
};

impl Client {
    /// `PUT /v1/snapshots/{key}`: a fenced write. Accepted only when `token` is the newest token
    /// of its fence (the key, or [`PutOptions::fence`] whose namespace holds it), that lease was
    /// not given up, and no newer token wrote the key; otherwise [`Error::StaleToken`] or
    /// [`Error::UnknownToken`], both recorded in the audit log.
    pub async fn put_snapshot(
        &self,
        key: &Key,
        token: FencingToken,
        body: impl Into<Bytes>,
        options: &PutOptions,
    ) -> Result<Written> {
        let body = body.into();
        let path = format!("/v1/snapshots/{}", segment(key)?);
        let fence = options.fence.as_ref().map(segment).transpose()?;
        let answer = self
            .send(
                CallKind::Change,
                Call {
                    method: Method::PUT,
                    path: &path,
                },
                &[StatusCode::CREATED, StatusCode::OK],
                |r| {
                    let r = r.header(FENCING_TOKEN, token.get()).body(body.clone());
                    let r = match &options.content_type {
                        Some(ct) => r.header(header::CONTENT_TYPE, ct),
                        None => r,
                    };
                    let r = match &fence {
                        Some(fence) => r.header(FENCING_KEY, fence),
                        None => r,
                    };
                    let r = match &options.metadata {
                        Some(m) => r.header(SNAPSHOT_METADATA, m.to_header()),
                        None => r,
                    };
                    with_condition(r, header::IF_MATCH, options.if_match.as_ref())
                },
            )
            .await?;
        let meta: SnapshotMeta =
            serde_json::from_slice(&answer.body).map_err(|e| Error::Protocol {
                detail: format!("the answer to PUT {path} is not the contract's JSON: {e}"),
            })?;
        Ok(Written {
            meta,
            created: answer.status == StatusCode::CREATED,
        })
    }

    /// `DELETE /v1/snapshots/{key}`: a fenced delete, by the same token rule as a write.
    pub async fn delete_snapshot(
        &self,
        key: &Key,
        token: FencingToken,
        if_match: Option<&EntityTagCondition>,
    ) -> Result<()> {
        self.delete_snapshot_under(key, None, token, if_match).await
    }

    /// `DELETE /v1/snapshots/{key}` fenced by the lease on `fence` (v1.3 `Fencing-Key`), whose
    /// namespace holds the key; by the key's own lease when `None`.
    pub async fn delete_snapshot_under(
        &self,
        key: &Key,
        fence: Option<&Key>,
        token: FencingToken,
        if_match: Option<&EntityTagCondition>,
    ) -> Result<()> {
        let path = format!("/v1/snapshots/{}", segment(key)?);
        let fence = fence.map(segment).transpose()?;
        self.send(
            CallKind::Change,
            Call {
                method: Method::DELETE,
                path: &path,
            },
            &[StatusCode::NO_CONTENT],
            |r| {
                let r = r.header(FENCING_TOKEN, token.get());
                let r = match &fence {
                    Some(fence) => r.header(FENCING_KEY, fence),
                    None => r,
                };
                with_condition(r, header::IF_MATCH, if_match)
            },
        )
        .await
        .map(drop)
    }

    /// `POST /v1/txn` (v1.3): `ops` under the lease on `fence`, all or nothing. A fence that
    /// refuses `token` is [`Error::StaleToken`] or [`Error::UnknownToken`] (audited once); a
    /// failed precondition is [`Error::PreconditionFailed`] naming its op; nothing is written
    /// then. Sent with an Idempotency-Key and retried like any change, so it is done once.
    pub async fn txn(&self, fence: &Key, token: FencingToken, ops: &[TxnOp]) -> Result<TxnAnswer> {
        let encoded = segment(fence)?;
        let body = TxnBody {
            ops: ops.iter().map(TxnOpBody::from).collect(),
        };
        let answer = self
            .send(
                CallKind::Change,
                Call {
                    method: Method::POST,
                    path: "/v1/txn",
                },
                &[StatusCode::OK],
                |r| {
                    r.header(FENCING_KEY, &encoded)
                        .header(FENCING_TOKEN, token.get())
                        .json(&body)
                },
            )
            .await?;
        serde_json::from_slice(&answer.body).map_err(|e| Error::Protocol {
            detail: format!("the answer to POST /v1/txn is not the contract's JSON: {e}"),
        })
    }

    /// `GET /v1/snapshots/{key}`: the current snapshot. [`Error::NotFound`] if never written.
    pub async fn get_snapshot(&self, key: &Key) -> Result<Snapshot> {
        let path = format!("/v1/snapshots/{}", segment(key)?);
        let answer = self.read(Method::GET, &path, None).await?;
        snapshot_of(key, answer, &path)
    }

    /// `GET /v1/snapshots/{key}` with `If-None-Match`: `None` when the current snapshot matches
    /// (`304`), so a cached copy is still current.
    pub async fn get_snapshot_if_none_match(
        &self,
        key: &Key,
        if_none_match: &EntityTagCondition,
    ) -> Result<Option<Snapshot>> {
        let path = format!("/v1/snapshots/{}", segment(key)?);
        let answer = self.read(Method::GET, &path, Some(if_none_match)).await?;
        if answer.status == StatusCode::NOT_MODIFIED {
            return Ok(None);
        }
        snapshot_of(key, answer, &path).map(Some)
    }

    /// `HEAD /v1/snapshots/{key}`: what the current snapshot's headers say, without its body.
    pub async fn head_snapshot(&self, key: &Key) -> Result<SnapshotHead> {
        let path = format!("/v1/snapshots/{}", segment(key)?);
        let answer = self.read(Method::HEAD, &path, None).await?;
        head_of(key, &answer, &path)
    }

    /// `GET /v1/snapshots/{key}/versions/{version}`: a retained version. [`Error::NotFound`]
    /// once it is pruned.
    pub async fn get_version(&self, key: &Key, version: Version) -> Result<Snapshot> {
        let path = format!("/v1/snapshots/{}/versions/{version}", segment(key)?);
        let answer = self.read(Method::GET, &path, None).await?;
        snapshot_of(key, answer, &path)
    }

    async fn read(
        &self,
        method: Method,
        path: &str,
        if_none_match: Option<&EntityTagCondition>,
    ) -> Result<Answer> {
        self.send(
            CallKind::Read,
            Call { method, path },
            &[StatusCode::OK, StatusCode::NOT_MODIFIED],
            |r| with_condition(r, header::IF_NONE_MATCH, if_none_match),
        )
        .await
    }

    /// `GET /v1/snapshots/{key}/versions`: the retained versions, newest first.
    pub async fn list_versions(&self, key: &Key, page: &PageRequest) -> Result<Page<SnapshotMeta>> {
        let path = format!("/v1/snapshots/{}/versions", segment(key)?);
        self.get_json(&path, |r| r.query(page)).await
    }

    /// `GET /v1/snapshots`: one page of the keys that have a current snapshot, in key order or
    /// reversed, each with that snapshot's head (`key` set).
    pub async fn list_snapshots(&self, filter: &SnapshotFilter) -> Result<Page<SnapshotMeta>> {
        self.get_json("/v1/snapshots", |r| r.query(filter)).await
    }

    /// Resolves a put whose outcome is unknown ([`Error::is_indeterminate`]): the retained
    /// version written with `token` whose ETag is `etag` (that is, [`ETag::of`] the body sent),
    /// or `None` if no retained version is. Since only the holder of `token` can write with it,
    /// a match is that write, also when a later version has superseded it.
    pub async fn find_write(
        &self,
        key: &Key,
        token: FencingToken,
        etag: &ETag,
    ) -> Result<Option<SnapshotMeta>> {
        let mut page = PageRequest::default();
        loop {
            let versions = match self.list_versions(key, &page).await {
                Err(Error::NotFound { .. }) => return Ok(None),
                other => other?,
            };
            if let Some(found) = versions
                .items
                .into_iter()
                .find(|v| v.token == token && &v.etag == etag)
            {
                return Ok(Some(found));
            }
            match versions.next_cursor {
                Some(cursor) => page.cursor = Some(cursor),
                None => return Ok(None),
            }
        }
    }
}

fn with_condition(
    r: RequestBuilder,
    name: header::HeaderName,
    condition: Option<&EntityTagCondition>,
) -> RequestBuilder {
    match condition {
        Some(c) => r.header(name, c.to_string()),
        None => r,
    }
}

fn head_of(key: &Key, answer: &Answer, path: &str) -> Result<SnapshotHead> {
    let protocol = |name: &str, e: &dyn fmt::Display| Error::Protocol {
        detail: format!("the {name} header of the answer to {path} is malformed: {e}"),
    };
    let etag = ETag::parse(header_text(answer, "etag", path)?).map_err(|e| protocol("ETag", &e))?;
    let token = FencingToken::parse_header(header_text(answer, FENCING_TOKEN, path)?)
        .map_err(|e| protocol("Fencing-Token", &e))?;
    let version = Version::parse(header_text(answer, SNAPSHOT_VERSION, path)?)
        .map_err(|e| protocol("Snapshot-Version", &e))?;
    let last_modified = DateTime::parse_from_rfc2822(header_text(answer, "last-modified", path)?)
        .map_err(|e| protocol("Last-Modified", &e))?
        .with_timezone(&Utc);
    let content_type = answer
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned();
    let size = match answer.headers.get(header::CONTENT_LENGTH) {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol("Content-Length", &"not a number"))?,
        None => answer.body.len() as u64,
    };
    let fencing_key = match answer.headers.get(FENCING_KEY) {
        None => None,
        Some(v) => {
            let text = v.to_str().map_err(|e| protocol("Fencing-Key", &e))?;
            Some(Key::from_segment(text).map_err(|e| protocol("Fencing-Key", &e))?)
        }
    };
    let metadata = match answer.headers.get(SNAPSHOT_METADATA) {
        None => None,
        Some(v) => {
            let value: serde_json::Value = v
                .to_str()
                .ok()
                .and_then(|t| serde_json::from_str(t).ok())
                .ok_or_else(|| protocol("Snapshot-Metadata", &"not a JSON object"))?;
            Some(Metadata::new(value).map_err(|e| protocol("Snapshot-Metadata", &e))?)
        }
    };
    Ok(SnapshotHead {
        key: key.clone(),
        version,
        token,
        etag,
        content_type,
        size,
        last_modified,
        fencing_key,
        metadata,
    })
}

fn snapshot_of(key: &Key, answer: Answer, path: &str) -> Result<Snapshot> {
    let head = head_of(key, &answer, path)?;
    Ok(Snapshot {
        head,
        body: answer.body,
    })
}
