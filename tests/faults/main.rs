//! snapfence under faults: a workload of many clients against real `snapfence serve` processes
//! and real PostgreSQL clusters, with crashes, pauses, cut and stalled database links and
//! failovers injected under load, and every recorded history checked by [`checker`].
//!
//! `checker` knows only histories; `checker_tests` proves it on hand-made ones; `workload`
//! makes and records them; `cluster` and `proxy` (`tests/shared/proxy.rs`, shared with
//! `tests/client`) are the real parts the faults are done to; `scenarios` puts them together,
//! one fault each, and prints each run's figures.

mod checker;
mod checker_tests;
mod cluster;
#[path = "../shared/proxy.rs"]
#[allow(
    dead_code,
    reason = "shared with tests/client; this binary uses only part of it"
)]
mod proxy;
mod scenarios;
mod workload;
