//! Command-line entry points: `sluice bench ...` and `sluice demo`.

use crate::driver::{
    format_durability, Balancing, Connection, ConsistencyLevel, CqlTarget, DriverOptions,
    RetryMode, KEYSPACE,
};
use crate::faults::{self, FaultKind, FaultNode, FaultPlan};
use crate::raw::{NodeChoice, RawOptions, RawTarget, ReplicaRing};
use crate::report::{
    file_stem, hgrm, html_compare, html_report, standalone_svg, text_table, RunReport, Settings,
};
use crate::runner::RunConfig;
use crate::scenario::{self, HotPlan, Plan, Workload};
use crate::schedule::Arrival;
use crate::settle::Settle;
use crate::target::{populate, Target};
use crate::versus::{self, VersusPlan, VersusReport, WarmUp};
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Parses `250us`, `10ms`, `2s` or `1.5s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration '{s}': expected e.g. 10ms, 2s, 250us"))?;
    let secs = match unit {
        "us" => v / 1e6,
        "ms" => v / 1e3,
        "s" | "" => v,
        _ => return Err(format!("invalid duration unit in '{s}': use us, ms or s")),
    };
    if !secs.is_finite() || !(0.0..=86_400.0).contains(&secs) {
        return Err(format!("duration '{s}' out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Which experiment to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Find C: highest rate with p99 under the SLO and errors under 0.1%.
    Capacity,
    /// One-partition writes with USING TIMEOUT, offered load from 0.5xC to 5xC.
    Ramp,
    /// Uniform writes, reads and a 50/50 mix at 0.5, 1, 2, 3, 5 and 10xC.
    Sweep,
    /// Uniform reads; then an attacker on one wide partition; then per_partition_rate_limit.
    HotPartition,
    /// The generator's own ceiling against an in-process target that answers at once.
    Ceiling,
    /// --nodes against --against in one run: capacity and latency at a common rate, per workload.
    Versus,
    /// Open-loop writes and reads (QUORUM, RF 3 by default) while one node (--fault-pid) is
    /// killed, stopped and restarted in turn; goodput, p99, errors, retries and recovery per
    /// phase, stale reads and lost acknowledged writes.
    Faults,
    /// RavenDB's experiment: many concurrent two-partition transactions carrying large values
    /// (--txn-value-bytes), on --nodes then --against in turn, and the ratio.
    Ravendb,
    /// gSuneido's experiment: 1 to 30 clients of short read-modify-write transactions on
    /// overlapping keys, on --nodes then --against (e.g. the adaptive limit on, then off).
    Gsuneido,
    /// The best concurrency on a few hot rows, then --txn-hot-multiple times it.
    HotRows,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Capacity => "capacity",
            Scenario::Ramp => "ramp",
            Scenario::Sweep => "sweep",
            Scenario::HotPartition => "hot-partition",
            Scenario::Ceiling => "ceiling",
            Scenario::Versus => "versus",
            Scenario::Faults => "faults",
            Scenario::Ravendb => "ravendb",
            Scenario::Gsuneido => "gsuneido",
            Scenario::HotRows => "hot-rows",
        }
    }
}

/// Which CQL client drives the endpoints (both sides of `versus` get the same one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientKind {
    /// The Rust `scylla` driver: prepared statements, token- and shard-aware, retry policies.
    Driver,
    /// A raw pipelined, shard-aware protocol-v4 client (no retries; several nodes token-aware
    /// or in turn): far less CPU per request, so that the server rather than the generator is
    /// measured.
    Raw,
}

impl ClientKind {
    fn name(self) -> &'static str {
        match self {
            ClientKind::Driver => "driver",
            ClientKind::Raw => "raw",
        }
    }
}

/// Arguments of `sluice bench`.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Scenario to run (omit when using --compare).
    #[arg(value_enum)]
    pub scenario: Option<Scenario>,
    /// CQL contact points, host:port (comma-separated or repeated).
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:9042")]
    pub nodes: Vec<String>,
    /// Connections per host (driver) or per shard (raw) [default: 4 per host; 1 per shard with
    /// --client raw, whose connections are pipelined].
    #[arg(long)]
    pub connections: Option<usize>,
    /// CQL client of the generator: the scylla driver, or the cheap raw protocol client.
    #[arg(long, value_enum, default_value = "driver")]
    pub client: ClientKind,
    /// Threads of the generator's runtime. One thread runs the schedule, the sends and the
    /// answers without cross-thread wake-ups, the cheapest per request; the driver needs more
    /// CPU than one core gives at high rates [default: 1 with --client raw, 2 with the driver].
    #[arg(long)]
    pub generator_threads: Option<usize>,
    /// Capacity C in requests/s; measured with the `capacity` search first when omitted.
    #[arg(long)]
    pub capacity: Option<f64>,
    /// Workload of the `capacity` scenario.
    #[arg(long, value_enum, default_value = "write")]
    pub workload: Workload,
    /// Arrival process.
    #[arg(long, value_enum, default_value = "constant")]
    pub arrival: Arrival,
    /// Goodput deadline from the intended send time [default: 20ms for ramp, 100ms otherwise].
    #[arg(long, value_parser = parse_duration)]
    pub deadline: Option<Duration>,
    /// Rows per write with --client raw: more than one makes each write an UNLOGGED BATCH of
    /// that many rows of its partition, a heavier request, so that 10xC stays within the
    /// generator's ceiling.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub batch_rows: u16,
    /// Client-side timeout of the driver [default: the deadline].
    #[arg(long, value_parser = parse_duration)]
    pub client_timeout: Option<Duration>,
    /// Requests sent later than this after their intended time count as generator lag.
    #[arg(long, value_parser = parse_duration, default_value = "2ms")]
    pub lag_tolerance: Duration,
    /// Share of requests sent late or not at all above which a capacity probe stops the search.
    #[arg(long, default_value_t = 0.01)]
    pub max_lag: f64,
    /// Repeat a capacity probe that missed the SLO once, at the same rate, before the search
    /// acts on it (it always does so after generator lag): on a shared or virtual machine one
    /// stall of the host fails a probe far below the server's limit. Both endpoints of
    /// `versus` get the same treatment; each repeat is in the report's notes.
    #[arg(long)]
    pub confirm_failures: bool,
    /// Duration of each step.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub step: Duration,
    /// Duration of each capacity-search probe [default: --step].
    #[arg(long, value_parser = parse_duration)]
    pub probe_step: Option<Duration>,
    /// Idle time between steps so that queues drain.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub cooldown: Duration,
    /// Before each step, wait up to this long for the machine to go quiet (under 0.2 busy
    /// CPUs over two 200 ms windows, from /proc/stat), so that the work a server does after a
    /// step (flushes, compactions, garbage collection, JIT) does not run into the next probe,
    /// its own or the other endpoint's on a shared core; 0s starts each step at once
    /// [default: 15s with versus, 0s otherwise].
    #[arg(long, value_parser = parse_duration)]
    pub settle: Option<Duration>,
    /// p99 latency objective of the capacity search.
    #[arg(long, value_parser = parse_duration, default_value = "10ms")]
    pub slo: Duration,
    /// First rate of the capacity search, requests/s.
    #[arg(long, default_value_t = 1000.0)]
    pub start_rate: f64,
    /// Multiples of C [default: ramp 0.5,1,2,3,5; sweep 0.5,1,2,3,5,10].
    #[arg(long, value_delimiter = ',')]
    pub multiples: Option<Vec<f64>>,
    /// Partitions of the uniform key space (populated before read workloads).
    #[arg(long, default_value_t = 10_000)]
    pub partitions: u64,
    /// `USING TIMEOUT` on the ramp's writes ("0ms" to leave it out).
    #[arg(long, value_parser = parse_duration, default_value = "10ms")]
    pub using_timeout: Duration,
    /// Uniform read rate of hot-partition [default: 0.5xC]; offered rate of faults [default: 1000].
    #[arg(long)]
    pub rate: Option<f64>,
    /// Attacker rate as a multiple of the uniform rate (hot-partition).
    #[arg(long, default_value_t = 8.0)]
    pub attack_multiplier: f64,
    /// Rows in the attacker's partition, i.e. data per read relative to the others.
    #[arg(long, default_value_t = 10)]
    pub attack_rows: i32,
    /// max_reads_per_second applied in the last hot-partition phase.
    #[arg(long, default_value_t = 100)]
    pub hot_limit: u32,
    /// Consistency level of every request [default: QUORUM for faults, ONE otherwise].
    #[arg(long, value_enum, ignore_case = true)]
    pub consistency: Option<ConsistencyLevel>,
    /// replication_factor of the keyspace the bench creates (SimpleStrategy); an existing
    /// keyspace is altered to it [default: 3 for faults, 1 otherwise].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub replication_factor: Option<u32>,
    /// How the client picks each request's coordinator (the raw client: among several
    /// --nodes, the replicas of the partition from the cluster's ring, or the nodes in turn).
    #[arg(long, value_enum, default_value = "token-aware")]
    pub load_balancing: Balancing,
    /// faults: what is done to the node, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["kill", "stop", "restart"])]
    pub faults: Vec<FaultKind>,
    /// faults: the process id of the node the faults are applied to (`sluice serve`); its
    /// command line, environment and directory, read from /proc, start it again.
    #[arg(long)]
    pub fault_pid: Option<u32>,
    /// faults: the node's CQL address, waited for after a start [default: its --listen].
    #[arg(long)]
    pub fault_node: Option<String>,
    /// faults: a shell command that starts the node again, instead of its own command line.
    #[arg(long)]
    pub restart_cmd: Option<String>,
    /// faults: how long a killed node stays down and a stopped one stopped.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub fault_hold: Duration,
    /// faults: time at the start that counts in no phase compared (connections, caches).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub fault_warm_up: Duration,
    /// faults: length of the phase before the first fault and after each one.
    #[arg(long, value_parser = parse_duration, default_value = "15s")]
    pub phase: Duration,
    /// Client retry policy: none (measure the server) or stock (retry on next host).
    #[arg(long, value_enum, default_value = "none")]
    pub retry_policy: RetryMode,
    /// Retries per request with --retry-policy stock.
    #[arg(long, default_value_t = 3)]
    pub retries: u32,
    /// Cap on requests in flight; arrivals above it are counted as unsent.
    #[arg(long, default_value_t = 100_000)]
    pub max_in_flight: usize,
    /// Seed for arrivals and keys.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Label of this run in reports [default: the contact points].
    #[arg(long)]
    pub label: Option<String>,
    /// Write raw per-second data and step summaries as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write the charts as a standalone SVG file.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Write each step's full latency histogram as HdrHistogram `.hgrm` files into this folder.
    #[arg(long)]
    pub hgrm_dir: Option<PathBuf>,
    /// versus: the reference endpoint (e.g. Cassandra), host:port (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    pub against: Vec<String>,
    /// versus: label of the --against endpoint (--label names the --nodes one, default sluice).
    #[arg(long, default_value = "cassandra")]
    pub against_label: String,
    /// versus: workloads, in the order they run.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["write", "read"])]
    pub workloads: Vec<Workload>,
    /// versus: the latency step runs both endpoints at this fraction of the lower capacity.
    #[arg(long, default_value_t = 0.8)]
    pub common_fraction: f64,
    /// versus: a fixed rate for the latency step instead, requests/s.
    #[arg(long)]
    pub common_rate: Option<f64>,
    /// versus: before each workload's capacity searches, each endpoint runs this long at
    /// --warm-up-rate (recorded as a step, not part of the search), so that a JVM's JIT has
    /// compiled its hot paths before it is measured; 0s skips it.
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub warm_up: Duration,
    /// versus: offered rate of the warm-up, requests/s.
    #[arg(long, default_value_t = 10_000.0)]
    pub warm_up_rate: f64,
    /// versus: the process ids of the two servers, --nodes' first: while one endpoint runs a
    /// step, the other's process is stopped (SIGSTOP) and continued (SIGCONT) after, so that
    /// on a machine where both share a core the idle one's background work (a JVM's JIT
    /// compiler and GC, compactions) does not take it from the one measured. If the bench is
    /// interrupted meanwhile, continue the stopped one with `kill -CONT <pid>`.
    #[arg(long, value_delimiter = ',', value_name = "NODES_PID,AGAINST_PID")]
    pub pause_pids: Option<Vec<u32>>,
    /// versus: the durability settings of both endpoints, printed verbatim in the header.
    #[arg(long)]
    pub durability_note: Option<String>,
    /// Compare two JSON runs side by side in the --report (no load is generated).
    #[arg(long, num_args = 2, value_names = ["A_JSON", "B_JSON"])]
    pub compare: Option<Vec<PathBuf>>,
    /// No per-second progress lines.
    #[arg(long)]
    pub quiet: bool,
    /// ravendb, gsuneido, hot-rows: Accord's `BEGIN TRANSACTION` or single-partition LWT.
    #[arg(long, value_enum, default_value = "accord")]
    pub txn_form: crate::txn_bench::TxnForm,
    /// ravendb, gsuneido, hot-rows: closed-loop client counts, one step each (ravendb uses
    /// the first) [default: ravendb 16; gsuneido 1,2,3,4,5,6,8,10,16,20,30; hot-rows
    /// 1,2,4,8,16,32].
    #[arg(long, value_delimiter = ',')]
    pub txn_clients: Option<Vec<usize>>,
    /// ravendb, gsuneido, hot-rows: keys the transactions pick from [default: ravendb 256,
    /// gsuneido 10, hot-rows 4].
    #[arg(long)]
    pub txn_keys: Option<i32>,
    /// ravendb: smallest and largest value, bytes.
    #[arg(long, value_delimiter = ',', default_values = ["102400", "1048576"])]
    pub txn_value_bytes: Vec<usize>,
    /// hot-rows: the concurrency offered after the search, as a multiple of the best.
    #[arg(long, default_value_t = 64)]
    pub txn_hot_multiple: usize,
    /// ravendb: rounds over the endpoints.
    #[arg(long, default_value_t = 2)]
    pub txn_rounds: usize,
    /// ravendb, gsuneido, hot-rows: Sluice metrics addresses (host:port) of --nodes and
    /// --against, in that order, for the server's transaction gauges ("-" for none).
    #[arg(long, value_delimiter = ',')]
    pub txn_metrics: Vec<String>,
}

impl BenchArgs {
    /// Threads of the generator's runtime.
    pub fn generator_threads(&self) -> usize {
        self.generator_threads
            .unwrap_or(match self.client {
                ClientKind::Driver => 2,
                ClientKind::Raw => 1,
            })
            .max(1)
    }

    /// The generator's runtime: single-threaded for one thread, multi-threaded otherwise.
    pub fn runtime(&self) -> std::io::Result<tokio::runtime::Runtime> {
        match self.generator_threads() {
            1 => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            n => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(n)
                .enable_all()
                .build(),
        }
    }

    /// Consistency level of the run.
    fn consistency(&self, s: Scenario) -> ConsistencyLevel {
        self.consistency.unwrap_or(if s == Scenario::Faults {
            ConsistencyLevel::Quorum
        } else {
            ConsistencyLevel::One
        })
    }

    /// The driver's settings for `nodes`.
    fn driver_options(&self, s: Scenario, nodes: &[String], plan: &Plan) -> DriverOptions {
        DriverOptions {
            nodes: nodes.to_vec(),
            connections: self.connections(),
            client_timeout: plan.run.client_timeout,
            retry: self.retry_policy,
            retries: self.retries,
            credentials: None,
            consistency: self.consistency(s),
            balancing: self.load_balancing,
            replication_factor: self.replication_factor.unwrap_or(if s == Scenario::Faults {
                3
            } else {
                1
            }),
        }
    }

    /// How the raw client picks each request's node: with several nodes and token-aware
    /// balancing, the replicas of its partition on the ring `conn`'s driver session read.
    async fn node_choice(
        &self,
        conn: &Connection,
        replication_factor: u32,
        nodes: &[String],
    ) -> anyhow::Result<NodeChoice> {
        Ok(
            if nodes.len() > 1 && self.load_balancing == Balancing::TokenAware {
                NodeChoice::Replicas(
                    ReplicaRing::from_session(&conn.session, replication_factor, nodes).await?,
                )
            } else {
                NodeChoice::RoundRobin
            },
        )
    }

    /// Connections per host (driver) or per shard (raw).
    fn connections(&self) -> usize {
        self.connections.unwrap_or(match self.client {
            ClientKind::Driver => 4,
            // One pipelined connection per shard batches the most frames per syscall.
            ClientKind::Raw => 1,
        })
    }

    fn deadline(&self, s: Scenario) -> Duration {
        self.deadline.unwrap_or(if s == Scenario::Ramp {
            // Longer than the server's 10 ms timeout, so that its timeout answers are seen.
            Duration::from_millis(20)
        } else {
            Duration::from_millis(100)
        })
    }

    fn plan(&self, s: Scenario) -> Plan {
        let deadline = self.deadline(s);
        Plan {
            run: RunConfig {
                arrival: self.arrival,
                deadline,
                // A fault run waits longer than its deadline, so that the server's own
                // timeouts and Unavailable answers are seen rather than the client's.
                client_timeout: self.client_timeout.unwrap_or(if s == Scenario::Faults {
                    Duration::from_secs(1)
                } else {
                    deadline
                }),
                lag_tolerance: self.lag_tolerance,
                max_in_flight: self.max_in_flight,
                seed: self.seed,
                progress: !self.quiet,
            },
            step: self.step,
            probe_step: self.probe_step.unwrap_or(self.step),
            cooldown: self.cooldown,
            slo: self.slo,
            start_rate: self.start_rate,
            partitions: self.partitions.max(1),
            max_lag: self.max_lag,
            confirm_failures: self.confirm_failures,
            settle: match self.settle {
                Some(d) if d.is_zero() => None,
                Some(d) => Some(Settle::up_to(d)),
                None if s == Scenario::Versus => Some(Settle::up_to(Duration::from_secs(15))),
                None => None,
            },
        }
    }

    fn new_report(&self, s: Scenario, plan: &Plan, classes: &[&str]) -> RunReport {
        RunReport {
            label: self.label.clone().unwrap_or_else(|| self.nodes.join(",")),
            scenario: s.name().into(),
            target: if s == Scenario::Ceiling {
                "in-process (answers at once)".into()
            } else {
                self.nodes.join(",")
            },
            started_unix: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            settings: Settings {
                arrival: format!("{:?}", self.arrival).to_lowercase(),
                deadline_ms: plan.run.deadline.as_secs_f64() * 1e3,
                client_timeout_ms: plan.run.client_timeout.as_secs_f64() * 1e3,
                lag_tolerance_ms: plan.run.lag_tolerance.as_secs_f64() * 1e3,
                connections: self.connections(),
                generator_threads: self.generator_threads(),
                retry_policy: match self.retry_policy {
                    RetryMode::None => "none".into(),
                    RetryMode::Stock => format!("stock ({} retries)", self.retries),
                },
                step_secs: plan.step.as_secs_f64(),
            },
            classes: classes.iter().map(|c| c.to_string()).collect(),
            ..Default::default()
        }
    }
}

fn write_outputs(args: &BenchArgs, r: &RunReport) -> anyhow::Result<()> {
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_vec_pretty(r)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &args.report {
        std::fs::write(p, html_report(r)).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(dir) = &args.hgrm_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (i, (step, class, h)) in r.histograms.iter().enumerate() {
            let p = dir.join(format!(
                "{i:02}-{}-{}.hgrm",
                file_stem(step),
                file_stem(class)
            ));
            std::fs::write(&p, hgrm(h)).with_context(|| format!("writing {}", p.display()))?;
        }
        eprintln!(
            "wrote {} histograms into {}",
            r.histograms.len(),
            dir.display()
        );
    }
    if let Some(p) = &args.svg {
        std::fs::write(p, standalone_svg(r)).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn print_summary(r: &RunReport) {
    println!("\n== {} / {} ({}) ==", r.label, r.scenario, r.target);
    if let Some(c) = r.capacity {
        println!("capacity C = {c:.0} requests/s");
    }
    print!("{}", text_table(r));
    for n in &r.notes {
        println!("note: {n}");
    }
}

fn load(p: &Path) -> anyhow::Result<RunReport> {
    let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", p.display()))
}

/// Runs `sluice bench` with parsed arguments.
pub async fn run_bench(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(files) = &args.compare {
        let [a, b] = files.as_slice() else {
            bail!("--compare takes exactly two JSON files");
        };
        let Some(out) = &args.report else {
            bail!("--compare needs --report OUT.html");
        };
        let (a, b) = (load(a)?, load(b)?);
        print_summary(&a);
        print_summary(&b);
        std::fs::write(out, html_compare(&a, &b))
            .with_context(|| format!("writing {}", out.display()))?;
        eprintln!("wrote {}", out.display());
        return Ok(());
    }
    let Some(s) = args.scenario else {
        bail!(
            "name a scenario (capacity, ramp, sweep, hot-partition, ceiling, versus, faults, ravendb, gsuneido, hot-rows) or use --compare"
        );
    };
    if matches!(
        s,
        Scenario::Ravendb | Scenario::Gsuneido | Scenario::HotRows
    ) {
        return run_txn_scenario(&args, s).await;
    }
    if args.client == ClientKind::Raw && args.retry_policy == RetryMode::Stock {
        bail!("--client raw never retries; use --retry-policy none or --client driver");
    }
    let plan = args.plan(s);
    if s == Scenario::Faults {
        return run_faults(&args, &plan).await;
    }
    if s == Scenario::Versus {
        return run_versus(&args, &plan).await;
    }
    let report = match s {
        Scenario::Ceiling => {
            let mut r = args.new_report(s, &plan, &["generator"]);
            let c = scenario::ceiling(&mut r, &plan).await;
            r.notes.push(format!(
                "generator ceiling on this machine: {c:.0} requests/s issued and accounted (in-process target, no network or driver cost); do not read any figure above it"
            ));
            r
        }
        _ => run_against_cql(&args, s, &plan).await?,
    };
    let mut report = report;
    scenario::note_settle(&plan, &mut report);
    print_summary(&report);
    write_outputs(&args, &report)
}

/// `sluice bench ravendb | gsuneido | hot-rows` (crate::txn_bench).
async fn run_txn_scenario(args: &BenchArgs, s: Scenario) -> anyhow::Result<()> {
    use crate::txn_bench::{TxnEndpoint, TxnOptions};
    let metrics = |i: usize| {
        args.txn_metrics
            .get(i)
            .filter(|m| m.as_str() != "-")
            .cloned()
    };
    let mut endpoints = vec![TxnEndpoint {
        label: args.label.clone().unwrap_or_else(|| "sluice".into()),
        node: args.nodes.first().context("--nodes is empty")?.clone(),
        metrics: metrics(0),
    }];
    if let Some(node) = args.against.first() {
        endpoints.push(TxnEndpoint {
            label: args.against_label.clone(),
            node: node.clone(),
            metrics: metrics(1),
        });
    }
    let (clients, keys, deadline): (&[usize], i32, u64) = match s {
        Scenario::Ravendb => (&[16], 256, 2000),
        Scenario::HotRows => (&[1, 2, 4, 8, 16, 32], 4, 1000),
        _ => (&[1, 2, 3, 4, 5, 6, 8, 10, 16, 20, 30], 10, 1000),
    };
    let &[min, max] = args.txn_value_bytes.as_slice() else {
        bail!("--txn-value-bytes takes two sizes: MIN,MAX");
    };
    let o = TxnOptions {
        endpoints,
        form: args.txn_form,
        connections: args.connections.unwrap_or(2),
        step: args.step,
        deadline: args.deadline.unwrap_or(Duration::from_millis(deadline)),
        clients: args.txn_clients.clone().unwrap_or_else(|| clients.to_vec()),
        keys: args.txn_keys.unwrap_or(keys),
        value_bytes: (min, max),
        hot_multiple: args.txn_hot_multiple.max(1),
        rounds: args.txn_rounds.max(1),
        seed: args.seed,
    };
    if o.keys < 2 || o.clients.is_empty() || o.clients.contains(&0) || o.step.is_zero() {
        bail!("--txn-keys must be at least 2, --txn-clients at least 1 each, --step above 0");
    }
    match s {
        Scenario::Ravendb => crate::txn_bench::run_ravendb(&o).await,
        Scenario::HotRows => crate::txn_bench::run_hot_rows(&o).await,
        _ => crate::txn_bench::run_gsuneido(&o).await,
    }
}

async fn run_against_cql(args: &BenchArgs, s: Scenario, plan: &Plan) -> anyhow::Result<RunReport> {
    let opts = args.driver_options(s, &args.nodes, plan);
    let conn = Connection::open(&opts).await?;
    let classes: &[&str] = if s == Scenario::HotPartition {
        &["uniform", "attacker"]
    } else {
        &["requests"]
    };
    let mut r = args.new_report(s, plan, classes);
    let hot = s == Scenario::HotPartition;
    let table = if hot { "hot_kv" } else { "kv" };
    eprintln!("client: {}", args.client.name());
    // The hot-partition table is recreated so that no rate limit from an earlier run remains.
    conn.create_table(table, hot).await?;
    let using_timeout =
        (s == Scenario::Ramp && !args.using_timeout.is_zero()).then_some(args.using_timeout);
    match args.client {
        ClientKind::Driver => {
            if args.batch_rows > 1 {
                bail!("--batch-rows needs --client raw");
            }
            let (target, notes) = CqlTarget::prepare(&conn, table, using_timeout).await?;
            r.notes.push(format!(
                "client: scylla driver, {} connection(s)/host, {}",
                args.connections(),
                opts.describe()
            ));
            r.notes.extend(notes);
            run_scenario(args, s, plan, &conn, table, Arc::new(target), r).await
        }
        ClientKind::Raw => {
            let choice = args
                .node_choice(&conn, opts.replication_factor, &args.nodes)
                .await?;
            let raw = RawOptions {
                connections: args.connections(),
                table: table.to_string(),
                using_timeout,
                batch_rows: usize::from(args.batch_rows),
                consistency: opts.consistency,
                choice,
            };
            let (target, notes) = RawTarget::connect_with(&args.nodes, raw).await?;
            r.notes.push(format!("client: {}", target.describe()));
            if args.batch_rows > 1 {
                r.notes.push(format!(
                    "writes: UNLOGGED BATCH of {} rows of one partition",
                    args.batch_rows
                ));
            }
            r.notes.extend(notes);
            run_scenario(args, s, plan, &conn, table, Arc::new(target), r).await
        }
    }
}

/// Populates what the scenario reads, then runs it through `target`.
async fn run_scenario<T: Target>(
    args: &BenchArgs,
    s: Scenario,
    plan: &Plan,
    conn: &Connection,
    table: &str,
    target: Arc<T>,
    mut r: RunReport,
) -> anyhow::Result<RunReport> {
    let hot = s == Scenario::HotPartition;
    if matches!(s, Scenario::Sweep | Scenario::HotPartition)
        || (s == Scenario::Capacity && args.workload != Workload::Write)
    {
        eprintln!("populating {} partitions...", plan.partitions);
        let failed = populate(&target, 0..plan.partitions as i64, 1).await;
        if hot {
            let rows = args.attack_rows.max(1);
            let f = populate(&target, scenario::HOT_PK..scenario::HOT_PK + 1, rows).await;
            if f > 0 {
                r.notes
                    .push(format!("{f} writes to the hot partition failed"));
            }
        }
        if failed > 0 {
            r.notes.push(format!("{failed} populate writes failed"));
        }
    }
    let stream = match s {
        Scenario::Ramp => scenario::ramp_stream(),
        Scenario::Capacity => scenario::uniform_stream(args.workload, plan.partitions),
        _ => scenario::uniform_stream(Workload::Write, plan.partitions),
    };
    let c = match (args.capacity, s) {
        (_, Scenario::Capacity) => {
            let c = scenario::capacity(&target, &mut r, plan, &stream, "").await;
            r.capacity = c;
            if c.is_none() {
                r.notes
                    .push("no rate met the SLO; lower --start-rate or relax --slo".into());
            }
            return Ok(r);
        }
        (Some(c), _) => c,
        (None, _) => {
            eprintln!("measuring capacity C first (pass --capacity to skip)...");
            let c = scenario::capacity(&target, &mut r, plan, &stream, "capacity ")
                .await
                .context("capacity search found no rate that meets the SLO; pass --capacity")?;
            eprintln!("C = {c:.0} requests/s");
            c
        }
    };
    r.capacity = Some(c);
    match s {
        Scenario::Ramp => {
            let m = args
                .multiples
                .clone()
                .unwrap_or(vec![0.5, 1.0, 2.0, 3.0, 5.0]);
            scenario::ramp(&target, &mut r, plan, c, &m).await;
        }
        Scenario::Sweep => {
            let m = args
                .multiples
                .clone()
                .unwrap_or(vec![0.5, 1.0, 2.0, 3.0, 5.0, 10.0]);
            scenario::sweep(&target, &mut r, plan, c, &m).await;
        }
        Scenario::HotPartition => {
            let hp = HotPlan {
                uniform_rate: args.rate.unwrap_or(c * 0.5),
                attack_multiplier: args.attack_multiplier,
            };
            let limit = args.hot_limit;
            scenario::hot_partition(&target, &mut r, plan, &hp, async move || {
                conn.ddl(&format!(
                    "ALTER TABLE {KEYSPACE}.{table} WITH per_partition_rate_limit = {{'max_reads_per_second': {limit}}}"
                ))
                .await
            })
            .await;
            if let Some(line) = scenario::hot_partition_summary(&r, limit) {
                r.notes.push(line);
            }
        }
        Scenario::Capacity
        | Scenario::Ceiling
        | Scenario::Versus
        | Scenario::Faults
        | Scenario::Ravendb
        | Scenario::Gsuneido
        | Scenario::HotRows => {}
    }
    Ok(r)
}

/// `sluice bench faults`: the load, the faults on `--fault-pid` and the final reads.
async fn run_faults(args: &BenchArgs, plan: &Plan) -> anyhow::Result<()> {
    if args.client != ClientKind::Driver {
        bail!("faults needs --client driver (the raw client drives one node and never retries)");
    }
    let Some(pid) = args.fault_pid else {
        bail!("faults needs --fault-pid PID, the process of one of the --nodes");
    };
    if args.faults.is_empty() {
        bail!("faults needs at least one fault (--faults kill,stop,restart)");
    }
    let mut node = FaultNode::from_pid(
        pid,
        args.fault_node.as_deref(),
        args.restart_cmd.as_deref(),
        &args.faults,
    )?;
    let opts = args.driver_options(Scenario::Faults, &args.nodes, plan);
    let conn = Connection::open(&opts).await?;
    let rate = args.rate.unwrap_or(1000.0);
    let fp = FaultPlan {
        rate,
        keys: plan.partitions,
        faults: args.faults.clone(),
        warm_up: args.fault_warm_up,
        phase: args.phase,
        hold: args.fault_hold,
        deadline: plan.run.deadline,
        client_timeout: plan.run.client_timeout,
        max_in_flight: plan.run.max_in_flight,
        seed: args.seed,
        progress: !args.quiet,
    };
    let settings = format!(
        "{rate:.0} requests/s open loop (constant), half writes half reads over {} keys of \
         {KEYSPACE}.{} (pk bigint PRIMARY KEY, v bigint); scylla driver, {} connection(s)/host, \
         {}, retry policy {}; deadline {} ms, client timeout {} ms; faults {} on pid {pid}, \
         warm-up {} s, hold {} s, phases {} s",
        fp.keys,
        faults::FAULT_TABLE,
        opts.connections,
        opts.describe(),
        match args.retry_policy {
            RetryMode::None => "none".to_string(),
            RetryMode::Stock => format!("stock ({} retries)", args.retries),
        },
        fp.deadline.as_secs_f64() * 1e3,
        fp.client_timeout.as_secs_f64() * 1e3,
        args.faults
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(","),
        fp.warm_up.as_secs_f64(),
        fp.hold.as_secs_f64(),
        fp.phase.as_secs_f64(),
    );
    eprintln!("{settings}");
    let report = faults::run(&conn, &fp, &mut node, settings).await?;
    println!();
    print!("{}", report.text());
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// Table of the `versus` scenario: created afresh on both endpoints so that both start empty.
const VERSUS_TABLE: &str = "versus_kv";

/// Checks the options of `versus` before any connection is made.
fn check_versus(args: &BenchArgs) -> anyhow::Result<()> {
    if args.against.is_empty() {
        bail!("versus needs --against HOST:PORT (the reference endpoint, e.g. Cassandra)");
    }
    if args.workloads.is_empty() {
        bail!("versus needs at least one workload (--workloads write,read)");
    }
    if args.capacity.is_some() {
        bail!("versus measures each endpoint's capacity itself; use --common-rate to fix the rate of the latency step");
    }
    if args.svg.is_some() {
        bail!("versus writes no --svg; use --report for its side-by-side page");
    }
    if !(args.common_fraction > 0.0 && args.common_fraction <= 10.0) {
        bail!("--common-fraction must be in (0, 10]");
    }
    if args
        .common_rate
        .is_some_and(|r| !(r.is_finite() && r > 0.0))
    {
        bail!("--common-rate must be a positive rate");
    }
    if let Some(p) = &args.pause_pids {
        if p.len() != 2 || p.contains(&0) || p[0] == p[1] {
            bail!("--pause-pids takes the two servers' process ids, --nodes' first");
        }
    }
    let rate_ok = args.warm_up_rate.is_finite() && args.warm_up_rate > 0.0;
    if !args.warm_up.is_zero() && !rate_ok {
        bail!("--warm-up-rate must be a positive rate");
    }
    Ok(())
}

/// One line of what both sides share.
fn shared_settings(args: &BenchArgs, plan: &Plan) -> String {
    let workloads: Vec<&str> = args.workloads.iter().map(|w| w.name()).collect();
    format!(
        "{}, {} connection(s)/{}, consistency ONE, retry policy {}; \
         table {KEYSPACE}.{VERSUS_TABLE} (pk bigint, ck int, v blob), {}-byte values, {} partitions \
         (preloaded before reads); {} arrivals; workloads {}; {}; capacity probes {} s from {:.0}/s \
         (p99 <= {} ms, errors < 0.1%), cooldown {} s, {}; common-rate step {} s at {}; \
         deadline {} ms, client timeout {} ms, lag tolerance {} ms",
        match args.client {
            ClientKind::Driver => "scylla driver",
            ClientKind::Raw => "raw CQL v4 client (pipelined, shard-aware, no retries)",
        },
        args.connections(),
        match args.client {
            ClientKind::Driver => "host",
            ClientKind::Raw => "shard",
        },
        match args.retry_policy {
            RetryMode::None => "none".to_string(),
            RetryMode::Stock => format!("stock ({} retries)", args.retries),
        },
        crate::driver::VALUE_LEN,
        plan.partitions,
        format!("{:?}", plan.run.arrival).to_lowercase(),
        workloads.join(","),
        if args.warm_up.is_zero() {
            "no warm-up".to_string()
        } else {
            format!(
                "warm-up {} s at {:.0}/s per endpoint before each workload",
                args.warm_up.as_secs_f64(),
                args.warm_up_rate
            )
        },
        plan.probe_step.as_secs_f64(),
        plan.start_rate,
        plan.slo.as_secs_f64() * 1e3,
        plan.cooldown.as_secs_f64(),
        match &plan.settle {
            Some(st) => format!(
                "then up to {} s for a quiet machine (< {} busy CPUs)",
                st.max_wait.as_secs_f64(),
                st.busy_cpus_below
            ),
            None => "no wait for a quiet machine".to_string(),
        },
        plan.step.as_secs_f64(),
        match args.common_rate {
            Some(r) => format!("{r:.0}/s"),
            None => format!(
                "{}x the lower capacity",
                crate::report_num(args.common_fraction)
            ),
        },
        plan.run.deadline.as_secs_f64() * 1e3,
        plan.run.client_timeout.as_secs_f64() * 1e3,
        plan.run.lag_tolerance.as_secs_f64() * 1e3,
    )
}

/// `sluice bench versus`: both endpoints, one generator, one table.
async fn run_versus(args: &BenchArgs, plan: &Plan) -> anyhow::Result<()> {
    check_versus(args)?;
    let labels = [
        args.label.clone().unwrap_or_else(|| "sluice".into()),
        args.against_label.clone(),
    ];
    let nodes = [args.nodes.clone(), args.against.clone()];
    let mut reports: [RunReport; 2] = Default::default();
    let mut conns = Vec::with_capacity(2);
    let mut durability: [String; 2] = Default::default();
    for side in 0..2 {
        let opts = args.driver_options(Scenario::Versus, &nodes[side], plan);
        let conn = Connection::open(&opts)
            .await
            .with_context(|| format!("{} endpoint", labels[side]))?;
        durability[side] = format_durability(&conn.durability_settings().await);
        conn.create_table(VERSUS_TABLE, true)
            .await
            .with_context(|| format!("schema on {}", labels[side]))?;
        let mut r = args.new_report(Scenario::Versus, plan, &["requests"]);
        r.label = labels[side].clone();
        r.target = nodes[side].join(",");
        reports[side] = r;
        conns.push(conn);
    }
    match args.client {
        ClientKind::Driver => {
            let mut targets = Vec::with_capacity(2);
            for (side, conn) in conns.iter().enumerate() {
                let (target, notes) = CqlTarget::prepare(conn, VERSUS_TABLE, None).await?;
                reports[side].notes.extend(notes);
                targets.push(Arc::new(target));
            }
            let targets = [targets[0].clone(), targets[1].clone()];
            run_versus_with(args, plan, targets, reports, durability, labels).await
        }
        ClientKind::Raw => {
            // The schema is in place; the driver sessions would only add background work.
            drop(conns);
            let mut targets = Vec::with_capacity(2);
            for side in 0..2 {
                let opts = RawOptions {
                    connections: args.connections(),
                    table: VERSUS_TABLE.to_string(),
                    using_timeout: None,
                    batch_rows: 1,
                    consistency: args.consistency(Scenario::Versus),
                    choice: NodeChoice::RoundRobin,
                };
                let (target, notes) = RawTarget::connect_with(&nodes[side], opts)
                    .await
                    .with_context(|| format!("raw client to {}", labels[side]))?;
                reports[side]
                    .notes
                    .push(format!("client: {}", target.describe()));
                reports[side].notes.extend(notes);
                targets.push(Arc::new(target));
            }
            let targets = [targets[0].clone(), targets[1].clone()];
            run_versus_with(args, plan, targets, reports, durability, labels).await
        }
    }
}

/// The measured part of `versus`, with either client.
async fn run_versus_with<T: Target>(
    args: &BenchArgs,
    plan: &Plan,
    targets: [Arc<T>; 2],
    mut reports: [RunReport; 2],
    durability: [String; 2],
    labels: [String; 2],
) -> anyhow::Result<()> {
    let [a, b] = [&targets[0], &targets[1]];
    if args.workloads.iter().any(|w| w.read_fraction() > 0.0) {
        for (side, t) in [a, b].into_iter().enumerate() {
            eprintln!(
                "populating {} partitions on {}...",
                plan.partitions, labels[side]
            );
            let failed = populate(t, 0..plan.partitions as i64, 1).await;
            if failed > 0 {
                reports[side]
                    .notes
                    .push(format!("{failed} populate writes failed"));
            }
        }
    }
    let vp = VersusPlan {
        workloads: args.workloads.clone(),
        common_fraction: args.common_fraction,
        common_rate: args.common_rate,
        warm_up: (!args.warm_up.is_zero()).then_some(WarmUp {
            duration: args.warm_up,
            rate: args.warm_up_rate,
        }),
        pause_pids: match args.pause_pids.as_deref() {
            Some(&[a, b]) => [Some(a), Some(b)],
            _ => [None, None],
        },
    };
    if let [Some(_), Some(_)] = vp.pause_pids {
        for side in 0..2 {
            reports[side].notes.push(format!(
                "while {} ran a step, {}'s server process was stopped (--pause-pids)",
                labels[side],
                labels[1 - side]
            ));
        }
    }
    let outcome = versus::run([a, b], &mut reports, plan, &vp).await;
    let v = VersusReport {
        shared: shared_settings(args, plan),
        durability_note: args.durability_note.clone(),
        durability,
        outcome,
        runs: reports,
        max_lag: plan.max_lag,
    };
    println!();
    print!("{}", v.text());
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_vec_pretty(&v)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &args.report {
        std::fs::write(p, v.html()).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(dir) = &args.hgrm_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut n = 0;
        for r in &v.runs {
            for (i, (step, class, h)) in r.histograms.iter().enumerate() {
                let p = dir.join(format!(
                    "{}-{i:02}-{}-{}.hgrm",
                    file_stem(&r.label),
                    file_stem(step),
                    file_stem(class)
                ));
                std::fs::write(&p, hgrm(h)).with_context(|| format!("writing {}", p.display()))?;
                n += 1;
            }
        }
        eprintln!("wrote {n} histograms into {}", dir.display());
    }
    Ok(())
}

/// Arguments of `sluice demo`.
#[derive(Clone, Debug, clap::Args)]
pub struct DemoArgs {
    /// Where to write the HTML report.
    #[arg(long, default_value = "report.html")]
    pub out: PathBuf,
    /// Seconds per ramp step (5 steps, plus a short capacity search).
    #[arg(long, value_parser = parse_duration, default_value = "6s")]
    pub step: Duration,
}

/// Starts a Sluice node from `serve_exe` in a temporary directory, runs a short `ramp` against it,
/// writes the report and prints where it is. The node is stopped on return.
pub async fn run_demo(args: DemoArgs, serve_exe: &Path) -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    // A free port rather than 7000, so that the demo runs beside a cluster on this machine.
    let internode_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let internode = format!("127.0.0.1:{internode_port}");
    eprintln!(
        "starting {} on {addr} (data in {})",
        serve_exe.display(),
        dir.path().display()
    );
    let child = std::process::Command::new(serve_exe)
        .args([
            "serve",
            "--listen",
            &addr,
            "--internode-listen",
            &internode,
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", serve_exe.display()))?;
    // Kills the node however this function returns.
    struct Node(std::process::Child);
    impl Drop for Node {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut node = Node(child);
    let up = async {
        loop {
            if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), up)
        .await
        .is_err()
    {
        if let Ok(Some(st)) = node.0.try_wait() {
            bail!("the node exited ({st}) before listening on {addr}");
        }
        bail!("the node did not listen on {addr} within 30 s");
    }
    let out = std::path::absolute(&args.out).unwrap_or(args.out.clone());
    let bench = BenchArgs {
        scenario: Some(Scenario::Ramp),
        nodes: vec![addr],
        connections: Some(2),
        client: ClientKind::Driver,
        // The demo runs on the runtime its caller built.
        generator_threads: None,
        capacity: None,
        workload: Workload::Write,
        arrival: Arrival::Constant,
        deadline: None,
        batch_rows: 1,
        client_timeout: None,
        // Forgiving settings: a first run on a laptop or a busy machine must still find a C.
        lag_tolerance: Duration::from_millis(10),
        max_lag: 0.05,
        confirm_failures: false,
        step: args.step,
        // Capacity probes are shorter than the ramp steps to keep the demo near a minute.
        probe_step: Some((args.step / 3).max(Duration::from_secs(1))),
        cooldown: Duration::from_millis(500),
        settle: None,
        slo: Duration::from_millis(50),
        start_rate: 500.0,
        multiples: None,
        partitions: 10_000,
        using_timeout: Duration::from_millis(10),
        rate: None,
        attack_multiplier: 8.0,
        attack_rows: 10,
        hot_limit: 100,
        consistency: None,
        replication_factor: None,
        load_balancing: Balancing::TokenAware,
        faults: vec![FaultKind::Kill, FaultKind::Stop, FaultKind::Restart],
        fault_pid: None,
        fault_node: None,
        restart_cmd: None,
        fault_hold: Duration::from_secs(10),
        fault_warm_up: Duration::from_secs(5),
        phase: Duration::from_secs(15),
        retry_policy: RetryMode::None,
        retries: 3,
        max_in_flight: 100_000,
        seed: 1,
        label: Some("sluice (demo)".into()),
        json: None,
        report: Some(out.clone()),
        svg: None,
        hgrm_dir: None,
        against: Vec::new(),
        against_label: "cassandra".into(),
        workloads: vec![Workload::Write, Workload::Read],
        common_fraction: 0.8,
        common_rate: None,
        warm_up: Duration::ZERO,
        warm_up_rate: 10_000.0,
        pause_pids: None,
        durability_note: None,
        compare: None,
        quiet: false,
        txn_form: crate::txn_bench::TxnForm::Accord,
        txn_clients: None,
        txn_keys: None,
        txn_value_bytes: vec![102_400, 1_048_576],
        txn_hot_multiple: 64,
        txn_rounds: 2,
        txn_metrics: Vec::new(),
    };
    let plan = bench.plan(Scenario::Ramp);
    let r = run_against_cql(&bench, Scenario::Ramp, &plan).await;
    drop(node);
    let r = r?;
    print_summary(&r);
    write_outputs(&bench, &r)?;
    println!("report: {}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: BenchArgs,
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("1e9s").is_err());
    }

    #[test]
    fn cli_defaults_and_scenario_deadlines() {
        let t = T::try_parse_from(["x", "ramp", "--nodes", "a:1,b:2", "--capacity", "5000"])
            .expect("parse");
        assert_eq!(t.a.scenario, Some(Scenario::Ramp));
        assert_eq!(t.a.nodes, vec!["a:1", "b:2"]);
        let p = t.a.plan(Scenario::Ramp);
        assert_eq!(p.run.deadline, Duration::from_millis(20));
        assert_eq!(p.run.client_timeout, p.run.deadline);
        assert_eq!(t.a.retry_policy, RetryMode::None);
        let t = T::try_parse_from(["x", "--compare", "a.json", "b.json", "--report", "x.html"])
            .expect("parse");
        assert_eq!(t.a.compare.map(|v| v.len()), Some(2));
        assert!(T::try_parse_from(["x", "warp"]).is_err());
    }

    #[test]
    fn client_option_defaults_to_the_driver_and_names_the_raw_client() {
        let t = T::try_parse_from(["x", "capacity"]).expect("parse");
        assert_eq!(t.a.client, ClientKind::Driver);
        let shared = shared_settings(&t.a, &t.a.plan(Scenario::Versus));
        assert!(
            shared.starts_with("scylla driver, 4 connection(s)/host,"),
            "{shared}"
        );
        let t = T::try_parse_from(["x", "versus", "--client", "raw"]).expect("parse");
        assert_eq!(t.a.connections(), 1, "one pipelined connection per shard");
        let t = T::try_parse_from(["x", "versus", "--client", "raw", "--connections", "2"])
            .expect("parse");
        assert_eq!(t.a.client, ClientKind::Raw);
        let shared = shared_settings(&t.a, &t.a.plan(Scenario::Versus));
        assert!(
            shared.starts_with(
                "raw CQL v4 client (pipelined, shard-aware, no retries), 2 connection(s)/shard,"
            ),
            "{shared}"
        );
        assert!(T::try_parse_from(["x", "ramp", "--client", "fast"]).is_err());
    }

    #[tokio::test]
    async fn the_raw_client_refuses_retries() {
        let t = T::try_parse_from([
            "x",
            "capacity",
            "--client",
            "raw",
            "--retry-policy",
            "stock",
        ])
        .expect("parse");
        let e = run_bench(t.a).await.expect_err("raw with retries");
        assert!(e.to_string().contains("never retries"), "{e}");
    }

    #[test]
    fn cluster_options_parse_with_per_scenario_defaults() {
        let t = T::try_parse_from([
            "x",
            "faults",
            "--nodes",
            "127.0.0.1:9042,127.0.0.2:9042,127.0.0.3:9042",
            "--fault-pid",
            "42",
        ])
        .expect("parse");
        assert_eq!(t.a.scenario, Some(Scenario::Faults));
        assert_eq!(
            t.a.faults,
            vec![FaultKind::Kill, FaultKind::Stop, FaultKind::Restart]
        );
        assert_eq!(t.a.fault_hold, Duration::from_secs(10));
        let plan = t.a.plan(Scenario::Faults);
        assert_eq!(plan.run.client_timeout, Duration::from_secs(1));
        let o = t.a.driver_options(Scenario::Faults, &t.a.nodes, &plan);
        assert_eq!(o.nodes.len(), 3);
        assert_eq!(o.consistency, ConsistencyLevel::Quorum);
        assert_eq!(o.replication_factor, 3);
        assert_eq!(o.balancing, Balancing::TokenAware);
        assert_eq!(
            o.describe(),
            "3 node(s), token-aware, consistency QUORUM, keyspace replication_factor 3"
        );

        let t = T::try_parse_from([
            "x",
            "sweep",
            "--consistency",
            "local_quorum",
            "--replication-factor",
            "3",
            "--load-balancing",
            "round-robin",
        ])
        .expect("parse");
        let plan = t.a.plan(Scenario::Sweep);
        let o = t.a.driver_options(Scenario::Sweep, &t.a.nodes, &plan);
        assert_eq!(o.consistency, ConsistencyLevel::LocalQuorum);
        assert_eq!(o.replication_factor, 3);
        assert_eq!(o.balancing, Balancing::RoundRobin);
        let t = T::try_parse_from(["x", "sweep", "--faults", "stop,kill"]).expect("parse");
        assert_eq!(t.a.faults, vec![FaultKind::Stop, FaultKind::Kill]);
        let o =
            t.a.driver_options(Scenario::Sweep, &t.a.nodes, &t.a.plan(Scenario::Sweep));
        assert_eq!(o.consistency, ConsistencyLevel::One);
        assert_eq!(o.replication_factor, 1);
        assert!(T::try_parse_from(["x", "sweep", "--replication-factor", "0"]).is_err());
        assert!(T::try_parse_from(["x", "sweep", "--consistency", "MOST"]).is_err());
        assert!(T::try_parse_from(["x", "faults", "--faults", "reboot"]).is_err());
    }

    #[tokio::test]
    async fn faults_and_the_raw_client_check_their_options_before_connecting() {
        let t = T::try_parse_from(["x", "faults"]).expect("parse");
        let e = run_bench(t.a).await.expect_err("no pid");
        assert!(e.to_string().contains("--fault-pid"), "{e}");
        let t = T::try_parse_from(["x", "faults", "--client", "raw", "--fault-pid", "1"])
            .expect("parse");
        let e = run_bench(t.a).await.expect_err("raw");
        assert!(e.to_string().contains("--client driver"), "{e}");
        // Any consistency level and either balancing pass the checks: a closed port is
        // what stops these, when the driver connects.
        for lb in ["token-aware", "round-robin"] {
            let t = T::try_parse_from([
                "x",
                "capacity",
                "--client",
                "raw",
                "--consistency",
                "QUORUM",
                "--load-balancing",
                lb,
                "--nodes",
                "127.0.0.1:1,127.0.0.2:1",
            ])
            .expect("parse");
            assert_eq!(
                t.a.consistency(Scenario::Capacity),
                ConsistencyLevel::Quorum
            );
            let e = run_bench(t.a).await.expect_err("nothing listens");
            let e = format!("{e:#}");
            assert!(
                !e.contains("consistency") && !e.contains("--load-balancing"),
                "{e}"
            );
        }
    }

    #[test]
    fn versus_options_parse_and_are_checked() {
        let t = T::try_parse_from([
            "x",
            "versus",
            "--nodes",
            "127.0.0.1:9342",
            "--against",
            "127.0.0.1:9343",
            "--slo",
            "20ms",
            "--durability-note",
            "periodic 10 s on both",
        ])
        .expect("parse");
        assert_eq!(t.a.scenario, Some(Scenario::Versus));
        assert_eq!(t.a.against, vec!["127.0.0.1:9343"]);
        assert_eq!(t.a.workloads, vec![Workload::Write, Workload::Read]);
        assert_eq!(t.a.against_label, "cassandra");
        assert_eq!(
            t.a.durability_note.as_deref(),
            Some("periodic 10 s on both")
        );
        assert_eq!(t.a.plan(Scenario::Versus).slo, Duration::from_millis(20));
        assert!(check_versus(&t.a).is_ok());
        let shared = shared_settings(&t.a, &t.a.plan(Scenario::Versus));
        assert!(shared.contains("p99 <= 20 ms") && shared.contains("0.8x the lower capacity"));
        assert!(shared.contains("warm-up 30 s at 10000/s per endpoint before each workload"));
        assert!(shared.contains("then up to 15 s for a quiet machine"));

        let t = T::try_parse_from(["x", "versus", "--workloads", "read,mix"]).expect("parse");
        assert_eq!(t.a.workloads, vec![Workload::Read, Workload::Mix]);
        let e = check_versus(&t.a).expect_err("no --against");
        assert!(e.to_string().contains("--against"));
        let t = T::try_parse_from(["x", "versus", "--against", "h:1", "--capacity", "5"])
            .expect("parse");
        assert!(check_versus(&t.a).is_err());
        let t = T::try_parse_from(["x", "versus", "--against", "h:1", "--common-fraction", "0"])
            .expect("parse");
        assert!(check_versus(&t.a).is_err());
        let t = T::try_parse_from(["x", "versus", "--against", "h:1", "--warm-up-rate", "0"])
            .expect("parse");
        assert!(check_versus(&t.a).is_err());
        let t = T::try_parse_from([
            "x",
            "versus",
            "--against",
            "h:1",
            "--warm-up",
            "0s",
            "--settle",
            "0s",
        ])
        .expect("parse");
        assert!(check_versus(&t.a).is_ok());
        assert_eq!(t.a.plan(Scenario::Versus).settle, None);
        let shared = shared_settings(&t.a, &t.a.plan(Scenario::Versus));
        assert!(shared.contains("no warm-up") && shared.contains("no wait for a quiet machine"));
    }
}
