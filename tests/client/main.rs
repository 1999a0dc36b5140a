//! The Rust client, the lease keeper, the `snapfence` CLI, `snapfence run` and `snapfence watch`
//! against a real server and PostgreSQL, real processes and a loopback proxy that plays the
//! network (the harness and the proxy of `snapfence-testkit`), and the shell examples of the
//! docs. Golden files of the CLI live in `golden/`; `BLESS=1` rewrites them, and the docs'
//! outputs.

use snapfence_testkit::{harness, proxy};

mod calls;
mod cli;
mod docs;
mod election;
mod errors;
mod install;
mod keeper;
mod namespaces;
mod retries;
mod run;
mod support;
mod tracing;
mod watch;
