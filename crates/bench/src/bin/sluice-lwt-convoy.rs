//! `sluice-lwt-convoy`: the client of `scripts/lwt-convoy.sh` (see
//! [`sluice_bench::lwt_convoy`]).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use clap::Parser;

fn main() {
    let args = sluice_bench::lwt_convoy::ConvoyArgs::parse();
    let result = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(sluice_bench::lwt_convoy::run_convoy(args)));
    if let Err(e) = result {
        eprintln!("sluice-lwt-convoy: {e:#}");
        std::process::exit(1);
    }
}
