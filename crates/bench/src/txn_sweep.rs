//! The client of `scripts/txn-sweep.sh`: gSuneido's experiment in CQL. For each client
//! count, closed-loop clients run short read-modify-write transactions on overlapping keys
//! (two of `--keys` accounts: `n = n + d` on one, `n = n - d` on the other, so the sum of
//! all accounts stays 0), for `--seconds` each. Reports transactions/s, timeouts, p99 and the
//! most transactions the server ran at once during the step (its `sluice_txn_outstanding`
//! gauge, sampled every 20 ms from `--metrics`), then checks that the sum is still 0.

use crate::driver::Connection;
use anyhow::{bail, Context};
use scylla::client::session::Session;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Keyspace of the benchmark.
pub(crate) const KEYSPACE: &str = "sluice_txn_sweep";

/// The transaction: two LETs and two self-referencing updates.
pub(crate) const TRANSACTION: &str = "BEGIN TRANSACTION
  LET a = (SELECT n FROM sluice_txn_sweep.acct WHERE k = ?);
  LET b = (SELECT n FROM sluice_txn_sweep.acct WHERE k = ?);
  IF a IS NOT NULL AND b IS NOT NULL THEN
    UPDATE sluice_txn_sweep.acct SET n = n + ? WHERE k = ?;
    UPDATE sluice_txn_sweep.acct SET n = n - ? WHERE k = ?;
  END IF
COMMIT TRANSACTION";

/// Arguments of `sluice-txn-sweep`.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "sluice-txn-sweep",
    about = "Transactions/s of short read-modify-write transactions on overlapping keys, by number of clients (run by scripts/txn-sweep.sh)"
)]
pub struct SweepArgs {
    /// CQL address of the server.
    #[arg(long)]
    pub node: String,
    /// The server's metrics address (host:port), for the outstanding-transactions gauge.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Label printed with each line.
    #[arg(long, default_value = "txn")]
    pub label: String,
    /// Client counts, comma-separated.
    #[arg(long, default_value = "1,2,3,4,5,6,8,10,16,20,30")]
    pub clients: String,
    /// Accounts the transactions pick from (few: they overlap).
    #[arg(long, default_value_t = 10)]
    pub keys: i32,
    /// Measured seconds per client count.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Driver connections.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
}

/// What one step measured.
#[derive(Default)]
struct Step {
    committed: u64,
    timeouts: u64,
    other_errors: u64,
    micros: Vec<u64>,
    first_error: Option<String>,
}

/// Runs the sweep and prints one line per client count.
pub async fn run_sweep(args: SweepArgs) -> anyhow::Result<()> {
    let counts: Vec<usize> = args
        .clients
        .split(',')
        .map(|c| c.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .context("--clients is a comma-separated list of numbers")?;
    if args.keys < 2 || args.seconds == 0 || counts.contains(&0) {
        bail!("--keys must be at least 2, --seconds and every client count at least 1");
    }
    let conn = Connection::open_one_node(&args.node, args.connections, &accounts_ddl()).await?;
    create_accounts(&conn.session, args.keys).await?;
    let txn = Arc::new(conn.session.prepare(TRANSACTION).await?);
    println!(
        "{label}: clients | tx/s | p99 ms | timeouts | other errors | max outstanding | limit at end",
        label = args.label
    );
    for &clients in &counts {
        let sampler = args.metrics.clone().map(OutstandingSampler::start);
        let end = Instant::now() + Duration::from_secs(args.seconds);
        let mut tasks = tokio::task::JoinSet::new();
        for client in 0..clients {
            let session = conn.session.clone();
            let txn = txn.clone();
            let keys = args.keys;
            tasks.spawn(async move {
                let mut step = Step::default();
                let mut i: u64 = client as u64 * 7919;
                while Instant::now() < end {
                    i = i
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let a = ((i >> 33) % keys as u64) as i32;
                    let b = (a + 1 + ((i >> 17) % (keys as u64 - 1)) as i32) % keys;
                    let d = ((i >> 40) % 100) as i64 + 1;
                    let sent = Instant::now();
                    match session.execute_unpaged(&txn, (a, b, d, a, d, b)).await {
                        Ok(_) => {
                            step.committed += 1;
                            step.micros.push(sent.elapsed().as_micros() as u64);
                        }
                        Err(e) => {
                            let text = e.to_string();
                            if text.contains("imed out") || text.contains("Timeout") {
                                step.timeouts += 1;
                            } else {
                                step.other_errors += 1;
                            }
                            if step.first_error.is_none() {
                                step.first_error = Some(text);
                            }
                        }
                    }
                }
                step
            });
        }
        let mut total = Step::default();
        while let Some(done) = tasks.join_next().await {
            let s = done.context("a benchmark task panicked")?;
            total.committed += s.committed;
            total.timeouts += s.timeouts;
            total.other_errors += s.other_errors;
            total.micros.extend(s.micros);
            if total.first_error.is_none() {
                total.first_error = s.first_error;
            }
        }
        let max_outstanding = sampler.map(OutstandingSampler::stop);
        total.micros.sort_unstable();
        let p99 = match total.micros.len() {
            0 => 0.0,
            n => total.micros[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1] as f64 / 1000.0,
        };
        let limit = args
            .metrics
            .as_deref()
            .and_then(|a| gauge(a, "sluice_txn_limit"))
            .map_or("-".to_string(), |v| v.to_string());
        let outstanding = max_outstanding.map_or("-".to_string(), |m| m.to_string());
        println!(
            "{label}: {clients} | {tps:.0} | {p99:.2} | {timeouts} | {other} | {outstanding} | {limit}",
            label = args.label,
            tps = total.committed as f64 / args.seconds as f64,
            timeouts = total.timeouts,
            other = total.other_errors,
        );
        if let Some(e) = &total.first_error {
            println!("  first error: {e}");
        }
    }
    let sum = accounts_sum(&conn.session, args.keys).await?;
    println!(
        "{label}: sum of all accounts {sum} (must be 0)",
        label = args.label
    );
    if sum != 0 {
        bail!("the accounts' sum is {sum}, not 0: a transaction was applied in part");
    }
    Ok(())
}

/// The keyspace and the accounts table.
pub(crate) fn accounts_ddl() -> [String; 2] {
    [
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = \
             {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        ),
        format!("CREATE TABLE IF NOT EXISTS {KEYSPACE}.acct (k int PRIMARY KEY, n bigint)"),
    ]
}

/// Sets accounts `0..keys` to 0.
pub(crate) async fn create_accounts(session: &Session, keys: i32) -> anyhow::Result<()> {
    let insert = session
        .prepare(format!("INSERT INTO {KEYSPACE}.acct (k, n) VALUES (?, 0)"))
        .await?;
    for k in 0..keys {
        session.execute_unpaged(&insert, (k,)).await?;
    }
    Ok(())
}

/// The sum of accounts `0..keys`.
pub(crate) async fn accounts_sum(session: &Session, keys: i32) -> anyhow::Result<i64> {
    let read = session
        .prepare(format!("SELECT n FROM {KEYSPACE}.acct WHERE k = ?"))
        .await?;
    let mut sum: i64 = 0;
    for k in 0..keys {
        let rows = session
            .execute_unpaged(&read, (k,))
            .await?
            .into_rows_result()?;
        let (n,) = rows.first_row::<(i64,)>()?;
        sum += n;
    }
    Ok(sum)
}

/// Samples the server's `sluice_txn_outstanding` gauge every 20 ms on a thread of its own
/// and keeps the largest value seen.
pub(crate) struct OutstandingSampler {
    stop: Arc<AtomicBool>,
    max: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl OutstandingSampler {
    /// Starts sampling the metrics endpoint `addr` (host:port).
    pub(crate) fn start(addr: String) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let max = Arc::new(AtomicU64::new(0));
        let thread = {
            let (stop, max) = (stop.clone(), max.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(v) = gauge(&addr, "sluice_txn_outstanding") {
                        max.fetch_max(v, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        OutstandingSampler { stop, max, thread }
    }

    /// Stops sampling; the largest value seen.
    pub(crate) fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        self.max.load(Ordering::Relaxed)
    }
}

/// The value of an unlabelled gauge from `GET /metrics` at `addr` (HTTP/1.0, one request).
pub(crate) fn gauge(addr: &str, name: &str) -> Option<u64> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
