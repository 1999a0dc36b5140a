//! [`ClientBuilder`]: timeouts, retries, the API key and private CA roots of a [`Client`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{self, HeaderMap, HeaderValue};

use crate::retry::{OnRetry, RetryPolicy};
use crate::{Client, Error, Result};

/// An API key's bearer token, kept out of `Debug` output so that it never reaches a log.
#[derive(Clone)]
struct ApiKey(String);

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl Client {
    /// A builder for a client of the service at `base`.
    pub fn builder(base: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base: base.into(),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            watch_idle_timeout: Duration::from_secs(45),
            retry: RetryPolicy::default(),
            on_retry: None,
            api_key: None,
            roots: Vec::new(),
        }
    }
}

/// Builds a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base: String,
    timeout: Duration,
    connect_timeout: Duration,
    watch_idle_timeout: Duration,
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

    /// How long a watch ([`Client::watch`]) may go without receiving a byte, heartbeats
    /// included, before it takes its connection for dead and resumes on a new one. Default
    /// 45 s: three times the longest pause between the server's heartbeats that the contract
    /// allows (15 s).
    pub fn watch_idle_timeout(mut self, timeout: Duration) -> Self {
        self.watch_idle_timeout = timeout;
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
        let mut roots = Vec::new();
        for pem in &self.roots {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .ok()
                .filter(|certs| !certs.is_empty())
                .ok_or_else(|| {
                    Error::invalid("a root certificate file holds no PEM certificate")
                })?;
            roots.extend(certs);
        }
        let http = |bound: fn(reqwest::ClientBuilder, Duration) -> reqwest::ClientBuilder,
                    by: Duration| {
            let mut http = reqwest::Client::builder()
                .connect_timeout(self.connect_timeout)
                .default_headers(headers.clone())
                .user_agent(concat!("snapfence/", env!("CARGO_PKG_VERSION")));
            for cert in &roots {
                http = http.add_root_certificate(cert.clone());
            }
            bound(http, by)
                .build()
                .map_err(|e| Error::invalid(format!("cannot set up the HTTP client: {e}")))
        };
        // A watch's answer never ends by itself, so no bound on the whole call fits it: its
        // own client bounds each read instead, which the server's heartbeats keep short.
        let watch_http = http(
            reqwest::ClientBuilder::read_timeout,
            self.watch_idle_timeout,
        )?;
        let http = http(reqwest::ClientBuilder::timeout, self.timeout)?;
        Ok(Client {
            http,
            watch_http,
            base: Arc::from(self.base.trim_end_matches('/')),
            retry: self.retry,
            on_retry: self.on_retry,
            timeout: self.timeout,
        })
    }
}
