//! `sluice bench ravendb | gsuneido | hot-rows`: issue 27's transaction benchmarks.
//!
//! Closed-loop clients run *logical* transactions, each retried until it commits or its
//! deadline (`--deadline`) passes; each attempt's client timeout is what is left of it.
//! Every step prints goodput (logical transactions committed within their deadline per
//! second), what ended the failed attempts (server timeouts, client timeouts, overload,
//! lost LWT conditions, other errors), retries per logical transaction and the p99 of the
//! committed ones. `--txn-form accord` sends Sluice's `BEGIN TRANSACTION` (Accord's
//! grammar); `--txn-form lwt` sends the single-partition `IF` form that Cassandra 5.0 also
//! runs. With `--against` the same steps run against a second endpoint (another Sluice
//! with a benchmark switch, or Cassandra) and the ratios are printed.

use crate::driver::Connection;
use crate::txn_sweep::{
    accounts_ddl, accounts_sum, create_accounts, OutstandingSampler, KEYSPACE, TRANSACTION,
};
use anyhow::{bail, Context};
use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::{CqlValue, Row};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which transaction form the clients send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TxnForm {
    /// Multi-partition `BEGIN TRANSACTION ... COMMIT TRANSACTION` (Sluice, Cassandra 6).
    Accord,
    /// Single-partition LWT (`UPDATE ... IF`), as Cassandra 5.0 has.
    Lwt,
}

/// One endpoint of a run.
#[derive(Clone, Debug)]
pub struct TxnEndpoint {
    /// Name in the output.
    pub label: String,
    /// CQL address (host:port).
    pub node: String,
    /// Sluice's metrics address (host:port), if any.
    pub metrics: Option<String>,
}

/// What the three scenarios share.
#[derive(Clone, Debug)]
pub struct TxnOptions {
    /// The endpoints, measured in turn.
    pub endpoints: Vec<TxnEndpoint>,
    /// The transaction form.
    pub form: TxnForm,
    /// Driver connections per endpoint.
    pub connections: usize,
    /// Measured time per step.
    pub step: Duration,
    /// Deadline of a logical transaction, from its first attempt.
    pub deadline: Duration,
    /// Client counts (gsuneido, hot-rows' search; ravendb uses the first).
    pub clients: Vec<usize>,
    /// Keys the transactions pick from.
    pub keys: i32,
    /// Smallest and largest value of ravendb, bytes.
    pub value_bytes: (usize, usize),
    /// hot-rows: the load offered after the search, as a multiple of the best concurrency.
    pub hot_multiple: usize,
    /// ravendb: rounds over the endpoints.
    pub rounds: usize,
    /// Seed of the clients' key choices.
    pub seed: u64,
}

/// Keyspace of the large-value tables.
const BLOB_KEYSPACE: &str = "sluice_txn_bench";

/// The ravendb transaction: two small reads returned, two large writes in two partitions.
const RAVENDB_TRANSACTION: &str = "BEGIN TRANSACTION
  LET a = (SELECT ver FROM sluice_txn_bench.blobs WHERE k = ?);
  LET b = (SELECT ver FROM sluice_txn_bench.blobs WHERE k = ?);
  SELECT a.ver, b.ver;
  UPDATE sluice_txn_bench.blobs SET ver = ?, body = ? WHERE k = ?;
  UPDATE sluice_txn_bench.blobs SET ver = ?, body = ? WHERE k = ?;
COMMIT TRANSACTION";

/// What one step measured.
#[derive(Default, Clone)]
struct Tally {
    /// Logical transactions started in the step.
    logical: u64,
    /// Committed within their deadline.
    committed: u64,
    /// Committed after it.
    late: u64,
    /// Not committed by their deadline.
    gave_up: u64,
    /// Requests sent (retries included; LWT reads not counted).
    attempts: u64,
    /// Requests the ended logical transactions needed with no retry.
    needed: u64,
    /// Write_timeout / Read_timeout answers.
    timeouts: u64,
    /// No answer within the attempt's client timeout.
    client_timeouts: u64,
    /// Overloaded answers.
    overloaded: u64,
    /// LWT conditions that did not hold (a concurrent update won).
    conflicts: u64,
    /// Any other error.
    other: u64,
    /// Net amount the committed LWT increments added (lwt form).
    added: i64,
    first_error: Option<String>,
    /// Latency of each committed logical transaction, µs.
    micros: Vec<u64>,
}

impl Tally {
    fn absorb(&mut self, o: Tally) {
        self.logical += o.logical;
        self.committed += o.committed;
        self.late += o.late;
        self.gave_up += o.gave_up;
        self.attempts += o.attempts;
        self.needed += o.needed;
        self.timeouts += o.timeouts;
        self.client_timeouts += o.client_timeouts;
        self.overloaded += o.overloaded;
        self.conflicts += o.conflicts;
        self.other += o.other;
        self.added += o.added;
        self.micros.extend(o.micros);
        if self.first_error.is_none() {
            self.first_error = o.first_error;
        }
    }

    fn goodput(&self, step: Duration) -> f64 {
        self.committed as f64 / step.as_secs_f64()
    }

    fn p99_ms(&mut self) -> f64 {
        self.micros.sort_unstable();
        match self.micros.len() {
            0 => 0.0,
            n => self.micros[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1] as f64 / 1000.0,
        }
    }

    /// Retries per logical transaction that ended in the step.
    fn retries(&self) -> f64 {
        let ended = self.committed + self.late + self.gave_up;
        if ended == 0 {
            return 0.0;
        }
        self.attempts.saturating_sub(self.needed) as f64 / ended as f64
    }

    /// Notes a failed attempt.
    fn failed(&mut self, e: &ExecutionError) {
        match e {
            ExecutionError::RequestTimeout(_) => self.client_timeouts += 1,
            ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, _)) => match db {
                DbError::WriteTimeout { .. } | DbError::ReadTimeout { .. } => self.timeouts += 1,
                DbError::Overloaded => self.overloaded += 1,
                _ => self.other += 1,
            },
            _ => self.other += 1,
        }
        if self.first_error.is_none() {
            self.first_error = Some(e.to_string());
        }
    }

    /// Notes how a logical transaction begun at `start`, which needs `requests` requests
    /// when nothing is retried, ended.
    fn ended(&mut self, start: Instant, deadline: Duration, committed: bool, requests: u64) {
        self.needed += requests;
        let took = start.elapsed();
        if !committed {
            self.gave_up += 1;
        } else if took <= deadline {
            self.committed += 1;
            self.micros.push(took.as_micros() as u64);
        } else {
            self.late += 1;
        }
    }
}

/// The server-side transaction metrics of a Sluice endpoint.
#[derive(Default, Clone, Copy)]
struct ServerTxn {
    aborts_deadline: f64,
    aborts_over_limit: f64,
    aborts_error: f64,
    lock_wait_p99: f64,
    critical_p50: f64,
    critical_p99: f64,
    critical_count: f64,
    limit: f64,
}

impl ServerTxn {
    fn read(addr: &str) -> Option<ServerTxn> {
        let text = metrics_text(addr)?;
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Some(ServerTxn {
            aborts_deadline: value("sluice_txn_aborts_total{reason=\"deadline\"}"),
            aborts_over_limit: value("sluice_txn_aborts_total{reason=\"over_limit\"}"),
            aborts_error: value("sluice_txn_aborts_total{reason=\"error\"}"),
            lock_wait_p99: value("sluice_txn_lock_wait_seconds{quantile=\"0.99\"}"),
            critical_p50: value("sluice_txn_critical_section_seconds{quantile=\"0.5\"}"),
            critical_p99: value("sluice_txn_critical_section_seconds{quantile=\"0.99\"}"),
            critical_count: value("sluice_txn_critical_section_seconds_count"),
            limit: value("sluice_txn_limit"),
        })
    }
}

/// The body of `GET /metrics` at `addr` (HTTP/1.0, one request).
fn metrics_text(addr: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// A small deterministic generator per client (the keys and amounts it picks).
struct Pick(u64);

impl Pick {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 17
    }
}

/// `st` with a client timeout of what is left until `until` (at least 1 ms).
fn with_timeout(st: &PreparedStatement, until: Instant) -> PreparedStatement {
    let mut st = st.clone();
    let left = until.saturating_duration_since(Instant::now());
    st.set_request_timeout(Some(left.max(Duration::from_millis(1))));
    st
}

/// The statements of the read-modify-write workload (gsuneido, hot-rows).
struct RmwStatements {
    /// The Accord transfer (none in the lwt form: Cassandra 5.0 cannot prepare it).
    transfer: Option<PreparedStatement>,
    read: PreparedStatement,
    cas: PreparedStatement,
}

impl RmwStatements {
    async fn prepare(session: &Session, form: TxnForm) -> anyhow::Result<Self> {
        let transfer = match form {
            TxnForm::Accord => Some(session.prepare(TRANSACTION).await?),
            TxnForm::Lwt => None,
        };
        Ok(RmwStatements {
            transfer,
            read: session
                .prepare(format!("SELECT n FROM {KEYSPACE}.acct WHERE k = ?"))
                .await?,
            cas: session
                .prepare(format!(
                    "UPDATE {KEYSPACE}.acct SET n = ? WHERE k = ? IF n = ?"
                ))
                .await?,
        })
    }
}

/// The value of column `n` in an LWT answer that did not apply (Cassandra returns it).
fn current_n(
    result: scylla::response::query_result::QueryResult,
) -> Result<(bool, Option<i64>), String> {
    let rows = result.into_rows_result().map_err(|e| e.to_string())?;
    let at = rows.column_specs().iter().position(|c| c.name() == "n");
    let row = rows
        .maybe_first_row::<Row>()
        .map_err(|e| e.to_string())?
        .ok_or("an LWT answered no row")?;
    let applied = matches!(row.columns.first(), Some(Some(CqlValue::Boolean(true))));
    let n = at.and_then(|i| match row.columns.get(i) {
        Some(Some(CqlValue::BigInt(n))) => Some(*n),
        _ => None,
    });
    Ok((applied, n))
}

/// One client of the read-modify-write workload until `end`: Accord transfers between two
/// accounts, or LWT compare-and-set increments of one.
async fn rmw_client(
    session: Arc<Session>,
    st: Arc<RmwStatements>,
    form: TxnForm,
    keys: i32,
    seed: u64,
    deadline: Duration,
    end: Instant,
) -> Tally {
    let mut t = Tally::default();
    let mut pick = Pick(seed);
    // The last value this client saw of each account (lwt form).
    let mut known: Vec<Option<i64>> = vec![None; keys as usize];
    while Instant::now() < end {
        let a = (pick.next() % keys as u64) as i32;
        let b = (a + 1 + (pick.next() % (keys as u64 - 1)) as i32) % keys;
        let d = (pick.next() % 100) as i64 + 1;
        let start = Instant::now();
        let until = start + deadline;
        t.logical += 1;
        let mut committed = false;
        while !committed && Instant::now() < until {
            match form {
                TxnForm::Accord => {
                    let Some(transfer) = &st.transfer else {
                        break;
                    };
                    t.attempts += 1;
                    let q = with_timeout(transfer, until);
                    match session.execute_unpaged(&q, (a, b, d, a, d, b)).await {
                        Ok(_) => committed = true,
                        Err(e) => t.failed(&e),
                    }
                }
                TxnForm::Lwt => {
                    let slot = &mut known[a as usize];
                    let current = match *slot {
                        Some(n) => n,
                        None => {
                            let q = with_timeout(&st.read, until);
                            let read = session.execute_unpaged(&q, (a,)).await;
                            match read.map_err(|e| {
                                t.failed(&e);
                            }) {
                                Ok(r) => match r
                                    .into_rows_result()
                                    .ok()
                                    .and_then(|r| r.maybe_first_row::<(i64,)>().ok().flatten())
                                {
                                    Some((n,)) => n,
                                    None => {
                                        t.other += 1;
                                        continue;
                                    }
                                },
                                Err(()) => continue,
                            }
                        }
                    };
                    t.attempts += 1;
                    let q = with_timeout(&st.cas, until);
                    match session
                        .execute_unpaged(&q, (current + d, a, current))
                        .await
                        .map_err(|e| {
                            t.failed(&e);
                        })
                        .and_then(|r| {
                            current_n(r).map_err(|e| {
                                t.other += 1;
                                if t.first_error.is_none() {
                                    t.first_error = Some(e);
                                }
                            })
                        }) {
                        Ok((true, _)) => {
                            *slot = Some(current + d);
                            t.added += d;
                            committed = true;
                        }
                        Ok((false, now)) => {
                            t.conflicts += 1;
                            *slot = now;
                        }
                        // The outcome is unknown: read again before the next attempt.
                        Err(()) => *slot = None,
                    }
                }
            }
        }
        t.ended(start, deadline, committed, 1);
    }
    t
}

/// Runs `clients` read-modify-write clients for one step.
async fn rmw_step(
    session: &Arc<Session>,
    st: &Arc<RmwStatements>,
    o: &TxnOptions,
    clients: usize,
) -> anyhow::Result<Tally> {
    let end = Instant::now() + o.step;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        tasks.spawn(rmw_client(
            session.clone(),
            st.clone(),
            o.form,
            o.keys,
            o.seed ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            o.deadline,
            end,
        ));
    }
    let mut total = Tally::default();
    while let Some(done) = tasks.join_next().await {
        total.absorb(done.context("a benchmark client panicked")?);
    }
    Ok(total)
}

/// The header of the per-step lines.
const HEADER: &str = "clients | goodput tx/s | committed | late | gave up | timeouts | client timeouts | overloaded | conflicts | other | retries/txn | p99 ms | max outstanding | server aborts deadline/over_limit/error | limit";

/// Prints one step.
fn print_step(
    label: &str,
    clients: usize,
    t: &mut Tally,
    step: Duration,
    outstanding: Option<u64>,
    server: Option<(ServerTxn, ServerTxn)>,
) {
    let p99 = t.p99_ms();
    let (aborts, limit) = match server {
        Some((before, after)) => (
            format!(
                "{:.0}/{:.0}/{:.0}",
                after.aborts_deadline - before.aborts_deadline,
                after.aborts_over_limit - before.aborts_over_limit,
                after.aborts_error - before.aborts_error
            ),
            format!("{:.0}", after.limit),
        ),
        None => ("-".into(), "-".into()),
    };
    println!(
        "{label}: {clients} | {g:.0} | {c} | {late} | {gave} | {to} | {cto} | {ov} | {cf} | {other} | {r:.2} | {p99:.2} | {out} | {aborts} | {limit}",
        g = t.goodput(step),
        c = t.committed,
        late = t.late,
        gave = t.gave_up,
        to = t.timeouts,
        cto = t.client_timeouts,
        ov = t.overloaded,
        cf = t.conflicts,
        other = t.other,
        r = t.retries(),
        out = outstanding.map_or("-".into(), |m| m.to_string()),
    );
    if let Some(e) = &t.first_error {
        println!("  first error: {e}");
    }
}

/// One read-modify-write step with the server's gauges around it.
async fn measured_rmw_step(
    ep: &TxnEndpoint,
    session: &Arc<Session>,
    st: &Arc<RmwStatements>,
    o: &TxnOptions,
    clients: usize,
) -> anyhow::Result<Tally> {
    let before = ep.metrics.as_deref().and_then(ServerTxn::read);
    let sampler = ep.metrics.clone().map(OutstandingSampler::start);
    let mut t = rmw_step(session, st, o, clients).await?;
    let outstanding = sampler.map(OutstandingSampler::stop);
    let after = ep.metrics.as_deref().and_then(ServerTxn::read);
    print_step(
        &ep.label,
        clients,
        &mut t,
        o.step,
        outstanding,
        before.zip(after),
    );
    Ok(t)
}

/// Opens an endpoint with the accounts at 0.
async fn open_accounts(
    ep: &TxnEndpoint,
    o: &TxnOptions,
) -> anyhow::Result<(Arc<Session>, Arc<RmwStatements>)> {
    let conn = Connection::open_one_node(&ep.node, o.connections, &accounts_ddl()).await?;
    create_accounts(&conn.session, o.keys).await?;
    let st = Arc::new(RmwStatements::prepare(&conn.session, o.form).await?);
    Ok((conn.session, st))
}

/// Checks the accounts after a run: transfers keep the sum at 0; LWT increments add up
/// to what was acknowledged unless some outcome was unknown (timeouts).
async fn check_accounts(
    ep: &TxnEndpoint,
    session: &Session,
    o: &TxnOptions,
    added: i64,
    unknown: u64,
) -> anyhow::Result<()> {
    let sum = accounts_sum(session, o.keys).await?;
    match o.form {
        TxnForm::Accord => {
            println!("{}: sum of all accounts {sum} (must be 0)", ep.label);
            if sum != 0 {
                bail!("{}: the accounts' sum is {sum}, not 0", ep.label);
            }
        }
        TxnForm::Lwt => {
            println!(
                "{}: sum of all accounts {sum}, acknowledged increments {added}, attempts with an unknown outcome {unknown}",
                ep.label
            );
            if unknown == 0 && sum != added {
                bail!(
                    "{}: {sum} in the accounts but {added} acknowledged",
                    ep.label
                );
            }
        }
    }
    Ok(())
}

/// gSuneido's experiment: 1 to 30 clients of short read-modify-write transactions on
/// overlapping keys, per endpoint (e.g. the adaptive limit on, then off).
pub async fn run_gsuneido(o: &TxnOptions) -> anyhow::Result<()> {
    println!(
        "gsuneido: form {:?}, {} keys, {} s per step, deadline {} ms",
        o.form,
        o.keys,
        o.step.as_secs_f64(),
        o.deadline.as_millis()
    );
    let mut peaks = Vec::new();
    for ep in &o.endpoints {
        let (session, st) = open_accounts(ep, o).await?;
        println!("{}: {HEADER}", ep.label);
        let mut best = 0.0f64;
        let mut last = 0.0;
        let (mut added, mut unknown) = (0, 0);
        for &clients in &o.clients {
            let t = measured_rmw_step(ep, &session, &st, o, clients).await?;
            best = best.max(t.goodput(o.step));
            last = t.goodput(o.step);
            added += t.added;
            unknown += t.timeouts + t.client_timeouts + t.other;
        }
        println!(
            "{}: peak {best:.0} tx/s; the last step keeps {:.0}% of it",
            ep.label,
            pct(last, best)
        );
        peaks.push((ep.label.clone(), best, last));
        check_accounts(ep, &session, o, added, unknown).await?;
    }
    print_ratios("gsuneido peak", &peaks);
    Ok(())
}

/// Hot rows: the best concurrency on a few hot keys, then `hot_multiple` times it.
pub async fn run_hot_rows(o: &TxnOptions) -> anyhow::Result<()> {
    println!(
        "hot-rows: form {:?}, {} hot keys, {} s per step, deadline {} ms, then {}x the best concurrency",
        o.form,
        o.keys,
        o.step.as_secs_f64(),
        o.deadline.as_millis(),
        o.hot_multiple
    );
    let mut peaks = Vec::new();
    for ep in &o.endpoints {
        let (session, st) = open_accounts(ep, o).await?;
        println!("{}: {HEADER}", ep.label);
        let (mut best, mut best_clients) = (0.0f64, 1);
        let (mut added, mut unknown) = (0, 0);
        for &clients in &o.clients {
            let t = measured_rmw_step(ep, &session, &st, o, clients).await?;
            if t.goodput(o.step) > best {
                best = t.goodput(o.step);
                best_clients = clients;
            }
            added += t.added;
            unknown += t.timeouts + t.client_timeouts + t.other;
        }
        let offered = best_clients * o.hot_multiple;
        let t = measured_rmw_step(ep, &session, &st, o, offered).await?;
        added += t.added;
        unknown += t.timeouts + t.client_timeouts + t.other;
        let kept = pct(t.goodput(o.step), best);
        println!(
            "{}: best {best:.0} tx/s at {best_clients} clients; at {offered} clients {:.0} tx/s = {kept:.0}% of it (target >= 90%: {})",
            ep.label,
            t.goodput(o.step),
            if kept >= 90.0 { "met" } else { "not met" }
        );
        peaks.push((ep.label.clone(), best, t.goodput(o.step)));
        check_accounts(ep, &session, o, added, unknown).await?;
    }
    print_ratios("hot-rows peak", &peaks);
    Ok(())
}

/// `a` as a percentage of `b`.
fn pct(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        100.0 * a / b
    } else {
        0.0
    }
}

/// Prints each endpoint's peak and overload goodput against the first endpoint's.
fn print_ratios(what: &str, peaks: &[(String, f64, f64)]) {
    let Some((first, p0, l0)) = peaks.first() else {
        return;
    };
    for (label, p, l) in &peaks[1..] {
        println!(
            "{what}: {first} / {label} = {:.2} (peak), {:.2} (last step)",
            if *p > 0.0 { p0 / p } else { 0.0 },
            if *l > 0.0 { l0 / l } else { 0.0 }
        );
    }
}

/// The statements of ravendb.
struct BlobStatements {
    txn: PreparedStatement,
    lwt: PreparedStatement,
}

/// One ravendb client until `end`: Accord transactions writing two large values in two
/// partitions, or two large-value LWTs (one per partition, not atomic together).
#[allow(clippy::too_many_arguments)]
async fn blob_client(
    session: Arc<Session>,
    st: Arc<BlobStatements>,
    body: Arc<Vec<u8>>,
    o: Arc<TxnOptions>,
    seed: u64,
    end: Instant,
) -> Tally {
    let mut t = Tally::default();
    let mut pick = Pick(seed);
    let (min, max) = o.value_bytes;
    while Instant::now() < end {
        let a = (pick.next() % o.keys as u64) as i32;
        let b = (a + 1 + (pick.next() % (o.keys as u64 - 1)) as i32) % o.keys;
        let sizes = [
            min + (pick.next() as usize) % (max - min + 1),
            min + (pick.next() as usize) % (max - min + 1),
        ];
        let offsets = [
            (pick.next() as usize) % (body.len() - sizes[0] + 1),
            (pick.next() as usize) % (body.len() - sizes[1] + 1),
        ];
        let va = &body[offsets[0]..offsets[0] + sizes[0]];
        let vb = &body[offsets[1]..offsets[1] + sizes[1]];
        let ver = pick.next() as i64;
        let start = Instant::now();
        let until = start + o.deadline;
        t.logical += 1;
        let mut committed = false;
        // lwt form: which of the two partitions still has to be written.
        let mut left = [true, true];
        while !committed && Instant::now() < until {
            match o.form {
                TxnForm::Accord => {
                    t.attempts += 1;
                    let q = with_timeout(&st.txn, until);
                    match session
                        .execute_unpaged(&q, (a, b, ver, va, a, ver, vb, b))
                        .await
                    {
                        Ok(_) => committed = true,
                        Err(e) => t.failed(&e),
                    }
                }
                TxnForm::Lwt => {
                    let i = if left[0] { 0 } else { 1 };
                    let (k, v) = if i == 0 { (a, va) } else { (b, vb) };
                    t.attempts += 1;
                    let q = with_timeout(&st.lwt, until);
                    match session.execute_unpaged(&q, (ver, v, k)).await {
                        Ok(r) => match current_n(r) {
                            Ok((true, _)) => {
                                left[i] = false;
                                committed = !left[0] && !left[1];
                            }
                            Ok((false, _)) => t.conflicts += 1,
                            Err(e) => {
                                t.other += 1;
                                if t.first_error.is_none() {
                                    t.first_error = Some(e);
                                }
                            }
                        },
                        Err(e) => t.failed(&e),
                    }
                }
            }
        }
        let requests = match o.form {
            TxnForm::Accord => 1,
            TxnForm::Lwt => 2,
        };
        t.ended(start, o.deadline, committed, requests);
    }
    t
}

/// RavenDB's experiment: many concurrent multi-partition transactions carrying large
/// values, on each endpoint in turn for `rounds` rounds (e.g. a Sluice that prepares
/// writes before the locks against one that prepares them under the locks).
pub async fn run_ravendb(o: &TxnOptions) -> anyhow::Result<()> {
    let clients = o.clients.first().copied().unwrap_or(16);
    let (min, max) = o.value_bytes;
    if min == 0 || min > max || o.keys < 2 {
        bail!("--txn-value-bytes needs 0 < min <= max and --txn-keys at least 2");
    }
    println!(
        "ravendb: form {:?}, {clients} clients, values {min}-{max} bytes, {} keys, {} s per step, deadline {} ms, {} rounds",
        o.form,
        o.keys,
        o.step.as_secs_f64(),
        o.deadline.as_millis(),
        o.rounds
    );
    let ddl = [
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {BLOB_KEYSPACE} WITH replication = \
             {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {BLOB_KEYSPACE}.blobs (k int PRIMARY KEY, ver bigint, body blob)"
        ),
    ];
    let mut body = vec![0u8; max];
    let mut fill = Pick(o.seed | 1);
    for chunk in body.chunks_mut(8) {
        let v = fill.next().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
    let body = Arc::new(body);
    let shared = Arc::new(o.clone());
    let mut sessions = Vec::new();
    for ep in &o.endpoints {
        let conn = Connection::open_one_node(&ep.node, o.connections, &ddl).await?;
        let insert = conn
            .session
            .prepare(format!(
                "INSERT INTO {BLOB_KEYSPACE}.blobs (k, ver) VALUES (?, 0)"
            ))
            .await?;
        for k in 0..o.keys {
            conn.session.execute_unpaged(&insert, (k,)).await?;
        }
        let st = match o.form {
            TxnForm::Accord => BlobStatements {
                txn: conn.session.prepare(RAVENDB_TRANSACTION).await?,
                lwt: conn
                    .session
                    .prepare(format!("SELECT ver FROM {BLOB_KEYSPACE}.blobs WHERE k = ?"))
                    .await?,
            },
            TxnForm::Lwt => {
                let lwt = conn
                    .session
                    .prepare(format!(
                        "UPDATE {BLOB_KEYSPACE}.blobs SET ver = ?, body = ? WHERE k = ? IF EXISTS"
                    ))
                    .await?;
                BlobStatements {
                    txn: lwt.clone(),
                    lwt,
                }
            }
        };
        sessions.push((conn.session, Arc::new(st)));
    }
    let mut goodput = vec![Vec::new(); o.endpoints.len()];
    for round in 0..o.rounds.max(1) {
        for (i, ep) in o.endpoints.iter().enumerate() {
            let (session, st) = &sessions[i];
            let before = ep.metrics.as_deref().and_then(ServerTxn::read);
            let end = Instant::now() + o.step;
            let mut tasks = tokio::task::JoinSet::new();
            for c in 0..clients {
                tasks.spawn(blob_client(
                    session.clone(),
                    st.clone(),
                    body.clone(),
                    shared.clone(),
                    o.seed ^ ((round * 7919 + c) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    end,
                ));
            }
            let mut t = Tally::default();
            while let Some(done) = tasks.join_next().await {
                t.absorb(done.context("a benchmark client panicked")?);
            }
            let after = ep.metrics.as_deref().and_then(ServerTxn::read);
            let label = format!("{} round {}", ep.label, round + 1);
            if round == 0 && i == 0 {
                println!("{}: {HEADER}", ep.label);
            }
            print_step(&label, clients, &mut t, o.step, None, before.zip(after));
            if let Some(s) = after {
                println!(
                    "  {label}: server critical section p50 <= {:.1} us, p99 <= {:.1} us over {:.0} transactions since start; lock wait p99 <= {:.1} us",
                    s.critical_p50 * 1e6,
                    s.critical_p99 * 1e6,
                    s.critical_count,
                    s.lock_wait_p99 * 1e6
                );
            }
            goodput[i].push(t.goodput(o.step));
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    for (i, ep) in o.endpoints.iter().enumerate().skip(1) {
        let (a, b) = (mean(&goodput[0]), mean(&goodput[i]));
        println!(
            "ravendb: {} {a:.1} tx/s / {} {b:.1} tx/s = {:.2}x (mean over {} rounds; RavenDB's was 3,708 / 1,403 = 2.64x)",
            o.endpoints[0].label,
            ep.label,
            if b > 0.0 { a / b } else { 0.0 },
            o.rounds.max(1)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logical_transaction_counts_once_and_retries_are_the_extra_attempts() {
        let mut t = Tally::default();
        let start = Instant::now();
        t.logical = 3;
        t.attempts = 5;
        t.ended(start, Duration::from_secs(60), true, 1);
        t.ended(start, Duration::from_secs(60), true, 1);
        t.ended(start, Duration::from_secs(60), false, 1);
        assert_eq!((t.committed, t.gave_up, t.late), (2, 1, 0));
        assert!((t.retries() - 2.0 / 3.0).abs() < 1e-9);
        // A commit after the deadline is late, not goodput.
        t.ended(
            start - Duration::from_secs(2),
            Duration::from_secs(1),
            true,
            1,
        );
        assert_eq!((t.committed, t.late), (2, 1));
        // Two requests per logical transaction (the LWT form of ravendb), none retried.
        let mut two = Tally {
            attempts: 4,
            ..Tally::default()
        };
        two.ended(start, Duration::from_secs(60), true, 2);
        two.ended(start, Duration::from_secs(60), true, 2);
        assert_eq!(two.retries(), 0.0);
        assert!((t.goodput(Duration::from_secs(2)) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn server_errors_are_counted_by_reason() {
        let mut t = Tally::default();
        t.failed(&ExecutionError::RequestTimeout(Duration::from_millis(5)));
        t.failed(&ExecutionError::LastAttemptError(
            RequestAttemptError::DbError(DbError::Overloaded, "busy".into()),
        ));
        t.failed(&ExecutionError::LastAttemptError(
            RequestAttemptError::DbError(
                DbError::WriteTimeout {
                    consistency: scylla::statement::Consistency::Serial,
                    received: 0,
                    required: 1,
                    write_type: scylla::errors::WriteType::Cas,
                },
                "cas".into(),
            ),
        ));
        assert_eq!(
            (t.client_timeouts, t.overloaded, t.timeouts, t.other),
            (1, 1, 1, 0)
        );
        assert!(t.first_error.unwrap().contains("5ms"));
    }
}
