//! The API tests: a real PostgreSQL, a real HTTP server on a loopback port, and a client that
//! speaks to it the way any user would. See `harness` for how each test gets its own database.

mod audit;
mod auth;
mod concurrency;
mod fencing_race;
mod harness;
mod inputs;
mod leases;
mod limits;
mod metrics;
mod openapi;
mod recovery;
mod serve;
mod snapshots;
mod timeline;
mod tls;
