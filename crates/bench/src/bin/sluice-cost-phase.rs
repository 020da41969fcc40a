//! `sluice-cost-phase`: the client of `scripts/cost.sh` (see [`sluice_bench::cost`]).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use clap::Parser;

fn main() {
    let args = sluice_bench::cost::CostArgs::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(sluice_bench::cost::run_cost(args)));
    if let Err(e) = result {
        eprintln!("sluice-cost-phase: {e:#}");
        std::process::exit(1);
    }
}
