//! `sluice-txn-sweep`: the client of `scripts/txn-sweep.sh` (see
//! [`sluice_bench::txn_sweep`]).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use clap::Parser;

fn main() {
    let args = sluice_bench::txn_sweep::SweepArgs::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(sluice_bench::txn_sweep::run_sweep(args)));
    if let Err(e) = result {
        eprintln!("sluice-txn-sweep: {e:#}");
        std::process::exit(1);
    }
}
