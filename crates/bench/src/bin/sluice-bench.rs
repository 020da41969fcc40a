//! Standalone `sluice-bench`: the same benchmark the `sluice bench` subcommand mounts.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Open-loop goodput benchmark for CQL databases"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a scenario against CQL nodes, or compare two runs.
    Bench(Box<sluice_bench::BenchArgs>),
    /// Start a Sluice node from an executable, run a short ramp and write report.html.
    Demo {
        #[command(flatten)]
        args: sluice_bench::DemoArgs,
        /// Path of the `sluice` executable.
        #[arg(long, default_value = "sluice")]
        sluice_exe: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Bench(args) => args.runtime()?.block_on(sluice_bench::run_bench(*args)),
        Cmd::Demo { args, sluice_exe } => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(sluice_bench::run_demo(args, &sluice_exe)),
    }
}
