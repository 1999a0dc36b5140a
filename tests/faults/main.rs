//! snapfence under faults: a workload of many clients against real `snapfence serve` processes
//! and real PostgreSQL clusters, with crashes, pauses, cut and stalled database links and
//! failovers injected under load, and every recorded history checked by [`checker`].
//!
//! `checker` knows only histories; `checker_tests` proves it on hand-made ones; `workload`
//! makes and records them; `cluster` and `proxy` are the real parts the faults are done to;
//! `scenarios` puts them together, one fault each, and prints each run's figures; `gateways`
//! loses answers between the services and their clients. `patroni` is
//! the stack production runs PostgreSQL with (Patroni, etcd, HAProxy), and `ha` the failovers
//! done to it under the same workload and checker. `checker`,
//! `workload` and `proxy` are `snapfence-testkit`'s, shared with the other test binaries.

use snapfence_testkit::{checker, proxy, workload};

mod checker_tests;
mod cluster;
mod gateways;
mod ha;
mod instances;
mod patroni;
mod scenarios;
