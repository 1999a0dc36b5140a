//! The API tests: a real PostgreSQL, a real HTTP server on a loopback port, and a client that
//! speaks to it the way any user would. See `snapfence_testkit::harness` for how each test gets
//! its own database.

use snapfence_testkit::harness;

mod audit;
mod auth;
mod batching;
mod concurrency;
mod connections;
mod dashboard;
mod fencing_race;
mod idempotency;
mod inputs;
mod leases;
mod limits;
mod listing;
mod metrics;
mod namespaces;
mod openapi;
mod plans;
mod pooler;
mod raw;
mod reconciling;
mod recovery;
mod serve;
mod snapshots;
mod tenant_limits;
mod timeline;
mod tls;
mod tracing;
mod txn;
mod waiting;
mod watch;
