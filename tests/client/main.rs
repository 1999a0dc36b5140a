//! The Rust client, the lease keeper, the `snapfence` CLI and `snapfence run`, against a real
//! server and PostgreSQL (the harness of `tests/api`), real processes and a loopback proxy that
//! plays the network (`tests/shared/proxy.rs`, shared with `tests/faults`). Golden files of the
//! CLI live in `golden/`; `BLESS=1` rewrites them.

#[path = "../api/harness.rs"]
#[allow(
    dead_code,
    reason = "shared with tests/api; this binary uses only part of it"
)]
mod harness;

mod bench;
mod calls;
mod cli;
mod errors;
mod keeper;
#[path = "../shared/proxy.rs"]
#[allow(
    dead_code,
    reason = "shared with tests/faults; this binary uses only part of it"
)]
mod proxy;
mod retries;
mod run;
mod support;
