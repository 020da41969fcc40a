//! The client of `scripts/lwt-convoy.sh`: LWT throughput and latency on many partitions.
//!
//! Closed loop: `--concurrency` tasks each run `INSERT ... IF NOT EXISTS` on a partition no
//! other request uses, back to back, for `--seconds` after `--warm-up-seconds`. With every
//! key distinct, nothing conflicts: what limits LWT/s is how conditional writes wait for
//! durability (one per lock stripe per fsync when serialized through it, or many sharing
//! one group fsync).

use crate::driver::Connection;
use anyhow::{bail, Context};
use scylla::statement::prepared::PreparedStatement;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keyspace of the benchmark.
const KEYSPACE: &str = "sluice_lwt_convoy";

/// Arguments of `sluice-lwt-convoy`.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "sluice-lwt-convoy",
    about = "LWT/s and latency of INSERT ... IF NOT EXISTS on distinct partitions (run by scripts/lwt-convoy.sh)"
)]
pub struct ConvoyArgs {
    /// CQL address of the server.
    #[arg(long)]
    pub node: String,
    /// Label printed with the result line (e.g. the server's mode).
    #[arg(long, default_value = "lwt")]
    pub label: String,
    /// Requests in flight (closed loop: one task each).
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Driver connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Seconds run before measuring.
    #[arg(long, default_value_t = 2)]
    pub warm_up_seconds: u64,
    /// Run plain `INSERT`s instead of `INSERT ... IF NOT EXISTS` (the cost of
    /// `transactional_mode = 'full'` for plain writes).
    #[arg(long)]
    pub plain: bool,
    /// The table's `transactional_mode` ('off' or 'full').
    #[arg(long, default_value = "off")]
    pub transactional_mode: String,
}

/// What one task saw in the measured window.
#[derive(Default)]
struct Tally {
    applied: u64,
    not_applied: u64,
    errors: u64,
    micros: Vec<u64>,
    first_error: Option<String>,
}

/// Runs the benchmark and prints one result line; Err when nothing succeeded or a
/// conditional insert on a fresh key was not applied (the benchmark would be wrong).
/// With `--plain`, plain inserts of fresh keys instead.
pub async fn run_convoy(args: ConvoyArgs) -> anyhow::Result<()> {
    if args.concurrency == 0 || args.seconds == 0 {
        bail!("--concurrency and --seconds must be at least 1");
    }
    let ddl = [
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = \
             {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {KEYSPACE}.t_{mode} (k int PRIMARY KEY, v int) \
             WITH transactional_mode = '{mode}'",
            mode = args.transactional_mode
        ),
    ];
    let conn = Connection::open_one_node(&args.node, args.connections, &ddl).await?;
    let condition = if args.plain { "" } else { " IF NOT EXISTS" };
    let cql = format!(
        "INSERT INTO {KEYSPACE}.t_{mode} (k, v) VALUES (?, ?){condition}",
        mode = args.transactional_mode
    );
    let insert = Arc::new(
        conn.session
            .prepare(cql.as_str())
            .await
            .with_context(|| format!("preparing {cql}"))?,
    );
    let next_key = Arc::new(AtomicI32::new(0));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warm_up_seconds);
    let end = measure_from + Duration::from_secs(args.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let session = conn.session.clone();
        let insert = insert.clone();
        let next_key = next_key.clone();
        let plain = args.plain;
        tasks.spawn(async move {
            run_task(&session, &insert, plain, &next_key, measure_from, end).await
        });
    }
    let mut total = Tally::default();
    while let Some(done) = tasks.join_next().await {
        let t = done.context("a benchmark task panicked")?;
        total.applied += t.applied;
        total.not_applied += t.not_applied;
        total.errors += t.errors;
        total.micros.extend(t.micros);
        if total.first_error.is_none() {
            total.first_error = t.first_error;
        }
    }
    total.micros.sort_unstable();
    let pct = |p: f64| -> f64 {
        let n = total.micros.len();
        if n == 0 {
            return 0.0;
        }
        let i = ((n as f64 * p).ceil() as usize).clamp(1, n) - 1;
        total.micros[i] as f64 / 1000.0
    };
    let per_second = total.applied as f64 / args.seconds as f64;
    println!(
        "{label}: {per_second:.0} {unit}/s  p50 {p50:.2} ms  p99 {p99:.2} ms  max {max:.2} ms  \
         applied {applied}  not-applied {not_applied}  errors {errors}  \
         (concurrency {c}, {s} s)",
        label = args.label,
        unit = if args.plain { "writes" } else { "LWT" },
        p50 = pct(0.50),
        p99 = pct(0.99),
        max = pct(1.0),
        applied = total.applied,
        not_applied = total.not_applied,
        errors = total.errors,
        c = args.concurrency,
        s = args.seconds,
    );
    if let Some(e) = &total.first_error {
        println!("  first error: {e}");
    }
    if total.applied == 0 {
        bail!("no conditional insert succeeded");
    }
    if total.not_applied > 0 {
        bail!("an insert of a fresh key was not applied");
    }
    Ok(())
}

/// One closed-loop task: conditional inserts of fresh keys until `end`, counted from
/// `measure_from`.
async fn run_task(
    session: &scylla::client::session::Session,
    insert: &PreparedStatement,
    plain: bool,
    next_key: &AtomicI32,
    measure_from: Instant,
    end: Instant,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let sent = Instant::now();
        if sent >= end {
            return tally;
        }
        let k = next_key.fetch_add(1, Ordering::Relaxed);
        let result = session.execute_unpaged(insert, (k, k)).await;
        let counted = sent >= measure_from;
        let applied = match result {
            // A plain write that succeeded is applied.
            Ok(_) if plain => Ok(Some(true)),
            Ok(r) => r
                .into_rows_result()
                .map_err(|e| e.to_string())
                .and_then(|rows| {
                    rows.maybe_first_row::<(bool, Option<i32>, Option<i32>)>()
                        .map_err(|e| e.to_string())
                })
                .map(|row| row.map(|r| r.0)),
            Err(e) => Err(e.to_string()),
        };
        let applied = match applied {
            Ok(a) => a,
            Err(e) => {
                if tally.first_error.is_none() {
                    tally.first_error = Some(e);
                }
                None
            }
        };
        if !counted {
            continue;
        }
        match applied {
            Some(true) => {
                tally.applied += 1;
                tally.micros.push(sent.elapsed().as_micros() as u64);
            }
            Some(false) => tally.not_applied += 1,
            None => tally.errors += 1,
        }
    }
}
