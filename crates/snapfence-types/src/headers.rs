//! The names of the headers the contract adds to HTTP, lower-case as HTTP/2 writes them.

/// The fencing token of a fenced call, and of the snapshot served.
pub const FENCING_TOKEN: &str = "fencing-token";
/// The lease whose namespace fences a write (v1.3), and the one that fenced the snapshot served.
pub const FENCING_KEY: &str = "fencing-key";
/// A snapshot version's metadata, a JSON object (v1.3).
pub const SNAPSHOT_METADATA: &str = "snapshot-metadata";
/// The version of the snapshot served.
pub const SNAPSHOT_VERSION: &str = "snapshot-version";
/// The id of a request, taken from the client or made by the service.
pub const REQUEST_ID: &str = "x-request-id";
/// The key under which a changing call is done at most once (contract v1.1).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set to `true` on an answer that was stored for an `Idempotency-Key` and is sent again.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// A watch's answer: the change id its stream starts after, so that a client that resumes
/// before the first event still resumes from there (`Last-Event-ID`).
pub const WATCH_AFTER: &str = "watch-after";
/// The header an SSE client resumes a watch with: the id of the last event it received.
pub const LAST_EVENT_ID: &str = "last-event-id";
/// The media type of every error body.
pub const PROBLEM_JSON: &str = "application/problem+json";
