//! `sluice bench faults`: open-loop writes and reads at a consistency level while one node is,
//! in turn, killed (SIGKILL, then started again), stopped (SIGSTOP, then SIGCONT) and restarted
//! (SIGTERM, then started again). Reports goodput, p99, errors by kind and retries per phase,
//! the time to recover after each fault, stale reads during the run and lost acknowledged
//! writes at the end.
//!
//! Every write carries a value that is also its write timestamp (`USING TIMESTAMP`), drawn from
//! one increasing sequence, so that last-write-wins keeps the highest value of a key. The
//! highest acknowledged value of each key is then a floor: a later read that returns less is
//! stale, and a final read that returns less has lost an acknowledged write.

use crate::driver::{Connection, KEYSPACE};
use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use serde::Serialize;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, Instant};

/// Table of the fault scenario, recreated at every run.
pub const FAULT_TABLE: &str = "fault_kv";

/// Most requests one run records (about 20 bytes each).
const MAX_RECORDS: u64 = 20_000_000;

/// Width of the windows in which the recovery is looked for, and their step.
const RECOVERY_WINDOW_US: u64 = 1_000_000;
const RECOVERY_STEP_US: u64 = 100_000;

/// Share of the baseline goodput that counts as recovered.
pub const RECOVERED_SHARE: f64 = 0.95;
/// Target: goodput during a one-node fault, as a share of before.
pub const DURING_TARGET: f64 = 0.60;
/// Target: time from the node's return to recovery.
pub const RECOVERY_TARGET_S: f64 = 5.0;

/// What is done to the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FaultKind {
    /// SIGKILL, then the node is started again after the hold.
    Kill,
    /// SIGSTOP for the hold, then SIGCONT.
    Stop,
    /// SIGTERM (orderly stop), then the node is started again at once.
    Restart,
}

impl FaultKind {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Stop => "stop",
            FaultKind::Restart => "restart",
        }
    }

    /// Whether the node's process ends (and a new one must be started).
    fn ends_process(self) -> bool {
        !matches!(self, FaultKind::Stop)
    }
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOutcome {
    /// Success within the deadline.
    Ok,
    /// Success after the deadline.
    Late,
    /// Unavailable: the coordinator knew too few replicas were alive.
    Unavailable,
    /// Read_timeout / Write_timeout from the server.
    ServerTimeout,
    /// Read_failure / Write_failure.
    Failure,
    /// Overloaded.
    Overloaded,
    /// The client stopped waiting.
    ClientTimeout,
    /// Connection broken or no node to send to.
    Connection,
    /// Anything else.
    Other,
}

/// Error kinds in report order (every outcome except Ok and Late).
pub const ERROR_KINDS: [FaultOutcome; 7] = [
    FaultOutcome::Unavailable,
    FaultOutcome::ServerTimeout,
    FaultOutcome::Failure,
    FaultOutcome::Overloaded,
    FaultOutcome::ClientTimeout,
    FaultOutcome::Connection,
    FaultOutcome::Other,
];

impl FaultOutcome {
    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            FaultOutcome::Ok => "ok",
            FaultOutcome::Late => "late",
            FaultOutcome::Unavailable => "unavailable",
            FaultOutcome::ServerTimeout => "server_timeout",
            FaultOutcome::Failure => "failure",
            FaultOutcome::Overloaded => "overloaded",
            FaultOutcome::ClientTimeout => "client_timeout",
            FaultOutcome::Connection => "connection",
            FaultOutcome::Other => "other",
        }
    }

    /// Classifies a driver error.
    pub fn of_error(e: &ExecutionError) -> FaultOutcome {
        match e {
            ExecutionError::RequestTimeout(_) => FaultOutcome::ClientTimeout,
            ExecutionError::EmptyPlan | ExecutionError::ConnectionPoolError(_) => {
                FaultOutcome::Connection
            }
            ExecutionError::LastAttemptError(a) => match a {
                RequestAttemptError::BrokenConnectionError(_)
                | RequestAttemptError::UnableToAllocStreamId => FaultOutcome::Connection,
                RequestAttemptError::DbError(db, _) => match db {
                    DbError::Unavailable { .. } => FaultOutcome::Unavailable,
                    DbError::ReadTimeout { .. } | DbError::WriteTimeout { .. } => {
                        FaultOutcome::ServerTimeout
                    }
                    DbError::ReadFailure { .. } | DbError::WriteFailure { .. } => {
                        FaultOutcome::Failure
                    }
                    DbError::Overloaded => FaultOutcome::Overloaded,
                    _ => FaultOutcome::Other,
                },
                _ => FaultOutcome::Other,
            },
            _ => FaultOutcome::Other,
        }
    }
}

/// One completed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Done {
    /// Intended send time, microseconds from the start of the run.
    pub intended_us: u64,
    /// From the intended send time to the answer, microseconds.
    pub latency_us: u64,
    /// A write (else a read).
    pub write: bool,
    /// How it ended.
    pub outcome: FaultOutcome,
    /// A read that returned less than a write acknowledged before it was sent.
    pub stale: bool,
}

/// The highest acknowledged value of every key: the floor of what a read may return.
#[derive(Debug)]
pub struct AckLog {
    acked: Vec<AtomicI64>,
}

impl AckLog {
    /// `keys` keys, none written (floor 0; every written value is positive).
    pub fn new(keys: u64) -> Self {
        Self {
            acked: (0..keys).map(|_| AtomicI64::new(0)).collect(),
        }
    }

    /// Records that the write of `value` to `key` was acknowledged.
    pub fn ack(&self, key: u64, value: i64) {
        debug_assert!(value > 0, "written values are positive");
        if let Some(a) = self.acked.get(key as usize) {
            a.fetch_max(value, Ordering::AcqRel);
        }
    }

    /// The highest value acknowledged for `key` so far (0: none).
    pub fn floor(&self, key: u64) -> i64 {
        self.acked
            .get(key as usize)
            .map_or(0, |a| a.load(Ordering::Acquire))
    }

    /// Whether a read of a key whose floor was `floor` when it was sent, returning `got`
    /// (None: no row), is stale.
    pub fn is_stale(floor: i64, got: Option<i64>) -> bool {
        got.unwrap_or(0) < floor
    }

    /// Keys with an acknowledged write, with their floor.
    pub fn written(&self) -> Vec<(u64, i64)> {
        (0..self.acked.len() as u64)
            .map(|k| (k, self.floor(k)))
            .filter(|(_, v)| *v > 0)
            .collect()
    }
}

/// The final reads' verdict at one consistency level.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FinalCheck {
    /// Consistency level of the reads.
    pub consistency: String,
    /// Keys with an acknowledged write, all read.
    pub keys: u64,
    /// Keys whose read returned less than the highest acknowledged value.
    pub lost: u64,
    /// Keys whose read failed (not counted as lost).
    pub unreadable: u64,
    /// Up to 10 lost keys: (key, acknowledged, read; 0 when no row).
    pub examples: Vec<(u64, i64, i64)>,
}

impl FinalCheck {
    /// Folds the final reads (key, highest acknowledged, what the read returned or None when
    /// it failed) into a verdict.
    pub fn of(consistency: &str, reads: &[(u64, i64, Option<Option<i64>>)]) -> Self {
        let mut c = FinalCheck {
            consistency: consistency.to_string(),
            keys: reads.len() as u64,
            ..Default::default()
        };
        for &(key, acked, got) in reads {
            match got {
                None => c.unreadable += 1,
                Some(v) if AckLog::is_stale(acked, v) => {
                    c.lost += 1;
                    if c.examples.len() < 10 {
                        c.examples.push((key, acked, v.unwrap_or(0)));
                    }
                }
                Some(_) => {}
            }
        }
        c
    }
}

/// Whether a phase is the baseline, a fault or the time after a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PhaseKind {
    /// The first seconds, while connections and caches warm up: in no comparison.
    WarmUp,
    /// Before the first fault: the baseline.
    Before,
    /// While the node is down or stopped.
    During,
    /// From the node's return.
    After,
}

/// A span of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PhaseSpan {
    /// e.g. "before", "kill: down", "kill: after".
    pub name: String,
    /// Which kind of phase.
    pub kind: PhaseKind,
    /// Start, microseconds from the start of the run.
    pub start_us: u64,
    /// End (exclusive).
    pub end_us: u64,
}

/// The figures of one phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseReport {
    /// Phase name.
    pub name: String,
    /// Which kind of phase.
    pub kind: PhaseKind,
    /// Start, seconds from the start of the run.
    pub start_s: f64,
    /// Length, seconds.
    pub duration_s: f64,
    /// Requests whose intended send time falls in the phase.
    pub offered: u64,
    /// Of which succeeded within the deadline.
    pub ok: u64,
    /// Of which succeeded after the deadline.
    pub late: u64,
    /// Of which failed, by kind (every kind listed).
    pub errors: Vec<(String, u64)>,
    /// Goodput, requests/s.
    pub goodput_per_s: f64,
    /// Goodput as a share of the baseline's.
    pub goodput_vs_before: Option<f64>,
    /// 99th percentile of the latency from the intended send time over every answer, ms.
    pub p99_ms: f64,
    /// Retries the driver's policy made while the phase lasted.
    pub retries: u64,
    /// Retries per logical request of the phase.
    pub retries_per_request: f64,
    /// Reads answered successfully.
    pub reads_ok: u64,
    /// Stale reads.
    pub stale_reads: u64,
    /// After a fault: seconds from the node's return (the phase start) to the first 1 s window
    /// with goodput at least 95% of the baseline's; None if it never came within the phase.
    pub time_to_recover_s: Option<f64>,
}

/// Counts of the retry counter over time: (microseconds from the start, retries so far).
pub type RetrySamples = [(u64, u64)];

/// Retries made between `start_us` and `end_us`, from the samples nearest to both ends.
fn retries_between(samples: &RetrySamples, start_us: u64, end_us: u64) -> u64 {
    let at = |t: u64| {
        // The last sample at or before t (0 before the first one).
        let i = samples.partition_point(|(s, _)| *s <= t);
        if i == 0 {
            0
        } else {
            samples[i - 1].1
        }
    };
    at(end_us).saturating_sub(at(start_us))
}

/// The first offset from `from_us` at which a 1 s window holds at least `share` of
/// `baseline_per_s` successes, looked for until `until_us`; None if none does.
pub fn time_to_recover(
    ok_times_us: &[u64],
    from_us: u64,
    until_us: u64,
    baseline_per_s: f64,
    share: f64,
) -> Option<Duration> {
    debug_assert!(ok_times_us.is_sorted());
    let need = baseline_per_s * share * (RECOVERY_WINDOW_US as f64 / 1e6);
    let mut start = from_us;
    while start + RECOVERY_WINDOW_US <= until_us {
        let lo = ok_times_us.partition_point(|t| *t < start);
        let hi = ok_times_us.partition_point(|t| *t < start + RECOVERY_WINDOW_US);
        if (hi - lo) as f64 >= need {
            return Some(Duration::from_micros(start - from_us));
        }
        start += RECOVERY_STEP_US;
    }
    None
}

/// Per-phase figures from the records of a run. The first `Before` phase is the baseline.
pub fn analyse(
    records: &[Done],
    retries: &RetrySamples,
    phases: &[PhaseSpan],
    unsent: &[u64],
) -> Vec<PhaseReport> {
    let mut ok_times: Vec<u64> = records
        .iter()
        .filter(|d| d.outcome == FaultOutcome::Ok)
        .map(|d| d.intended_us)
        .collect();
    ok_times.sort_unstable();
    let mut out: Vec<PhaseReport> = Vec::with_capacity(phases.len());
    let baseline_span = phases.iter().find(|p| p.kind == PhaseKind::Before);
    let baseline = baseline_span.map(|p| {
        let n = ok_times.partition_point(|t| *t < p.end_us)
            - ok_times.partition_point(|t| *t < p.start_us);
        let secs = p.end_us.saturating_sub(p.start_us) as f64 / 1e6;
        if secs > 0.0 {
            n as f64 / secs
        } else {
            0.0
        }
    });
    for p in phases {
        let in_phase = |t: u64| t >= p.start_us && t < p.end_us;
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
            .expect("valid bounds");
        let (mut offered, mut ok, mut late, mut reads_ok, mut stale) = (0, 0, 0, 0, 0);
        let mut errors = [0u64; ERROR_KINDS.len()];
        for d in records.iter().filter(|d| in_phase(d.intended_us)) {
            offered += 1;
            h.saturating_record(d.latency_us);
            match d.outcome {
                FaultOutcome::Ok => ok += 1,
                FaultOutcome::Late => late += 1,
                e => {
                    if let Some(i) = ERROR_KINDS.iter().position(|k| *k == e) {
                        errors[i] += 1;
                    }
                }
            }
            if !d.write && matches!(d.outcome, FaultOutcome::Ok | FaultOutcome::Late) {
                reads_ok += 1;
            }
            stale += u64::from(d.stale);
        }
        let not_sent: u64 = unsent.iter().filter(|t| in_phase(**t)).count() as u64;
        offered += not_sent;
        errors[ERROR_KINDS.len() - 1] += not_sent;
        let duration_s = p.end_us.saturating_sub(p.start_us) as f64 / 1e6;
        let goodput = if duration_s > 0.0 {
            ok as f64 / duration_s
        } else {
            0.0
        };
        let base = baseline.unwrap_or(0.0);
        let retries = retries_between(retries, p.start_us, p.end_us);
        out.push(PhaseReport {
            name: p.name.clone(),
            kind: p.kind,
            start_s: p.start_us as f64 / 1e6,
            duration_s,
            offered,
            ok,
            late,
            errors: ERROR_KINDS
                .iter()
                .zip(errors)
                .map(|(k, n)| (k.name().to_string(), n))
                .collect(),
            goodput_per_s: goodput,
            goodput_vs_before: (base > 0.0).then(|| goodput / base),
            p99_ms: if h.is_empty() {
                0.0
            } else {
                h.value_at_quantile(0.99) as f64 / 1e3
            },
            retries,
            retries_per_request: if offered > 0 {
                retries as f64 / offered as f64
            } else {
                0.0
            },
            reads_ok,
            stale_reads: stale,
            time_to_recover_s: (p.kind == PhaseKind::After)
                .then(|| {
                    time_to_recover(&ok_times, p.start_us, p.end_us, base, RECOVERED_SHARE)
                        .map(|d| d.as_secs_f64())
                })
                .flatten(),
        });
    }
    out
}

/// One pass/fail line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TargetLine {
    /// What is checked.
    pub what: String,
    /// The measured value, as printed.
    pub value: String,
    /// Whether the target is met.
    pub pass: bool,
}

/// The target lines of a run: nothing lost, no stale read, goodput during each fault and the
/// recovery after it.
pub fn targets(phases: &[PhaseReport], finals: &[FinalCheck]) -> Vec<TargetLine> {
    let mut t = Vec::new();
    for f in finals {
        t.push(TargetLine {
            what: format!(
                "no acknowledged write lost (final reads at {})",
                f.consistency
            ),
            value: format!(
                "{} lost of {} keys ({} unreadable)",
                f.lost, f.keys, f.unreadable
            ),
            pass: f.lost == 0 && f.unreadable == 0,
        });
    }
    let stale: u64 = phases.iter().map(|p| p.stale_reads).sum();
    t.push(TargetLine {
        what: "no read older than a write acknowledged before it was sent".into(),
        value: format!("{stale} stale reads"),
        pass: stale == 0,
    });
    for p in phases {
        match p.kind {
            PhaseKind::During => {
                let share = p.goodput_vs_before.unwrap_or(0.0);
                t.push(TargetLine {
                    what: format!(
                        "{}: goodput >= {:.0}% of before",
                        p.name,
                        DURING_TARGET * 100.0
                    ),
                    value: format!("{:.0}%", share * 100.0),
                    pass: share >= DURING_TARGET,
                });
            }
            PhaseKind::After => {
                t.push(TargetLine {
                    what: format!(
                        "{}: goodput >= {:.0}% of before within {RECOVERY_TARGET_S} s of the node's return",
                        p.name,
                        RECOVERED_SHARE * 100.0
                    ),
                    value: match p.time_to_recover_s {
                        Some(s) => format!("after {s:.1} s"),
                        None => "not within the phase".into(),
                    },
                    pass: p.time_to_recover_s.is_some_and(|s| s <= RECOVERY_TARGET_S),
                });
            }
            PhaseKind::WarmUp | PhaseKind::Before => {}
        }
    }
    t
}

/// Settings of a fault run.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    /// Offered rate, requests/s, half writes and half reads.
    pub rate: f64,
    /// Keys written and read.
    pub keys: u64,
    /// Faults, in order.
    pub faults: Vec<FaultKind>,
    /// Length of the warm-up, in no comparison.
    pub warm_up: Duration,
    /// Length of the baseline and of each phase after a fault.
    pub phase: Duration,
    /// How long a killed node stays down, or a stopped one stopped.
    pub hold: Duration,
    /// Goodput deadline from the intended send time.
    pub deadline: Duration,
    /// The driver's client timeout.
    pub client_timeout: Duration,
    /// Cap on requests in flight.
    pub max_in_flight: usize,
    /// Seed of keys and kinds.
    pub seed: u64,
    /// One progress line per second.
    pub progress: bool,
}

/// The node the faults are applied to.
#[derive(Debug)]
pub struct FaultNode {
    /// Its CQL address (waited for after a start).
    pub addr: SocketAddr,
    /// The command that starts it again (argv).
    pub restart: Vec<String>,
    /// The environment it runs with.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: Option<PathBuf>,
    /// Where a restarted node's output goes.
    pub log: PathBuf,
    process: NodeProcess,
}

#[derive(Debug)]
enum NodeProcess {
    /// Started by someone else.
    Foreign(i32),
    /// Started by this run.
    Child(std::process::Child),
}

fn read_nul_list(path: &str) -> anyhow::Result<Vec<String>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// The value of `--name V` or `--name=V` in `argv`.
pub fn arg_value(argv: &[String], name: &str) -> Option<String> {
    let eq = format!("{name}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        if a == name {
            argv.get(i + 1).cloned()
        } else {
            a.strip_prefix(&eq).map(str::to_string)
        }
    })
}

impl FaultNode {
    /// The node whose process is `pid`: its command line, environment and directory come
    /// from /proc, so that it can be started again as it was; `addr` and `restart` override.
    pub fn from_pid(
        pid: u32,
        addr: Option<&str>,
        restart: Option<&str>,
        faults: &[FaultKind],
    ) -> anyhow::Result<Self> {
        let argv = read_nul_list(&format!("/proc/{pid}/cmdline"))
            .with_context(|| format!("no process {pid}"))?;
        let env = read_nul_list(&format!("/proc/{pid}/environ"))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.into(), v.into())))
            .collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
        let addr_text = match addr {
            Some(a) => a.to_string(),
            None => arg_value(&argv, "--listen").context(
                "the node's command line has no --listen; give its CQL address with --fault-node",
            )?,
        };
        let addr = addr_text
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .with_context(|| format!("cannot resolve {addr_text}"))?;
        if faults.iter().any(|f| f.ends_process()) && restart.is_none() {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // The parent pid is the second field after the parenthesised command name.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                let parent = read_nul_list(&format!("/proc/{ppid}/cmdline")).unwrap_or_default();
                if parent.get(1).map(String::as_str) == Some("cluster") {
                    bail!(
                        "process {pid} runs under `sluice cluster` (pid {ppid}), which stops every node when one exits: \
                         start the nodes with `sluice serve` (docs/benchmark.md) for kill and restart faults, or use --faults stop"
                    );
                }
            }
        }
        let restart = match restart {
            Some(cmd) => vec!["sh".into(), "-c".into(), format!("exec {cmd}")],
            None => argv,
        };
        Ok(Self {
            addr,
            restart,
            env,
            cwd,
            log: std::env::temp_dir().join(format!("sluice-bench-faults-node-{pid}.log")),
            process: NodeProcess::Foreign(pid as i32),
        })
    }

    /// The pid of the node's current process.
    pub fn pid(&self) -> u32 {
        match &self.process {
            NodeProcess::Foreign(p) => *p as u32,
            NodeProcess::Child(c) => c.id(),
        }
    }

    /// Whether the node's current process is a process started by this run.
    pub fn restarted(&self) -> bool {
        matches!(self.process, NodeProcess::Child(_))
    }

    fn signal(&self, sig: i32) -> anyhow::Result<()> {
        // SAFETY: kill(2) has no memory effects; the pid is the node's.
        let r = unsafe { libc::kill(self.pid() as i32, sig) };
        if r != 0 {
            bail!(
                "kill({}, {sig}): {}",
                self.pid(),
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }

    fn gone(&mut self) -> bool {
        match &mut self.process {
            NodeProcess::Child(c) => !matches!(c.try_wait(), Ok(None)),
            NodeProcess::Foreign(pid) => {
                // A zombie (exited, not yet reaped by its parent) is gone too.
                match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                    Err(_) => true,
                    Ok(s) => s
                        .rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().next())
                        .is_some_and(|state| state == "Z" || state == "X"),
                }
            }
        }
    }

    async fn wait_gone(&mut self, within: Duration) -> bool {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if self.gone() {
                return true;
            }
            sleep(Duration::from_millis(20)).await;
        }
        self.gone()
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let [exe, args @ ..] = self.restart.as_slice() else {
            bail!("empty restart command");
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        let mut cmd = std::process::Command::new(exe);
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if !self.env.is_empty() {
            cmd.env_clear().envs(self.env.iter().cloned());
        }
        if let Some(d) = &self.cwd {
            cmd.current_dir(d);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.restart.join(" ")))?;
        self.process = NodeProcess::Child(child);
        Ok(())
    }

    async fn wait_serving(&mut self, within: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let NodeProcess::Child(c) = &mut self.process {
                if let Ok(Some(st)) = c.try_wait() {
                    bail!(
                        "the restarted node exited ({st}); see {}",
                        self.log.display()
                    );
                }
            }
            if let Ok(Ok(_)) = tokio::time::timeout(
                Duration::from_millis(200),
                tokio::net::TcpStream::connect(self.addr),
            )
            .await
            {
                return Ok(());
            }
            sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "the node did not listen on {} within {within:?}; see {}",
            self.addr,
            self.log.display()
        )
    }
}

/// Everything the requests share.
struct Shared {
    start: Instant,
    session: Arc<scylla::client::session::Session>,
    write: PreparedStatement,
    read: PreparedStatement,
    acks: AckLog,
    next_value: AtomicU64,
    value_base: i64,
    records: Mutex<Vec<Done>>,
    unsent: Mutex<Vec<u64>>,
    in_flight: AtomicUsize,
    deadline: Duration,
    client_timeout: Duration,
    // Progress counters since the last line.
    ok_now: AtomicU64,
    err_now: AtomicU64,
    stale_now: AtomicU64,
}

impl Shared {
    fn us_since_start(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_micros() as u64
    }

    async fn one(self: Arc<Self>, intended: Instant, key: u64, write: bool) {
        let pk = key as i64;
        let (outcome, stale) = if write {
            let value = self.value_base + self.next_value.fetch_add(1, Ordering::Relaxed) as i64;
            let r = tokio::time::timeout(
                self.client_timeout,
                self.session
                    .execute_unpaged(&self.write, (pk, value, value)),
            )
            .await;
            match r {
                Err(_) => (FaultOutcome::ClientTimeout, false),
                Ok(Err(e)) => (FaultOutcome::of_error(&e), false),
                Ok(Ok(_)) => {
                    self.acks.ack(key, value);
                    (FaultOutcome::Ok, false)
                }
            }
        } else {
            // The floor is taken as the read is sent: any write acknowledged before counts.
            let floor = self.acks.floor(key);
            let r = tokio::time::timeout(
                self.client_timeout,
                self.session.execute_unpaged(&self.read, (pk,)),
            )
            .await;
            match r {
                Err(_) => (FaultOutcome::ClientTimeout, false),
                Ok(Err(e)) => (FaultOutcome::of_error(&e), false),
                Ok(Ok(res)) => match read_value(res) {
                    Ok(got) => (FaultOutcome::Ok, AckLog::is_stale(floor, got)),
                    Err(_) => (FaultOutcome::Other, false),
                },
            }
        };
        let now = Instant::now();
        let latency = now.saturating_duration_since(intended);
        let outcome = if outcome == FaultOutcome::Ok && latency > self.deadline {
            FaultOutcome::Late
        } else {
            outcome
        };
        match outcome {
            FaultOutcome::Ok => self.ok_now.fetch_add(1, Ordering::Relaxed),
            _ => self.err_now.fetch_add(1, Ordering::Relaxed),
        };
        if stale {
            self.stale_now.fetch_add(1, Ordering::Relaxed);
        }
        let d = Done {
            intended_us: self.us_since_start(intended),
            latency_us: latency.as_micros() as u64,
            write,
            outcome,
            stale,
        };
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(d);
        let before = self.in_flight.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a request completed that was never counted");
    }
}

/// The `v` of the first row of a read (None: no row).
fn read_value(res: scylla::response::query_result::QueryResult) -> Result<Option<i64>, String> {
    let rows = res.into_rows_result().map_err(|e| e.to_string())?;
    let row = rows
        .maybe_first_row::<(Option<i64>,)>()
        .map_err(|e| e.to_string())?;
    Ok(row.and_then(|(v,)| v))
}

/// The whole report of a run.
#[derive(Debug, Serialize)]
pub struct FaultReport {
    /// One line of settings.
    pub settings: String,
    /// The node the faults were applied to.
    pub node: String,
    /// Phases in order.
    pub phases: Vec<PhaseReport>,
    /// The phases' spans.
    pub spans: Vec<PhaseSpan>,
    /// Goodput of every second of the run (by intended send time).
    pub goodput_per_second: Vec<u64>,
    /// Requests the generator scheduled.
    pub scheduled: u64,
    /// Of which intended for a time outside every phase (after the last one ended).
    pub outside_phases: u64,
    /// Final reads at QUORUM and at ALL.
    pub finals: Vec<FinalCheck>,
    /// Pass/fail lines.
    pub targets: Vec<TargetLine>,
    /// The pid of the node at the end, and whether this run started it.
    pub node_pid_at_end: u32,
    /// Whether the node at the end is a process this run started (it keeps running).
    pub node_restarted: bool,
    /// Notes.
    pub notes: Vec<String>,
}

impl FaultReport {
    /// The printed form.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "== faults on {} ==", self.node);
        let _ = writeln!(s, "{}", self.settings);
        let _ = writeln!(
            s,
            "{:<18} {:>6} {:>6} {:>7} {:>7} {:>6} {:>9} {:>9} {:>9} {:>8} {:>6} {:>9}  errors",
            "phase",
            "start",
            "secs",
            "offered",
            "ok",
            "late",
            "goodput/s",
            "vs before",
            "p99 ms",
            "retry/rq",
            "stale",
            "recover s"
        );
        for p in &self.phases {
            let errs: Vec<String> = p
                .errors
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(k, n)| format!("{k}={n}"))
                .collect();
            let _ = writeln!(
                s,
                "{:<18} {:>6.1} {:>6.1} {:>7} {:>7} {:>6} {:>9.0} {:>9} {:>9.2} {:>8.3} {:>6} {:>9}  {}",
                p.name,
                p.start_s,
                p.duration_s,
                p.offered,
                p.ok,
                p.late,
                p.goodput_per_s,
                p.goodput_vs_before
                    .map_or("-".into(), |v| format!("{:.0}%", v * 100.0)),
                p.p99_ms,
                p.retries_per_request,
                p.stale_reads,
                p.time_to_recover_s.map_or("-".into(), |v| format!("{v:.1}")),
                if errs.is_empty() {
                    "-".to_string()
                } else {
                    errs.join(" ")
                }
            );
        }
        let _ = writeln!(
            s,
            "goodput per second: {}",
            self.goodput_per_second
                .iter()
                .map(|g| g.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        );
        for f in &self.finals {
            let _ = writeln!(
                s,
                "final reads at {}: {} keys, {} lost, {} unreadable{}",
                f.consistency,
                f.keys,
                f.lost,
                f.unreadable,
                if f.examples.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (e.g. {})",
                        f.examples
                            .iter()
                            .take(3)
                            .map(|(k, a, r)| format!("key {k}: acknowledged {a}, read {r}"))
                            .collect::<Vec<_>>()
                            .join("; ")
                    )
                }
            );
        }
        for t in &self.targets {
            let _ = writeln!(
                s,
                "{} {}: {}",
                if t.pass { "PASS" } else { "FAIL" },
                t.what,
                t.value
            );
        }
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        s
    }
}

/// Creates the table, runs the load and the faults, then the final reads.
pub async fn run(
    conn: &Connection,
    plan: &FaultPlan,
    node: &mut FaultNode,
    settings: String,
) -> anyhow::Result<FaultReport> {
    if !(plan.rate.is_finite() && plan.rate > 0.0) {
        bail!("--rate must be a positive rate for faults");
    }
    if plan.keys == 0 || plan.keys > 10_000_000 {
        bail!("--partitions must be between 1 and 10000000 for faults");
    }
    conn.create_keyspace().await?;
    conn.ddl(&format!("DROP TABLE IF EXISTS {KEYSPACE}.{FAULT_TABLE}"))
        .await
        .map_err(anyhow::Error::msg)
        .context("dropping the table")?;
    conn.ddl(&format!(
        "CREATE TABLE {KEYSPACE}.{FAULT_TABLE} (pk bigint PRIMARY KEY, v bigint)"
    ))
    .await
    .map_err(anyhow::Error::msg)
    .context("creating the table")?;
    let session = conn.session.clone();
    let mut write = session
        .prepare(format!(
            "INSERT INTO {KEYSPACE}.{FAULT_TABLE} (pk, v) VALUES (?, ?) USING TIMESTAMP ?"
        ))
        .await
        .context("preparing the write")?;
    let mut read = session
        .prepare(format!(
            "SELECT v FROM {KEYSPACE}.{FAULT_TABLE} WHERE pk = ?"
        ))
        .await
        .context("preparing the read")?;
    // Idempotent (a fixed value and timestamp), so that a retry policy may retry both.
    write.set_is_idempotent(true);
    read.set_is_idempotent(true);
    let value_base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(1);
    let shared = Arc::new(Shared {
        start: Instant::now() + Duration::from_millis(50),
        session,
        write,
        read,
        acks: AckLog::new(plan.keys),
        next_value: AtomicU64::new(1),
        value_base,
        records: Mutex::new(Vec::new()),
        unsent: Mutex::new(Vec::new()),
        in_flight: AtomicUsize::new(0),
        deadline: plan.deadline,
        client_timeout: plan.client_timeout,
        ok_now: AtomicU64::new(0),
        err_now: AtomicU64::new(0),
        stale_now: AtomicU64::new(0),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let scheduled = Arc::new(AtomicU64::new(0));
    let generator = tokio::spawn(generate(
        shared.clone(),
        plan.clone(),
        stop.clone(),
        scheduled.clone(),
    ));
    let retry_samples = Arc::new(Mutex::new(Vec::<(u64, u64)>::new()));
    let phase_name = Arc::new(Mutex::new(String::from(if plan.warm_up.is_zero() {
        "before"
    } else {
        "warm-up"
    })));
    let sampler = {
        let (shared, samples, stop) = (shared.clone(), retry_samples.clone(), stop.clone());
        let retries_of = conn_retries(conn);
        let (progress, phase_name) = (plan.progress, phase_name.clone());
        tokio::spawn(async move {
            let mut tick = 0u64;
            sleep_until(shared.start).await;
            loop {
                let at = shared.start + Duration::from_micros(tick * RECOVERY_STEP_US);
                sleep_until(at).await;
                samples
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((tick * RECOVERY_STEP_US, retries_of()));
                tick += 1;
                if progress && tick.is_multiple_of(10) {
                    let name = phase_name.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    crate::progress::line(format!(
                        "[{:>4}s] {:<16} ok {:>6}/s  errors {:>6}/s  stale {:>5}  in flight {:>6}",
                        tick / 10,
                        name,
                        shared.ok_now.swap(0, Ordering::Relaxed),
                        shared.err_now.swap(0, Ordering::Relaxed),
                        shared.stale_now.swap(0, Ordering::Relaxed),
                        shared.in_flight.load(Ordering::Relaxed)
                    ));
                }
                if stop.load(Ordering::Acquire) && shared.in_flight.load(Ordering::Acquire) == 0 {
                    break;
                }
            }
        })
    };
    let mut spans = Vec::new();
    let mut notes = Vec::new();
    let controlled = control(plan, node, &shared, &mut spans, &phase_name).await;
    stop.store(true, Ordering::Release);
    let _ = generator.await;
    // Requests in flight end by their client timeout at the latest.
    let drain_until = Instant::now() + plan.client_timeout + Duration::from_secs(2);
    while shared.in_flight.load(Ordering::Acquire) > 0 && Instant::now() < drain_until {
        sleep(Duration::from_millis(10)).await;
    }
    let _ = sampler.await;
    crate::progress::flush();
    if let Err(e) = &controlled {
        notes.push(format!("the fault sequence stopped early: {e:#}"));
    }
    let records = std::mem::take(&mut *shared.records.lock().unwrap_or_else(|e| e.into_inner()));
    let unsent = std::mem::take(&mut *shared.unsent.lock().unwrap_or_else(|e| e.into_inner()));
    let samples = std::mem::take(&mut *retry_samples.lock().unwrap_or_else(|e| e.into_inner()));
    let phases = analyse(&records, &samples, &spans, &unsent);
    let in_a_phase = |t: u64| spans.iter().any(|s| t >= s.start_us && t < s.end_us);
    let outside_phases = records
        .iter()
        .map(|d| d.intended_us)
        .chain(unsent.iter().copied())
        .filter(|t| !in_a_phase(*t))
        .count() as u64;
    let end_s = spans.last().map_or(0, |s| s.end_us.div_ceil(1_000_000)) as usize;
    let mut goodput_per_second = vec![0u64; end_s];
    for d in records.iter().filter(|d| d.outcome == FaultOutcome::Ok) {
        if let Some(g) = goodput_per_second.get_mut((d.intended_us / 1_000_000) as usize) {
            *g += 1;
        }
    }
    eprintln!("reading every written key back...");
    let mut finals = Vec::new();
    for cl in [Consistency::Quorum, Consistency::All] {
        finals.push(final_reads(&shared, cl).await);
    }
    if node.restarted() {
        notes.push(format!(
            "the node now runs as pid {} started by this run (output in {}); stop it with kill {}",
            node.pid(),
            node.log.display(),
            node.pid()
        ));
    }
    let targets = targets(&phases, &finals);
    Ok(FaultReport {
        settings,
        node: node.addr.to_string(),
        phases,
        spans,
        goodput_per_second,
        scheduled: scheduled.load(Ordering::Relaxed),
        outside_phases,
        finals,
        targets,
        node_pid_at_end: node.pid(),
        node_restarted: node.restarted(),
        notes,
    })
}

fn conn_retries(conn: &Connection) -> impl Fn() -> u64 + Send + 'static {
    let c = conn.retry_counter();
    move || c.load(Ordering::Relaxed)
}

/// The open-loop generator: one request per intended time, whatever the answers do.
async fn generate(
    shared: Arc<Shared>,
    plan: FaultPlan,
    stop: Arc<AtomicBool>,
    scheduled: Arc<AtomicU64>,
) {
    let gap_ns = 1e9 / plan.rate;
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut i = 0u64;
    while !stop.load(Ordering::Acquire) && i < MAX_RECORDS {
        let intended = shared.start + Duration::from_nanos((i as f64 * gap_ns) as u64);
        i += 1;
        if Instant::now() < intended {
            sleep_until(intended).await;
        } else if i.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
        scheduled.fetch_add(1, Ordering::Relaxed);
        let key = rng.random_range(0..plan.keys);
        let write = rng.random_bool(0.5);
        let counted = shared
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < plan.max_in_flight.max(1)).then_some(n + 1)
            })
            .is_ok();
        if counted {
            tokio::spawn(shared.clone().one(intended, key, write));
        } else {
            let t = shared.us_since_start(intended);
            shared
                .unsent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(t);
        }
    }
}

/// Applies the faults in turn and records the phases.
async fn control(
    plan: &FaultPlan,
    node: &mut FaultNode,
    shared: &Shared,
    spans: &mut Vec<PhaseSpan>,
    phase_name: &Mutex<String>,
) -> anyhow::Result<()> {
    let set_name = |n: &str| *phase_name.lock().unwrap_or_else(|e| e.into_inner()) = n.into();
    let now_us = || shared.us_since_start(Instant::now());
    let mut before_start = 0;
    if !plan.warm_up.is_zero() {
        set_name("warm-up");
        sleep_until(shared.start + plan.warm_up).await;
        before_start = now_us();
        spans.push(PhaseSpan {
            name: "warm-up".into(),
            kind: PhaseKind::WarmUp,
            start_us: 0,
            end_us: before_start,
        });
        set_name("before");
    }
    sleep(plan.phase).await;
    spans.push(PhaseSpan {
        name: "before".into(),
        kind: PhaseKind::Before,
        start_us: before_start,
        end_us: now_us(),
    });
    for &f in &plan.faults {
        let during_name = format!(
            "{}: {}",
            f.name(),
            if f == FaultKind::Stop {
                "stopped"
            } else {
                "down"
            }
        );
        set_name(&during_name);
        // Phases are contiguous: every request falls in exactly one until the last ends.
        let fault_at = spans.last().map_or(0, |s| s.end_us);
        let result: anyhow::Result<()> = async {
            match f {
                FaultKind::Kill => {
                    node.signal(libc::SIGKILL)?;
                    if !node.wait_gone(Duration::from_secs(10)).await {
                        bail!("pid {} still runs 10 s after SIGKILL", node.pid());
                    }
                    sleep(plan.hold).await;
                    node.start()?;
                    node.wait_serving(Duration::from_secs(120)).await
                }
                FaultKind::Stop => {
                    node.signal(libc::SIGSTOP)?;
                    sleep(plan.hold).await;
                    node.signal(libc::SIGCONT)
                }
                FaultKind::Restart => {
                    node.signal(libc::SIGTERM)?;
                    if !node.wait_gone(Duration::from_secs(60)).await {
                        node.signal(libc::SIGKILL)?;
                        node.wait_gone(Duration::from_secs(10)).await;
                    }
                    node.start()?;
                    node.wait_serving(Duration::from_secs(120)).await
                }
            }
        }
        .await;
        let returned_at = now_us();
        spans.push(PhaseSpan {
            name: during_name,
            kind: PhaseKind::During,
            start_us: fault_at,
            end_us: returned_at,
        });
        result?;
        let after_name = format!("{}: after", f.name());
        set_name(&after_name);
        sleep(plan.phase).await;
        spans.push(PhaseSpan {
            name: after_name,
            kind: PhaseKind::After,
            start_us: returned_at,
            end_us: now_us(),
        });
    }
    Ok(())
}

/// How long the final reads go on asking for keys that failed to read: a node restarted
/// by the last fault may still be starting, and a read at ALL needs it.
const FINAL_READ_RETRY_FOR: Duration = Duration::from_secs(15);

/// Reads every key with an acknowledged write at `cl`, 64 at a time, asking again (after a
/// second, for up to [`FINAL_READ_RETRY_FOR`]) for the keys whose read failed: a key is
/// unreadable only if it never read in that time.
async fn final_reads(shared: &Arc<Shared>, cl: Consistency) -> FinalCheck {
    let mut read = shared.read.clone();
    read.set_consistency(cl);
    let read = Arc::new(read);
    let mut pending = shared.acks.written();
    let mut out = Vec::with_capacity(pending.len());
    let give_up = Instant::now() + FINAL_READ_RETRY_FOR;
    loop {
        let round = read_keys(shared, &read, &pending).await;
        pending.clear();
        for r in round {
            if r.2.is_none() && Instant::now() < give_up {
                pending.push((r.0, r.1));
            } else {
                out.push(r);
            }
        }
        if pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    out.sort_unstable_by_key(|r| r.0);
    FinalCheck::of(&format!("{cl:?}").to_uppercase(), &out)
}

/// One read of each of `keys` with `read`, 64 at a time: (key, highest acknowledged, what
/// the read returned or None when it failed).
async fn read_keys(
    shared: &Arc<Shared>,
    read: &Arc<PreparedStatement>,
    keys: &[(u64, i64)],
) -> Vec<(u64, i64, Option<Option<i64>>)> {
    let mut out = Vec::with_capacity(keys.len());
    let mut set = JoinSet::new();
    for &(key, acked) in keys {
        while set.len() >= 64 {
            if let Some(Ok(r)) = set.join_next().await {
                out.push(r);
            }
        }
        let (session, read) = (shared.session.clone(), read.clone());
        let timeout = shared.client_timeout.max(Duration::from_secs(2));
        set.spawn(async move {
            let got =
                match tokio::time::timeout(timeout, session.execute_unpaged(&read, (key as i64,)))
                    .await
                {
                    Ok(Ok(res)) => read_value(res).ok(),
                    _ => None,
                };
            (key, acked, got)
        });
    }
    while let Some(r) = set.join_next().await {
        if let Ok(r) = r {
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(t_ms: u64, lat_ms: u64, write: bool, outcome: FaultOutcome, stale: bool) -> Done {
        Done {
            intended_us: t_ms * 1000,
            latency_us: lat_ms * 1000,
            write,
            outcome,
            stale,
        }
    }

    fn span(name: &str, kind: PhaseKind, a_ms: u64, b_ms: u64) -> PhaseSpan {
        PhaseSpan {
            name: name.into(),
            kind,
            start_us: a_ms * 1000,
            end_us: b_ms * 1000,
        }
    }

    #[test]
    fn stale_and_lost_are_judged_against_the_highest_acknowledged_value() {
        let acks = AckLog::new(4);
        assert_eq!(acks.floor(1), 0);
        acks.ack(1, 10);
        acks.ack(1, 7); // an older write acknowledged later does not lower the floor
        acks.ack(3, 5);
        acks.ack(99, 5); // outside the key space: ignored
        assert_eq!(acks.floor(1), 10);
        assert_eq!(acks.written(), vec![(1, 10), (3, 5)]);
        // A read sent before any acknowledgement may see nothing.
        assert!(!AckLog::is_stale(0, None));
        assert!(AckLog::is_stale(10, None));
        assert!(AckLog::is_stale(10, Some(7)));
        assert!(!AckLog::is_stale(10, Some(10)));
        // A newer, not yet acknowledged value is fine.
        assert!(!AckLog::is_stale(10, Some(12)));
        let c = FinalCheck::of(
            "QUORUM",
            &[
                (1, 10, Some(Some(10))),
                (2, 8, Some(Some(3))),
                (3, 5, Some(None)),
                (4, 6, None),
                (5, 6, Some(Some(9))),
            ],
        );
        assert_eq!((c.keys, c.lost, c.unreadable), (5, 2, 1));
        assert_eq!(c.examples, vec![(2, 8, 3), (3, 5, 0)]);
    }

    #[test]
    fn phases_count_by_intended_time_and_measure_goodput_retries_and_recovery() {
        let mut recs = Vec::new();
        // before: 0..2 s, 100 ok per second.
        for i in 0..200 {
            recs.push(done(i * 10, 1, i % 2 == 0, FaultOutcome::Ok, false));
        }
        // stopped: 2..3 s, 50 ok, 30 client timeouts, 20 unavailable, one stale read.
        for i in 0..100 {
            let o = match i % 10 {
                0..5 => FaultOutcome::Ok,
                5..8 => FaultOutcome::ClientTimeout,
                _ => FaultOutcome::Unavailable,
            };
            recs.push(done(2000 + i * 10, 100, false, o, i == 1));
        }
        // after: 3..6 s, 40/s for the first 1.5 s, then 100/s.
        for i in 0..60 {
            recs.push(done(3000 + i * 25, 1, true, FaultOutcome::Ok, false));
        }
        for i in 0..150 {
            recs.push(done(4500 + i * 10, 1, true, FaultOutcome::Ok, false));
        }
        recs.push(done(5990, 200, true, FaultOutcome::Late, false));
        let unsent = vec![2_500_000];
        let spans = vec![
            span("before", PhaseKind::Before, 0, 2000),
            span("stop: stopped", PhaseKind::During, 2000, 3000),
            span("stop: after", PhaseKind::After, 3000, 6000),
        ];
        let retries = vec![
            (0, 0),
            (1_000_000, 0),
            (2_000_000, 0),
            (2_500_000, 30),
            (3_000_000, 40),
            (6_000_000, 40),
        ];
        let p = analyse(&recs, &retries, &spans, &unsent);
        assert_eq!(p.len(), 3);
        assert_eq!(
            (p[0].offered, p[0].ok, p[0].goodput_per_s),
            (200, 200, 100.0)
        );
        assert_eq!(p[0].retries, 0);
        assert_eq!(p[0].time_to_recover_s, None);
        let s = &p[1];
        assert_eq!(
            (s.offered, s.ok, s.stale_reads, s.reads_ok),
            (101, 50, 1, 50)
        );
        let err = |n: &str| s.errors.iter().find(|(k, _)| k == n).map(|e| e.1);
        assert_eq!(err("client_timeout"), Some(30));
        assert_eq!(err("unavailable"), Some(20));
        assert_eq!(err("other"), Some(1), "the unsent request");
        assert_eq!(s.goodput_vs_before, Some(0.5));
        assert_eq!(s.retries, 40);
        assert!((s.retries_per_request - 40.0 / 101.0).abs() < 1e-9);
        assert!((s.p99_ms - 100.0).abs() < 1.0, "{}", s.p99_ms);
        let a = &p[2];
        assert_eq!((a.offered, a.ok, a.late), (211, 210, 1));
        // The first 1 s window with >= 95 successes starts at 4.5 s minus at most 0.1 s
        // of the slow part (4 successes at 40/s): 1.4 s or 1.5 s after the return.
        let r = a.time_to_recover_s.expect("recovered");
        assert!((1.35..=1.55).contains(&r), "recovered after {r}");
        let t = targets(&p, &[FinalCheck::of("ALL", &[(1, 3, Some(Some(3)))])]);
        let line = |w: &str| t.iter().find(|l| l.what.contains(w)).expect(w).clone();
        assert!(line("lost").pass);
        assert!(!line("older than").pass, "one stale read");
        assert!(!line("stop: stopped").pass, "50% < 60%");
        assert!(line("stop: after").pass, "1.5 s <= 5 s");
    }

    #[test]
    fn the_warm_up_is_in_no_comparison() {
        let mut recs = Vec::new();
        // warm-up 0..1 s at 10/s, before 1..2 s at 100/s, stopped 2..3 s at 80/s.
        for i in 0..10 {
            recs.push(done(i * 100, 1, true, FaultOutcome::Ok, false));
        }
        for i in 0..100 {
            recs.push(done(1000 + i * 10, 1, true, FaultOutcome::Ok, false));
        }
        for i in 0..80 {
            recs.push(done(2000 + i * 12, 1, true, FaultOutcome::Ok, false));
        }
        let spans = vec![
            span("warm-up", PhaseKind::WarmUp, 0, 1000),
            span("before", PhaseKind::Before, 1000, 2000),
            span("kill: down", PhaseKind::During, 2000, 3000),
        ];
        let p = analyse(&recs, &[], &spans, &[]);
        assert_eq!(p[0].goodput_vs_before, Some(0.1));
        assert_eq!(p[1].goodput_vs_before, Some(1.0));
        assert_eq!(p[2].goodput_vs_before, Some(0.8));
        let t = targets(&p, &[]);
        assert_eq!(t.len(), 2, "the stale line and the one fault: {t:?}");
        assert!(t[1].pass && t[1].value == "80%", "{t:?}");
    }

    #[test]
    fn recovery_is_none_when_goodput_never_returns_and_zero_when_it_never_dropped() {
        let times: Vec<u64> = (0..300).map(|i| i * 10_000).collect(); // 100/s for 3 s
        assert_eq!(
            time_to_recover(&times, 0, 3_000_000, 100.0, 0.95),
            Some(Duration::ZERO)
        );
        assert_eq!(time_to_recover(&times, 0, 3_000_000, 200.0, 0.95), None);
        // A window must fit in the phase.
        assert_eq!(time_to_recover(&times, 0, 900_000, 100.0, 0.95), None);
    }

    #[test]
    fn arg_values_come_from_either_spelling() {
        let argv: Vec<String> = [
            "sluice",
            "serve",
            "--listen",
            "127.0.0.2:9042",
            "--data-dir=/d",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            arg_value(&argv, "--listen").as_deref(),
            Some("127.0.0.2:9042")
        );
        assert_eq!(arg_value(&argv, "--data-dir").as_deref(), Some("/d"));
        assert_eq!(arg_value(&argv, "--seeds"), None);
    }

    #[test]
    fn driver_errors_map_onto_fault_outcomes() {
        use scylla::errors::WriteType;
        let db =
            |e| ExecutionError::LastAttemptError(RequestAttemptError::DbError(e, String::new()));
        assert_eq!(
            FaultOutcome::of_error(&db(DbError::Unavailable {
                consistency: Consistency::Quorum,
                required: 2,
                alive: 1
            })),
            FaultOutcome::Unavailable
        );
        assert_eq!(
            FaultOutcome::of_error(&db(DbError::WriteTimeout {
                consistency: Consistency::Quorum,
                received: 1,
                required: 2,
                write_type: WriteType::Simple
            })),
            FaultOutcome::ServerTimeout
        );
        assert_eq!(
            FaultOutcome::of_error(&db(DbError::Overloaded)),
            FaultOutcome::Overloaded
        );
        assert_eq!(
            FaultOutcome::of_error(&ExecutionError::EmptyPlan),
            FaultOutcome::Connection
        );
        assert_eq!(
            FaultOutcome::of_error(&ExecutionError::RequestTimeout(Duration::from_secs(1))),
            FaultOutcome::ClientTimeout
        );
        assert_eq!(
            FaultOutcome::of_error(&db(DbError::SyntaxError)),
            FaultOutcome::Other
        );
    }
}
