//! The Rust client, the lease keeper, the `snapfence` CLI and `snapfence run`, against a real
//! server and PostgreSQL, real processes and a loopback proxy that plays the network (the
//! harness and the proxy of `snapfence-testkit`). Golden files of the CLI live in `golden/`;
//! `BLESS=1` rewrites them.

use snapfence_testkit::{harness, proxy};

mod calls;
mod cli;
mod errors;
mod keeper;
mod retries;
mod run;
mod support;
