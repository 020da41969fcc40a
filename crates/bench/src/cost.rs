//! The client of `scripts/cost.sh`: instructions per request of each outcome on the real
//! `sluice serve` binary running under callgrind.
//!
//! It drives one or two servers with the stock `scylla` driver, many requests in flight on
//! one connection, and brackets each phase with `callgrind_control --zero` and `--dump` so that
//! connection set-up, schema changes and warm-up do not count. The instructions of a phase are
//! those of every server thread between the two. A phase whose requests are meant to be
//! turned away may still serve a few; those are charged at the served write's cost and the
//! rest is divided among the rejections.

use crate::driver::{classify_error, Connection, DriverOptions, RetryMode};
use crate::target::Reply;
use anyhow::{bail, Context};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::CqlDuration;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Keyspace of the cost phases.
const KEYSPACE: &str = "sluice_cost";
/// How long to wait for callgrind to write a dump after `--dump` returned.
const DUMP_WAIT: Duration = Duration::from_secs(60);
/// Pause between a phase's warm-up and its counting: one-off background work the warm-up
/// starts (the first accepted write to a table creates its storage keyspace on the table
/// keeper's thread) finishes before the counters are zeroed instead of landing in the phase.
const SETTLE: Duration = Duration::from_millis(500);
/// Goal of an `Overloaded` rejection, as a share of a served write (design target T2).
const OVERLOADED_GOAL: f64 = 0.02;
/// Goal of a rate-limited or expired rejection, as a share of a served write (T2).
const REJECTION_GOAL: f64 = 0.10;
/// Goal for a served write with logins and permissions checked: at most 2% more than without.
const AUTHENTICATED_GOAL: f64 = 1.02;

/// Arguments of `sluice-cost-phase`.
#[derive(Clone, Debug, clap::Parser)]
#[command(
    name = "sluice-cost-phase",
    about = "Instructions per request by outcome on `sluice serve` under callgrind (run by scripts/cost.sh)",
    long_about = "Drives `sluice serve` processes that run under `valgrind --tool=callgrind` with \
the scylla driver, --in-flight requests pipelined on one connection, and brackets each phase with \
`callgrind_control --zero` and `--dump`. Phases on --node: a served prepared INSERT of two ints, \
the same INSERT on a table with per_partition_rate_limit 1/s to one partition (rate-limited), and \
with USING TIMEOUT bound to 1 ns (expired). On --overload-node (a server started with batch \
durability and an admission queue and concurrency of 1): the same INSERT, nearly all turned away \
`Overloaded`. On --auth-node (a server started with --authenticator password and --authorizer \
cassandra): the served INSERT by a role that logged in and holds MODIFY through a GRANT. Prints \
instructions per request of each outcome, its ratio to the served write beside the goal, and the \
outcome counts; exits non-zero when a phase did not produce its outcome."
)]
pub struct CostArgs {
    /// CQL address of the server for the served, rate-limited and expired phases.
    #[arg(long)]
    pub node: String,
    /// Process id of that server's valgrind.
    #[arg(long)]
    pub pid: u32,
    /// The `--callgrind-out-file` that server was started with (dumps are numbered after it).
    #[arg(long)]
    pub out: PathBuf,
    /// CQL address of the server for the overloaded phase (omit to skip the phase).
    #[arg(long, requires_all = ["overload_pid", "overload_out"])]
    pub overload_node: Option<String>,
    /// Process id of that server's valgrind.
    #[arg(long)]
    pub overload_pid: Option<u32>,
    /// That server's `--callgrind-out-file`.
    #[arg(long)]
    pub overload_out: Option<PathBuf>,
    /// CQL address of a server with the password authenticator and the Cassandra authorizer,
    /// for the authenticated served phase (omit to skip the phase).
    #[arg(long, requires_all = ["auth_pid", "auth_out"])]
    pub auth_node: Option<String>,
    /// Process id of that server's valgrind.
    #[arg(long)]
    pub auth_pid: Option<u32>,
    /// That server's `--callgrind-out-file`.
    #[arg(long)]
    pub auth_out: Option<PathBuf>,
    /// Requests per phase.
    #[arg(long, default_value_t = 3000)]
    pub requests: usize,
    /// Requests in flight (pipelined on one connection).
    #[arg(long, default_value_t = 64)]
    pub in_flight: usize,
    /// Requests of each phase sent before counting starts (warm-up).
    #[arg(long, default_value_t = 300)]
    pub warm_up: usize,
}

/// The phases, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Served,
    RateLimited,
    Expired,
    Overloaded,
    ServedAuthenticated,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Served => "served write",
            Phase::RateLimited => "rate-limited",
            Phase::Expired => "expired",
            Phase::Overloaded => "overloaded",
            Phase::ServedAuthenticated => "served, auth",
        }
    }

    /// The reply a phase exists to produce.
    fn outcome(self) -> Reply {
        match self {
            Phase::Served | Phase::ServedAuthenticated => Reply::Ok,
            Phase::RateLimited => Reply::RateLimited,
            Phase::Expired => Reply::ServerTimeout,
            Phase::Overloaded => Reply::Overloaded,
        }
    }

    fn goal(self) -> Option<f64> {
        match self {
            Phase::Served => None,
            Phase::ServedAuthenticated => Some(AUTHENTICATED_GOAL),
            Phase::Overloaded => Some(OVERLOADED_GOAL),
            Phase::RateLimited | Phase::Expired => Some(REJECTION_GOAL),
        }
    }
}

/// Replies of one phase, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    ok: usize,
    rate_limited: usize,
    overloaded: usize,
    timeout: usize,
    other: usize,
}

impl Counts {
    fn add(&mut self, reply: Reply) {
        match reply {
            Reply::Ok => self.ok += 1,
            Reply::RateLimited => self.rate_limited += 1,
            Reply::Overloaded => self.overloaded += 1,
            Reply::ServerTimeout => self.timeout += 1,
            // The client giving up is no answer from the server: not the expired outcome.
            Reply::ClientTimeout | Reply::Other => self.other += 1,
        }
    }

    fn of(&self, reply: Reply) -> usize {
        match reply {
            Reply::Ok => self.ok,
            Reply::RateLimited => self.rate_limited,
            Reply::Overloaded => self.overloaded,
            Reply::ServerTimeout => self.timeout,
            Reply::ClientTimeout | Reply::Other => self.other,
        }
    }

    fn total(&self) -> usize {
        self.ok + self.rate_limited + self.overloaded + self.timeout + self.other
    }
}

/// One server under callgrind.
struct Server {
    conn: Connection,
    pid: u32,
    out: PathBuf,
}

/// The measured result of one phase.
struct Measured {
    phase: Phase,
    counts: Counts,
    instructions: u64,
    seconds: f64,
}

/// Runs every phase and prints the table; Err when a phase did not produce its outcome.
pub async fn run_cost(args: CostArgs) -> anyhow::Result<()> {
    if args.requests == 0 || args.in_flight == 0 {
        bail!("--requests and --in-flight must be at least 1");
    }
    let main = Server::open(&args.node, args.pid, &args.out).await?;
    main.setup().await?;
    let insert = main
        .prepare(&format!("INSERT INTO {KEYSPACE}.w (k, v) VALUES (?, ?)"))
        .await?;
    let limited = main
        .prepare(&format!(
            "INSERT INTO {KEYSPACE}.limited (k, v) VALUES (?, ?)"
        ))
        .await?;
    let timed = main
        .prepare(&format!(
            "INSERT INTO {KEYSPACE}.w (k, v) VALUES (?, ?) USING TIMEOUT ?"
        ))
        .await?;
    let mut results = Vec::new();
    let mut next_key = 0i32;
    for (phase, statement) in [
        (Phase::Served, &insert),
        (Phase::RateLimited, &limited),
        (Phase::Expired, &timed),
    ] {
        results.push(main.measure(phase, statement, &args, &mut next_key).await?);
    }
    if let (Some(node), Some(pid), Some(out)) =
        (&args.overload_node, args.overload_pid, &args.overload_out)
    {
        let other = Server::open(node, pid, out).await?;
        other.setup().await?;
        let insert = other
            .prepare(&format!("INSERT INTO {KEYSPACE}.w (k, v) VALUES (?, ?)"))
            .await?;
        results.push(
            other
                .measure(Phase::Overloaded, &insert, &args, &mut next_key)
                .await?,
        );
    }
    if let (Some(node), Some(pid), Some(out)) = (&args.auth_node, args.auth_pid, &args.auth_out) {
        results.push(measure_authenticated(node, pid, out, &args, &mut next_key).await?);
    }
    report(&results)
}

/// The role the authenticated phase logs in as, and its password.
const AUTH_ROLE: (&str, &str) = ("cost_writer", "cost_writer");

/// The served write on a node that checks logins and permissions: the default superuser
/// creates the schema and a role holding MODIFY through a GRANT (a superuser would skip the
/// permission decision), and the phase runs as that role.
async fn measure_authenticated(
    node: &str,
    pid: u32,
    out: &Path,
    args: &CostArgs,
    next_key: &mut i32,
) -> anyhow::Result<Measured> {
    let admin = Server::open_as(node, pid, out, Some(("cassandra", "cassandra"))).await?;
    admin.setup().await?;
    let (role, password) = AUTH_ROLE;
    for ddl in [
        format!("CREATE ROLE IF NOT EXISTS {role} WITH PASSWORD = '{password}' AND LOGIN = true"),
        format!("GRANT MODIFY ON TABLE {KEYSPACE}.w TO {role}"),
    ] {
        admin
            .conn
            .ddl(&ddl)
            .await
            .map_err(anyhow::Error::msg)
            .with_context(|| ddl.clone())?;
    }
    let writer = Server::open_as(node, pid, out, Some((role, password))).await?;
    let insert = writer
        .prepare(&format!("INSERT INTO {KEYSPACE}.w (k, v) VALUES (?, ?)"))
        .await?;
    writer
        .measure(Phase::ServedAuthenticated, &insert, args, next_key)
        .await
}

impl Server {
    async fn open(node: &str, pid: u32, out: &Path) -> anyhow::Result<Self> {
        Self::open_as(node, pid, out, None).await
    }

    /// Connects, logging in as `credentials` when given.
    async fn open_as(
        node: &str,
        pid: u32,
        out: &Path,
        credentials: Option<(&str, &str)>,
    ) -> anyhow::Result<Self> {
        let conn = Connection::open(&DriverOptions {
            nodes: vec![node.to_owned()],
            connections: 1,
            client_timeout: Duration::from_secs(60),
            retry: RetryMode::None,
            retries: 0,
            credentials: credentials.map(|(u, p)| (u.to_owned(), p.to_owned())),
            ..DriverOptions::new(Vec::new(), 1, Duration::from_secs(60))
        })
        .await?;
        Ok(Self {
            conn,
            pid,
            out: out.to_owned(),
        })
    }

    async fn setup(&self) -> anyhow::Result<()> {
        for ddl in [
            format!(
                "CREATE KEYSPACE IF NOT EXISTS {KEYSPACE} WITH replication = \
                 {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
            ),
            format!("CREATE TABLE IF NOT EXISTS {KEYSPACE}.w (k int PRIMARY KEY, v int)"),
            format!(
                "CREATE TABLE IF NOT EXISTS {KEYSPACE}.limited (k int PRIMARY KEY, v int) \
                 WITH per_partition_rate_limit = {{'max_writes_per_second': 1}}"
            ),
        ] {
            self.conn
                .ddl(&ddl)
                .await
                .map_err(anyhow::Error::msg)
                .with_context(|| ddl.clone())?;
        }
        Ok(())
    }

    async fn prepare(&self, cql: &str) -> anyhow::Result<PreparedStatement> {
        self.conn
            .session
            .prepare(cql)
            .await
            .with_context(|| format!("preparing {cql}"))
    }

    /// Warms `phase` up, then runs it between a zero and a dump of the server's counters.
    async fn measure(
        &self,
        phase: Phase,
        statement: &PreparedStatement,
        args: &CostArgs,
        next_key: &mut i32,
    ) -> anyhow::Result<Measured> {
        drive(
            &self.conn,
            phase,
            statement,
            args.warm_up,
            args.in_flight,
            next_key,
        )
        .await;
        tokio::time::sleep(SETTLE).await;
        callgrind_control(&["--zero"], self.pid)?;
        let before = dumps(&self.out)?;
        let started = Instant::now();
        let counts = drive(
            &self.conn,
            phase,
            statement,
            args.requests,
            args.in_flight,
            next_key,
        )
        .await;
        let seconds = started.elapsed().as_secs_f64();
        callgrind_control(&["--dump"], self.pid)?;
        let instructions = wait_for_new_dump(&self.out, &before)?;
        Ok(Measured {
            phase,
            counts,
            instructions,
            seconds,
        })
    }
}

/// Sends `n` requests of `phase`, `in_flight` at a time, and counts the replies. Keys come
/// from `next_key`, so that served writes go to new partitions; the rate-limited phase writes
/// one partition.
async fn drive(
    conn: &Connection,
    phase: Phase,
    statement: &PreparedStatement,
    n: usize,
    in_flight: usize,
    next_key: &mut i32,
) -> Counts {
    let first = *next_key;
    *next_key = next_key.wrapping_add(i32::try_from(n).unwrap_or(i32::MAX));
    let issued = Arc::new(AtomicUsize::new(0));
    let counts = Arc::new(Mutex::new(Counts::default()));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..in_flight.min(n.max(1)) {
        let session = conn.session.clone();
        let statement = statement.clone();
        let issued = issued.clone();
        let counts = counts.clone();
        workers.spawn(async move {
            let mut mine = Counts::default();
            loop {
                let i = issued.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let key = first.wrapping_add(i32::try_from(i).unwrap_or(0));
                let result = match phase {
                    Phase::RateLimited => session.execute_unpaged(&statement, (0i32, key)).await,
                    Phase::Expired => {
                        let timeout = CqlDuration {
                            months: 0,
                            days: 0,
                            nanoseconds: 1,
                        };
                        session
                            .execute_unpaged(&statement, (key, key, timeout))
                            .await
                    }
                    Phase::Served | Phase::Overloaded | Phase::ServedAuthenticated => {
                        session.execute_unpaged(&statement, (key, key)).await
                    }
                };
                mine.add(match result {
                    Ok(_) => Reply::Ok,
                    Err(e) => classify_error(&e),
                });
            }
            if let Ok(mut all) = counts.lock() {
                all.ok += mine.ok;
                all.rate_limited += mine.rate_limited;
                all.overloaded += mine.overloaded;
                all.timeout += mine.timeout;
                all.other += mine.other;
            }
        });
    }
    while workers.join_next().await.is_some() {}
    let total = counts.lock().map(|c| *c).unwrap_or_default();
    total
}

/// Runs `callgrind_control ARGS PID`, showing its output only when it fails.
fn callgrind_control(args: &[&str], pid: u32) -> anyhow::Result<()> {
    let out = Command::new("callgrind_control")
        .args(args)
        .arg(pid.to_string())
        .output()
        .context("running callgrind_control")?;
    if !out.status.success() {
        bail!(
            "callgrind_control {} {pid} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The dump files callgrind has written for `out` (named `out.N`).
fn dumps(out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let dir = out.parent().unwrap_or(Path::new("."));
    let stem = out
        .file_name()
        .and_then(|s| s.to_str())
        .context("callgrind output file name")?;
    let prefix = format!("{stem}.");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(|s| s.to_str())
            .is_some_and(|n| n.starts_with(&prefix))
        {
            found.push(path);
        }
    }
    Ok(found)
}

/// Waits until a dump not in `before` is complete and returns its instruction total.
fn wait_for_new_dump(out: &Path, before: &[PathBuf]) -> anyhow::Result<u64> {
    let deadline = Instant::now() + DUMP_WAIT;
    loop {
        for path in dumps(out)? {
            if before.contains(&path) {
                continue;
            }
            // The totals line is the last one written: a file without it is still being written.
            if let Some(total) = std::fs::read_to_string(&path)
                .ok()
                .and_then(|text| dump_total(&text))
            {
                return Ok(total);
            }
        }
        if Instant::now() > deadline {
            bail!(
                "callgrind wrote no dump for {} in {DUMP_WAIT:?}",
                out.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The instruction total of a callgrind dump: its `totals:` (or older `summary:`) line.
fn dump_total(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("totals:")
                .or_else(|| l.strip_prefix("summary:"))
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// Instructions per turned-away request: the phase's total less the few it served (at the
/// served write's cost), over the replies of the phase's own kind.
fn per_outcome(m: &Measured, served_cost: f64) -> Option<f64> {
    let wanted = m.counts.of(m.phase.outcome());
    if wanted == 0 {
        return None;
    }
    let served = if matches!(m.phase, Phase::Served | Phase::ServedAuthenticated) {
        0.0
    } else {
        m.counts.ok as f64 * served_cost
    };
    Some((m.instructions as f64 - served).max(0.0) / wanted as f64)
}

/// Prints the table; Err when a phase did not produce its outcome for most of its requests.
fn report(results: &[Measured]) -> anyhow::Result<()> {
    let served_cost = results
        .iter()
        .find(|m| m.phase == Phase::Served)
        .and_then(|m| per_outcome(m, 0.0))
        .context("the served phase served nothing")?;
    println!(
        "{:<14} {:>12} {:>8} {:>6}   {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7}",
        "outcome",
        "insns/req",
        "ratio",
        "goal",
        "sent",
        "ok",
        "rlimit",
        "overld",
        "timeout",
        "other",
        "secs"
    );
    let mut failed = Vec::new();
    for m in results {
        let per = per_outcome(m, served_cost);
        let ratio = per.map(|p| p / served_cost);
        let c = m.counts;
        println!(
            "{:<14} {:>12} {:>8} {:>6}   {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>7.1}",
            m.phase.name(),
            per.map_or("-".to_owned(), |p| format!("{p:.0}")),
            ratio.map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0)),
            m.phase
                .goal()
                .map_or("".to_owned(), |g| format!("<={:.0}%", g * 100.0)),
            c.total(),
            c.ok,
            c.rate_limited,
            c.overloaded,
            c.timeout,
            c.other,
            m.seconds,
        );
        // Most replies must be of the phase's kind, or the figure is not the outcome's cost.
        if c.of(m.phase.outcome()) * 2 < c.total() {
            failed.push(m.phase.name());
        }
    }
    if !failed.is_empty() {
        bail!(
            "phases that did not produce their outcome for most requests: {}",
            failed.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dump_totals_are_read_from_either_spelling() {
        let text =
            "version: 1\ncreator: callgrind-3.22.0\nevents: Ir\n\nfn=main\n1 5\n\ntotals: 123456\n";
        assert_eq!(dump_total(text), Some(123_456));
        assert_eq!(dump_total("events: Ir\nsummary: 77\n"), Some(77));
        assert_eq!(dump_total("events: Ir\nfn=main\n1 5\n"), None);
    }

    #[test]
    fn served_replies_of_a_rejection_phase_are_charged_at_the_served_cost() {
        let m = Measured {
            phase: Phase::RateLimited,
            counts: Counts {
                ok: 10,
                rate_limited: 90,
                ..Counts::default()
            },
            instructions: 10 * 1_000 + 90 * 100,
            seconds: 1.0,
        };
        assert_eq!(per_outcome(&m, 1_000.0), Some(100.0));
        let none = Measured {
            counts: Counts {
                ok: 100,
                ..Counts::default()
            },
            ..m
        };
        assert_eq!(per_outcome(&none, 1_000.0), None);
        assert!(report(&[
            Measured {
                phase: Phase::Served,
                counts: Counts {
                    ok: 100,
                    ..Counts::default()
                },
                instructions: 100_000,
                seconds: 1.0,
            },
            none
        ])
        .is_err());
    }
}
