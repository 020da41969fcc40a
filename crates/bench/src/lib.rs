//! Open-loop goodput benchmark for any CQL endpoint.
//!
//! Requests follow a fixed arrival schedule (constant or Poisson), latency is measured from each
//! request's intended send time, and only successes before the deadline count as goodput.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod cli;
pub mod cost;
pub mod driver;
pub mod fake;
pub mod faults;
pub mod lwt_convoy;
pub mod pause;
pub mod progress;
pub mod raw;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod schedule;
pub mod settle;
pub mod stats;
pub mod target;
pub mod txn_bench;
pub mod txn_sweep;
pub mod versus;

/// Formats a multiple without trailing zeros (0.5, 1, 10).
pub(crate) fn report_num(m: f64) -> String {
    let s = format!("{m:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

pub use cli::{run_bench, run_demo, BenchArgs, DemoArgs};
