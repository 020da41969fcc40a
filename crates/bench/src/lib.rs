//! Open-loop goodput benchmark for any CQL endpoint.
//!
//! Requests follow a fixed arrival schedule (constant or Poisson), latency is measured from each
//! request's intended send time, and only successes before the deadline count as goodput.

pub mod fake;
pub mod runner;
pub mod schedule;
pub mod stats;
pub mod target;
