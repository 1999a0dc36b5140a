//! What every snapfence test binary shares, so that none of them includes another's files:
//! - [`harness`]: one throwaway PostgreSQL cluster per test process (started from the local
//!   binaries, or the server at `DATABASE_URL`), a database per test cloned from a migrated
//!   template and dropped when the test ends, and service instances on loopback ports;
//! - [`proxy`]: a loopback TCP proxy that plays the network (cuts, stalls, refusals);
//! - [`workload`]: many clients doing leases, fenced writes and reads, each call recorded;
//! - [`checker`]: the one checker of fencing histories, which knows nothing of how a history
//!   was made;
//! - [`otlp`]: a real OTLP trace receiver (HTTP and gRPC) on loopback, keeping the spans the
//!   service exports for assertions;
//! - [`serve`]: the `snapfence serve` binary as a child process, started and waited on until
//!   ready, stopped when dropped.

pub mod checker;
pub mod harness;
pub mod otlp;
pub mod pgbouncer;
pub mod proxy;
pub mod serve;
pub mod workload;
