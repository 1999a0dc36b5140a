//! A typed client of the HTTP contract (`docs/api.md`): [`Client`] has one method per
//! endpoint, [`Error`] one variant per contract code, and [`LeaseKeeper`] holds a lease for as
//! long as a piece of work runs.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use snapfence_client::{AcquireRequest, Client, PutOptions};
//! use snapfence_client::{Key, Owner};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new("http://127.0.0.1:7878")?;
//! let key = Key::parse("jobs/42")?;
//! let grant = client
//!     .acquire(&key, &AcquireRequest::new(Owner::parse("worker-7")?, Duration::from_secs(30)))
//!     .await?;
//! let written = client
//!     .put_snapshot(&key, grant.lease.token, "state v1", &PutOptions::default())
//!     .await?;
//! println!("stored version {} as {}", written.meta.version, written.meta.etag);
//! client.release(&key, grant.lease.token).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Timeouts and retries
//!
//! Every attempt is bounded by [`ClientBuilder::timeout`] (connecting by
//! [`ClientBuilder::connect_timeout`]). A failed attempt is retried, with exponential backoff and
//! jitter, up to [`RetryPolicy::max_attempts`], only when the retry cannot do harm:
//! - any call, when nothing reached the server (the connection could not be made), or when the
//!   server answered `503 unavailable`, which the contract guarantees changed nothing;
//! - reads (`GET`, `HEAD`) and renewals, which change nothing or the same thing again, also
//!   after a broken connection, a timeout or another 5xx.
//!
//! Writes (acquire, release, abandon, require-recovery, put, delete) are never retried once they
//! may have reached the server. [`Error::is_indeterminate`] tells such a failure, and [`Error`]
//! says how to find out what happened.

mod error;
mod keeper;
mod types;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use rand::Rng;
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::de::DeserializeOwned;

pub use self::error::Error;
pub use self::keeper::{KeeperOptions, LeaseKeeper, LostReason};
pub use self::types::{
    AuditFilter, LeaseFilter, PageRequest, PutOptions, Snapshot, SnapshotHead, Written,
};
use snapfence_types::headers::{FENCING_TOKEN, SNAPSHOT_VERSION};
/// The contract's vocabulary, re-exported so that a user of the client needs no second crate.
pub use snapfence_types::*;

/// Result of a client call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How failed attempts are retried (see the [module docs](self) for which ones are).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; 1 never retries.
    pub max_attempts: u32,
    /// The pause before the first retry; each further pause doubles, up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retries: for callers that retry on their own terms, as [`LeaseKeeper`]
    /// does against the lease's deadline.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// The pause before retry `n` (1-based): the doubled backoff, of which a random half is
    /// taken off so that many clients failing together do not retry together.
    pub fn backoff(&self, n: u32) -> Duration {
        jittered(
            self.initial_backoff
                .saturating_mul(2u32.saturating_pow(n.saturating_sub(1)))
                .min(self.max_backoff),
        )
    }
}

/// Between half of `d` and `d`, at random.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::rng().random_range(0.5..=1.0))
}

/// Whether a call changes nothing when it is repeated, which decides what may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idempotency {
    /// Reads, and renewals (a second renewal of a live lease only extends it again).
    Idempotent,
    /// Writes: a repeat after an unknown outcome could apply it twice, or mislead the caller.
    Unsafe,
}

impl Idempotency {
    fn may_retry(self, e: &Error) -> bool {
        match e {
            Error::Transport {
                may_have_reached: false,
                ..
            }
            | Error::Unavailable { .. } => true,
            _ => self == Self::Idempotent && e.is_transient(),
        }
    }
}

/// Called before each retry with the failure and the pause before the next attempt, so that
/// whoever waits can be told.
#[derive(Clone)]
struct OnRetry(Arc<RetryHook>);

/// What [`ClientBuilder::on_retry`] takes.
type RetryHook = dyn Fn(&Error, Duration) + Send + Sync;

impl fmt::Debug for OnRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnRetry(..)")
    }
}

/// An API key's bearer token, kept out of `Debug` output so that it never reaches a log.
#[derive(Clone)]
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: String,
    timeout: Duration,
    connect_timeout: Duration,
    retry: RetryPolicy,
    on_retry: Option<OnRetry>,
    api_key: Option<ApiKey>,
    roots: Vec<Vec<u8>>,
}

impl ClientBuilder {
    /// How long one attempt may take, from sending to the last byte of the answer. Default 10 s.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long making a connection may take. Default 3 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How failed attempts are retried. Default [`RetryPolicy::default`].
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Calls `f` before each retry with the failure and the pause before the next attempt, e.g.
    /// to tell a person why a command takes long.
    pub fn on_retry(mut self, f: impl Fn(&Error, Duration) + Send + Sync + 'static) -> Self {
        self.on_retry = Some(OnRetry(Arc::new(f)));
        self
    }

    /// Sends `token` (`sf_<id>_<secret>`, as `snapfence keys create` shows it) as
    /// `Authorization: Bearer` with every request. Needed once the server has any API key.
    pub fn api_key(mut self, token: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey(token.into()));
        self
    }

    /// Also trusts the CA (or self-signed) certificates in `pem` for `https` URLs, besides the
    /// usual public roots.
    pub fn root_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.roots.push(pem.into());
        self
    }

    /// The client. Fails with [`Error::InvalidRequest`] when the base URL is not an `http` or
    /// `https` URL, the API key is not a valid header value, or a root certificate is not PEM.
    pub fn build(self) -> Result<Client> {
        let url = reqwest::Url::parse(&self.base).map_err(|e| {
            Error::invalid(format!(
                "{:?} is not a URL ({e}); write it as http://host:port",
                self.base
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.query().is_some() {
            return Err(Error::invalid(format!(
                "{:?} is not an http(s) URL without a query; write it as http://host:port",
                self.base
            )));
        }
        let mut headers = HeaderMap::new();
        if let Some(ApiKey(token)) = &self.api_key {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                Error::invalid("the API key holds characters a header cannot carry; pass it exactly as `snapfence keys create` showed it")
            })?;
            // Sensitive values are left out of hyper's and reqwest's debug output.
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        let mut http = reqwest::Client::builder()
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout)
            .default_headers(headers)
            .user_agent(concat!("snapfence/", env!("CARGO_PKG_VERSION")));
        for pem in &self.roots {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .ok()
                .filter(|certs| !certs.is_empty())
                .ok_or_else(|| {
                    Error::invalid("a root certificate file holds no PEM certificate")
                })?;
            for cert in certs {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http
            .build()
            .map_err(|e| Error::invalid(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Client {
            http,
            base: Arc::from(self.base.trim_end_matches('/')),
            retry: self.retry,
            on_retry: self.on_retry,
        })
    }
}

/// A client of one snapfence service. Cheap to clone; clones share their connections.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Arc<str>,
    retry: RetryPolicy,
    on_retry: Option<OnRetry>,
}

/// A buffered answer: every answer of the contract is small except snapshot bodies, which the
/// server bounds, so reading the body within the attempt lets a read that breaks halfway be
/// retried like any other failed attempt.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

/// A request as messages name it: `GET /v1/leases/jobs%2F42`.
struct Call<'a> {
    method: Method,
    path: &'a str,
}

impl fmt::Display for Call<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

impl Client {
    /// A client of the service at `base` (e.g. `http://127.0.0.1:7878`) with the default
    /// timeouts and retries.
    pub fn new(base: impl Into<String>) -> Result<Self> {
        Self::builder(base).build()
    }

    /// A builder for a client of the service at `base`.
    pub fn builder(base: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base: base.into(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            retry: RetryPolicy::default(),
            on_retry: None,
            api_key: None,
            roots: Vec::new(),
        }
    }

    /// The service's base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// The same client with another retry policy, sharing its connections.
    pub fn with_retry(&self, retry: RetryPolicy) -> Self {
        Self {
            retry,
            ..self.clone()
        }
    }

    /// Sends a request, retrying the attempts that `idempotency` allows, and returns the answer
    /// when its status is one of `ok`; any other status becomes its [`Error`].
    async fn send(
        &self,
        idempotency: Idempotency,
        call: Call<'_>,
        ok: &[StatusCode],
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<Answer> {
        let url = format!("{}{}", self.base, call.path);
        let mut attempt = 1;
        loop {
            let request = build(self.http.request(call.method.clone(), &url));
            let error = match attempt_once(request).await {
                Ok(answer) if ok.contains(&answer.status) => return Ok(answer),
                Ok(answer) => {
                    Error::from_answer(answer.status, &answer.headers, &answer.body, &call)
                }
                Err(e) => Error::transport(e),
            };
            if attempt >= self.retry.max_attempts || !idempotency.may_retry(&error) {
                return Err(error);
            }
            let pause = self.retry.backoff(attempt);
            tracing::debug!(%call, attempt, error = %error, ?pause, "retrying");
            if let Some(OnRetry(f)) = &self.on_retry {
                f(&error, pause);
            }
            tokio::time::sleep(pause).await;
            attempt += 1;
        }
    }

    /// [`send`](Self::send), then the answer's JSON body as `T`.
    async fn send_json<T: DeserializeOwned>(
        &self,
        idempotency: Idempotency,
        call: Call<'_>,
        ok: &[StatusCode],
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<T> {
        let what = call.to_string();
        let answer = self.send(idempotency, call, ok, build).await?;
        serde_json::from_slice(&answer.body).map_err(|e| Error::Protocol {
            detail: format!("the answer to {what} is not the contract's JSON: {e}"),
        })
    }

    /// `POST /v1/leases/{key}`: acquire. Never waits: a live lease of anyone answers
    /// [`Error::LeaseHeld`], a retained recovery record [`Error::RecoveryRequired`].
    pub async fn acquire(&self, key: &Key, request: &AcquireRequest) -> Result<Grant> {
        let path = format!("/v1/leases/{}", segment(key)?);
        self.send_json(
            Idempotency::Unsafe,
            Call {
                method: Method::POST,
                path: &path,
            },
            &[StatusCode::CREATED],
            |r| r.json(request),
        )
        .await
    }

    /// `POST /v1/leases/{key}/renew`: extends the live lease of `token` by `ttl`, or by its own
    /// TTL when `None`. [`Error::LeaseLost`] when the token is not the key's live lease.
    pub async fn renew(
        &self,
        key: &Key,
        token: FencingToken,
        ttl: Option<Duration>,
    ) -> Result<Lease> {
        let body = RenewRequest::new(token, ttl);
        let path = format!("/v1/leases/{}/renew", segment(key)?);
        self.send_json(
            Idempotency::Idempotent,
            Call {
                method: Method::POST,
                path: &path,
            },
            &[StatusCode::OK],
            |r| r.json(&body),
        )
        .await
    }

    /// A fenced call on a lease that answers `204`.
    async fn end(&self, method: Method, path: String, token: FencingToken) -> Result<()> {
        self.send(
            Idempotency::Unsafe,
            Call {
                method,
                path: &path,
            },
            &[StatusCode::NO_CONTENT],
            |r| r.header(FENCING_TOKEN, token.get()),
        )
        .await
        .map(drop)
    }

    /// `DELETE /v1/leases/{key}`: release; the key is free at once, unless require-recovery
    /// marked the lease.
    pub async fn release(&self, key: &Key, token: FencingToken) -> Result<()> {
        let path = format!("/v1/leases/{}", segment(key)?);
        self.end(Method::DELETE, path, token).await
    }

    /// `POST /v1/leases/{key}/abandon`: unlock, but keep a recovery record.
    pub async fn abandon(&self, key: &Key, token: FencingToken) -> Result<()> {
        let path = format!("/v1/leases/{}/abandon", segment(key)?);
        self.end(Method::POST, path, token).await
    }

    /// `POST /v1/leases/{key}/require-recovery`: mark cleanup incomplete while still holding;
    /// the lease's later release or expiry leaves a recovery record.
    pub async fn require_recovery(&self, key: &Key, token: FencingToken) -> Result<()> {
        let path = format!("/v1/leases/{}/require-recovery", segment(key)?);
        self.end(Method::POST, path, token).await
    }

    /// `GET /v1/leases/{key}`: the key's state, newest lease and recovery record.
    /// [`Error::NotFound`] for a key never leased.
    pub async fn lease_status(&self, key: &Key) -> Result<KeyStatus> {
        let path = format!("/v1/leases/{}", segment(key)?);
        self.get_json(&path, |r| r).await
    }

    /// `GET /v1/leases`: one page of keys, in key order.
    pub async fn list_leases(&self, filter: &LeaseFilter) -> Result<Page<KeyStatus>> {
        self.get_json("/v1/leases", |r| r.query(filter)).await
    }

    async fn get_json<T: DeserializeOwned>(
        &self,
        path: &str,
        build: impl Fn(RequestBuilder) -> RequestBuilder,
    ) -> Result<T> {
        self.send_json(
            Idempotency::Idempotent,
            Call {
                method: Method::GET,
                path,
            },
            &[StatusCode::OK],
            build,
        )
        .await
    }

    /// `PUT /v1/snapshots/{key}`: a fenced write. Accepted only when `token` is the key's newest
    /// token and its lease was not given up; otherwise [`Error::StaleToken`] or
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
        let answer = self
            .send(
                Idempotency::Unsafe,
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
        let path = format!("/v1/snapshots/{}", segment(key)?);
        self.send(
            Idempotency::Unsafe,
            Call {
                method: Method::DELETE,
                path: &path,
            },
            &[StatusCode::NO_CONTENT],
            |r| {
                with_condition(
                    r.header(FENCING_TOKEN, token.get()),
                    header::IF_MATCH,
                    if_match,
                )
            },
        )
        .await
        .map(drop)
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
            Idempotency::Idempotent,
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

    /// `GET /v1/audit/rejections`: refused fenced writes, newest first.
    pub async fn rejections(&self, filter: &AuditFilter<RefusalReason>) -> Result<Page<Rejection>> {
        self.get_json("/v1/audit/rejections", |r| r.query(filter))
            .await
    }

    /// `GET /v1/audit/recoveries`: replaced recovery records, newest first.
    pub async fn recoveries(&self, filter: &AuditFilter<RecoveryReason>) -> Result<Page<Recovery>> {
        self.get_json("/v1/audit/recoveries", |r| r.query(filter))
            .await
    }

    /// `GET /healthz`: the process is up.
    pub async fn healthz(&self) -> Result<Health> {
        self.get_json("/healthz", |r| r).await
    }

    /// `GET /readyz`: the database answers and is migrated; [`Error::Unavailable`] otherwise.
    pub async fn readyz(&self) -> Result<Health> {
        self.get_json("/readyz", |r| r).await
    }
}

/// One attempt, the body read to its end.
async fn attempt_once(request: RequestBuilder) -> reqwest::Result<Answer> {
    let response = request.send().await?;
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.bytes().await?;
    Ok(Answer {
        status,
        headers,
        body,
    })
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

/// Percent-encodes a key as one path segment: everything but RFC 3986's unreserved characters.
/// `.` and `..` are refused: URL parsers (WHATWG, and so reqwest) resolve them as dot segments,
/// also when percent-encoded, so no URL can name such a key.
fn segment(key: &Key) -> Result<String> {
    if matches!(key.as_str(), "." | "..") {
        return Err(Error::invalid(format!(
            "key {key:?} cannot be sent in a URL path, where it means a directory; choose another key"
        )));
    }
    Ok(key
        .as_str()
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect())
}

fn header_text<'a>(answer: &'a Answer, name: &str, path: &str) -> Result<&'a str> {
    answer
        .headers
        .get(name)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .ok_or_else(|| Error::Protocol {
            detail: format!("the answer to {path} has no valid {name} header"),
        })
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
    Ok(SnapshotHead {
        key: key.clone(),
        version,
        token,
        etag,
        content_type,
        size,
        last_modified,
    })
}

fn snapshot_of(key: &Key, answer: Answer, path: &str) -> Result<Snapshot> {
    let head = head_of(key, &answer, path)?;
    Ok(Snapshot {
        head,
        body: answer.body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_one_percent_encoded_segment() {
        let key = |s: &str| Key::parse(s).unwrap();
        assert_eq!(segment(&key("jobs/42")).unwrap(), "jobs%2F42");
        assert_eq!(segment(&key("a b%é")).unwrap(), "a%20b%25%C3%A9");
        assert_eq!(segment(&key("v1.2~x_y-z")).unwrap(), "v1.2~x_y-z");
        assert_eq!(segment(&key("...")).unwrap(), "...");
        assert!(segment(&key(".")).is_err());
        assert!(segment(&key("..")).is_err());
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
        };
        for (n, full) in [(1, 100), (2, 200), (3, 350), (8, 350)] {
            let d = policy.backoff(n);
            let full = Duration::from_millis(full);
            assert!(d >= full / 2 && d <= full, "retry {n}: {d:?}");
        }
    }

    #[test]
    fn only_harmless_retries_are_allowed() {
        let unavailable = Error::Unavailable {
            detail: String::new(),
        };
        let bad_gateway = Error::Unexpected {
            status: StatusCode::BAD_GATEWAY,
            detail: String::new(),
            request_id: None,
        };
        let lost = Error::LeaseLost {
            detail: String::new(),
        };
        assert!(Idempotency::Unsafe.may_retry(&unavailable));
        assert!(!Idempotency::Unsafe.may_retry(&bad_gateway));
        assert!(Idempotency::Idempotent.may_retry(&bad_gateway));
        assert!(!Idempotency::Idempotent.may_retry(&lost));
        assert!(bad_gateway.is_indeterminate() && !unavailable.is_indeterminate());
    }
}
