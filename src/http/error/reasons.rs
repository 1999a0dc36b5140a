//! Why the service refuses before acting: the database or the instance unavailable (`503`), and
//! an API key throttled (`429`).

/// Why the service answers `503 unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unavailability {
    /// The database cannot be reached, or gave up on the statement.
    #[error("the database is unavailable")]
    Database,
    /// The instance is at its cap of concurrent requests and shed this one unread.
    #[error(
        "this instance is at its limit of concurrent requests and shed this one before reading it"
    )]
    Overloaded,
    /// The bodies being received hold the instance's budget, and this one would pass it.
    #[error(
        "this instance is receiving as many request bodies as it may hold at once ({limit} bytes together, --max-body-bytes-in-flight), and this one would pass that, so it was refused before it was stored"
    )]
    BodyBudget {
        /// The budget in bytes.
        limit: usize,
    },
}

/// Why an API key's request is answered `429`: refused before it was read, so nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Throttled {
    /// The key has its most requests in flight on this instance.
    #[error(
        "API key {key:?} already has {limit} requests in flight on this instance, its limit, so this one was refused unread and nothing was changed; send it again once one of them is answered, or ask an operator to raise --max-in-flight-per-key"
    )]
    InFlight {
        /// The key's name.
        key: String,
        /// Its limit.
        limit: usize,
    },
    /// The key is over its rate on this instance.
    #[error(
        "API key {key:?} is over its rate limit on this instance ({per_second} requests a second, bursts of {burst}), so this one was refused unread and nothing was changed; send it again in {retry_after} s (Retry-After), or ask an operator to raise --rate-limit-per-key"
    )]
    Rate {
        /// The key's name.
        key: String,
        /// The rate.
        per_second: f64,
        /// The burst.
        burst: u32,
        /// Whole seconds until the key's next request may be admitted.
        retry_after: u64,
    },
    /// The key has its most watch streams open on this instance.
    #[error(
        "API key {key:?} already has {limit} watch streams open on this instance, its limit, so this one was refused; close one (one stream of a shorter prefix can replace several), or ask an operator to raise --max-watches-per-key"
    )]
    Watches {
        /// The key's name.
        key: String,
        /// Its limit.
        limit: usize,
    },
    /// The instance has its most watch streams open.
    #[error(
        "this instance already serves {limit} watch streams, its limit, so this one was refused; try again after Retry-After, or through another instance (an operator may raise --max-watches)"
    )]
    InstanceWatches {
        /// The limit.
        limit: usize,
    },
    /// The key has its most waiting acquires on this instance.
    #[error(
        "key {key:?} already has {limit} waiting acquires on this instance, its limit, so this one was refused and waits nowhere; send it again after Retry-After, or through another instance (an operator may raise --max-waiters-per-key)"
    )]
    Waiters {
        /// The lease key.
        key: String,
        /// Its limit.
        limit: usize,
    },
    /// The instance holds its most waiting acquires.
    #[error(
        "this instance already holds {limit} waiting acquires, its limit, so this one was refused and waits nowhere; send it again after Retry-After, or through another instance (an operator may raise --max-waiters)"
    )]
    InstanceWaiters {
        /// The limit.
        limit: usize,
    },
}

/// The `Retry-After` of a watch stream refused for the streams open.
pub const WATCH_RETRY_AFTER: u64 = 5;

impl Throttled {
    /// Seconds until the request may be admitted (a second for a key at its cap in flight).
    pub fn retry_after(&self) -> u64 {
        match self {
            Self::InFlight { .. } | Self::Waiters { .. } | Self::InstanceWaiters { .. } => 1,
            Self::Rate { retry_after, .. } => *retry_after,
            Self::Watches { .. } | Self::InstanceWatches { .. } => WATCH_RETRY_AFTER,
        }
    }
}
