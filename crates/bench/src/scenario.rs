//! Scenarios modelled on published experiments: capacity search, ScyllaDB's ramp (exception)
//! experiment, an overload sweep, ScyllaDB's hot-partition (rate limit) experiment, and the
//! generator's own ceiling.

use crate::fake::Immediate;
use crate::report::RunReport;
use crate::runner::{run_step, RunConfig, StreamSpec};
use crate::settle::{settle, Settle};
use crate::target::{KeyDist, Target};
use std::sync::Arc;
use std::time::Duration;

/// Workload mix of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// 100% single-row writes.
    Write,
    /// 100% single-partition reads.
    Read,
    /// 50% reads, 50% writes.
    Mix,
}

impl Workload {
    /// Fraction of reads.
    pub fn read_fraction(self) -> f64 {
        match self {
            Workload::Write => 0.0,
            Workload::Read => 1.0,
            Workload::Mix => 0.5,
        }
    }

    /// Name used in step labels.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Write => "write",
            Workload::Read => "read",
            Workload::Mix => "mix",
        }
    }
}

/// Scenario-independent knobs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Generator settings.
    pub run: RunConfig,
    /// Duration of each step.
    pub step: Duration,
    /// Duration of each capacity-search probe.
    pub probe_step: Duration,
    /// Idle time between steps (lets queues drain; not recorded).
    pub cooldown: Duration,
    /// Latency objective of the capacity search (p99 of successes).
    pub slo: Duration,
    /// First rate the capacity search tries.
    pub start_rate: f64,
    /// Uniform key space.
    pub partitions: u64,
    /// Share of late or unsent requests above which a capacity probe is generator-limited.
    pub max_lag: f64,
    /// Wait for a quiet machine before each step (`None`: start at once).
    pub settle: Option<Settle>,
    /// Repeat a capacity probe that missed the SLO once before the search acts on it.
    pub confirm_failures: bool,
}

/// Waits for a quiet machine before a step, if the plan asks for it, and counts the wait.
async fn settle_before_step(plan: &Plan, report: &mut RunReport) {
    if let Some(s) = &plan.settle {
        let w = settle(s).await;
        if plan.run.progress && !w.quiet {
            eprintln!(
                "-- {}: machine still busy after {:.1} s; starting the step anyway",
                report.label,
                w.waited.as_secs_f64()
            );
        }
        report.settle.add(w);
    }
}

/// Adds the tally of the waits to the report's notes.
pub fn note_settle(plan: &Plan, report: &mut RunReport) {
    if let Some(s) = &plan.settle {
        let note = report.settle.note(s);
        report.notes.push(note);
    }
}

/// Partition key that single-partition scenarios use (outside the uniform key space).
pub const HOT_PK: i64 = -1;

fn label_multiple(m: f64) -> String {
    format!("{}xC", crate::report_num(m))
}

/// What one capacity probe showed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The SLO was met, with the generator on time.
    Passed,
    /// The SLO was missed (or errors reached 0.1%) with the generator on time.
    Failed,
    /// The SLO was missed while the generator sent some requests late (fewer than
    /// `--max-lag`): latency counts from the intended send time, so the generator's own
    /// stall is in the figure.
    FailedWithLag,
    /// The generator sent more than `--max-lag` of the requests late or not at all.
    GeneratorLimited,
}

/// Outcome of the last step of `report`, as a capacity probe.
fn probe_outcome(report: &RunReport, plan: &Plan) -> ProbeOutcome {
    let Some(step) = report.steps.last() else {
        return ProbeOutcome::Failed;
    };
    let Some(c) = step.classes.first() else {
        return ProbeOutcome::Failed;
    };
    let completed = c.counts.completed().max(1);
    let errors = c.counts.failed() as f64 / completed as f64;
    let lag = step.lag_fraction();
    let slo_us = plan.slo.as_micros() as u64;
    let ok = c.counts.ok > 0 && c.latency.p99_us <= slo_us && errors < 0.001;
    if lag > plan.max_lag {
        ProbeOutcome::GeneratorLimited
    } else if ok {
        ProbeOutcome::Passed
    } else if lag > 0.0 {
        ProbeOutcome::FailedWithLag
    } else {
        ProbeOutcome::Failed
    }
}

/// Runs `spec` for `duration` as one step recorded as `label`: after the wait for a quiet
/// machine (if the plan asks for it), followed by the cooldown. Returns the step's index.
pub(crate) async fn recorded_step<T: Target>(
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    spec: StreamSpec,
    duration: Duration,
    label: &str,
    multiple: Option<f64>,
) -> usize {
    settle_before_step(plan, report).await;
    let t = report.next_second();
    let run = run_step(target, &[spec], duration, &plan.run, t).await;
    report.push_step(label, multiple, duration.as_secs_f64(), run);
    tokio::time::sleep(plan.cooldown).await;
    report.steps.len() - 1
}

/// Runs one capacity probe step at `rate`.
async fn probe<T: Target>(
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    stream: &StreamSpec,
    rate: f64,
    prefix: &str,
) {
    let spec = StreamSpec {
        rate,
        ..stream.clone()
    };
    let label = format!("{prefix}{rate:.0}/s");
    recorded_step(target, report, plan, spec, plan.probe_step, &label, None).await;
}

/// Where a [`CapacitySearch`] stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum SearchPhase {
    /// Rates grow by 1.5x per passing probe.
    Grow { rate: f64, probes: u32 },
    /// Geometric bisection between the last passing and the first failing rate.
    Bisect { lo: f64, hi: f64, left: u32 },
    /// Finished with this capacity (None: no rate passed).
    Done(Option<f64>),
}

/// Most probes of the growth phase (1.5^30 x the start rate is beyond any real server).
const MAX_GROW_PROBES: u32 = 30;
/// Bisection probes after the first failure: three narrow the 1.5x gap to about 5%.
const BISECT_PROBES: u32 = 3;

/// The capacity search as a state machine, so that two searches can be interleaved probe by
/// probe (`versus`) while `capacity` runs one alone: ask [`next_rate`](Self::next_rate), probe
/// it, then [`record`](Self::record) whether the probe passed.
#[derive(Clone, Debug)]
pub struct CapacitySearch {
    phase: SearchPhase,
    last_pass: Option<f64>,
    generator_limited: bool,
    /// The probe at the next rate is a repeat (after generator lag, or to confirm a miss).
    repeating: bool,
    /// A miss with the generator on time is repeated too (see [`Self::confirming_failures`]).
    confirm_failures: bool,
}

impl CapacitySearch {
    /// A search whose first probe runs at `start_rate` (at least 1/s).
    pub fn new(start_rate: f64) -> Self {
        Self {
            phase: SearchPhase::Grow {
                rate: start_rate.max(1.0),
                probes: 0,
            },
            last_pass: None,
            generator_limited: false,
            repeating: false,
            confirm_failures: false,
        }
    }

    /// The same search, which also repeats once a probe that missed the SLO with the
    /// generator on time (`--confirm-failures`). On a machine whose host stalls it now and
    /// then, one stall of tens of milliseconds fails a probe far below the server's limit
    /// and ends the growth there; a server past its limit misses again.
    pub fn confirming_failures(mut self, on: bool) -> Self {
        self.confirm_failures = on;
        self
    }

    /// The rate of the next probe, or None once the search has ended.
    pub fn next_rate(&self) -> Option<f64> {
        match self.phase {
            SearchPhase::Grow { rate, .. } => Some(rate),
            SearchPhase::Bisect { lo, hi, .. } => Some((lo * hi).sqrt()),
            SearchPhase::Done(_) => None,
        }
    }

    /// Records the outcome of the probe at [`next_rate`](Self::next_rate); notes for the report
    /// (why the search stopped early) are appended to `notes`.
    ///
    /// A probe in which the generator lagged is repeated once at the same rate before the
    /// search acts on it: past `--max-lag`, or below it when the probe missed the SLO. On a
    /// shared machine (a VM whose host deschedules it, a file system that stalls a write) the
    /// generator and the server can stall together for tens of milliseconds at any rate,
    /// which says nothing of either one's limit, while a generator at its limit lags again
    /// and a server past its own misses the SLO again.
    pub fn record(&mut self, outcome: ProbeOutcome, notes: &mut Vec<String>) {
        let why = match outcome {
            ProbeOutcome::GeneratorLimited => Some("the generator lagged"),
            ProbeOutcome::FailedWithLag => Some("missed the SLO while the generator lagged"),
            ProbeOutcome::Failed if self.confirm_failures => Some("missed the SLO"),
            ProbeOutcome::Passed | ProbeOutcome::Failed => None,
        };
        if let (Some(why), false, Some(rate)) = (why, self.repeating, self.next_rate()) {
            notes.push(format!(
                "capacity probe at {rate:.0}/s: {why}; probed again"
            ));
            self.repeating = true;
            return;
        }
        self.repeating = false;
        let ok = outcome == ProbeOutcome::Passed;
        let generator_limited = outcome == ProbeOutcome::GeneratorLimited;
        self.phase = match self.phase {
            SearchPhase::Grow { rate, probes } => {
                let probes = probes + 1;
                if generator_limited {
                    notes.push(format!(
                        "capacity search stopped at {rate:.0}/s: the generator could not keep up"
                    ));
                    self.generator_limited = true;
                    SearchPhase::Done(self.last_pass)
                } else if ok {
                    self.last_pass = Some(rate);
                    if probes >= MAX_GROW_PROBES {
                        SearchPhase::Done(self.last_pass)
                    } else {
                        SearchPhase::Grow {
                            rate: rate * 1.5,
                            probes,
                        }
                    }
                } else if let Some(lo) = self.last_pass {
                    SearchPhase::Bisect {
                        lo,
                        hi: rate,
                        left: BISECT_PROBES,
                    }
                } else {
                    notes.push(format!("capacity search: even {rate:.0}/s missed the SLO"));
                    SearchPhase::Done(None)
                }
            }
            SearchPhase::Bisect { lo, hi, left } => {
                let mid = (lo * hi).sqrt();
                let (lo, hi) = if ok { (mid, hi) } else { (lo, mid) };
                if ok {
                    self.last_pass = Some(mid);
                }
                if generator_limited {
                    // Any higher rate would measure the generator too.
                    notes.push(format!(
                        "capacity search stopped at {mid:.0}/s: the generator could not keep up"
                    ));
                    self.generator_limited = true;
                    SearchPhase::Done(Some(lo))
                } else if left <= 1 {
                    SearchPhase::Done(Some(lo))
                } else {
                    SearchPhase::Bisect {
                        lo,
                        hi,
                        left: left - 1,
                    }
                }
            }
            done @ SearchPhase::Done(_) => done,
        };
    }

    /// Whether the search has ended.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, SearchPhase::Done(_))
    }

    /// The capacity found (the highest passing rate), once the search has ended.
    pub fn result(&self) -> Option<f64> {
        match self.phase {
            SearchPhase::Done(c) => c,
            _ => None,
        }
    }

    /// Whether the generator, not the server, ended the search: C is then a lower bound.
    pub fn generator_limited(&self) -> bool {
        self.generator_limited
    }
}

/// Runs one probe of `search` at its next rate and records the outcome; returns the probed rate
/// and the index of its step in `report`, or None when the search had already ended.
pub async fn capacity_probe<T: Target>(
    search: &mut CapacitySearch,
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    stream: &StreamSpec,
    prefix: &str,
) -> Option<(f64, usize)> {
    let rate = search.next_rate()?;
    probe(target, report, plan, stream, rate, prefix).await;
    let outcome = probe_outcome(report, plan);
    search.record(outcome, &mut report.notes);
    Some((rate, report.steps.len() - 1))
}

/// Finds C: the highest offered rate whose p99 stays under the SLO with errors under 0.1%.
///
/// Rates grow by 1.5x until a step fails, then three bisection steps (geometric means)
/// narrow the gap to about 5%, as the measurement protocol asks.
pub async fn capacity<T: Target>(
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    stream: &StreamSpec,
    prefix: &str,
) -> Option<f64> {
    let mut search =
        CapacitySearch::new(plan.start_rate).confirming_failures(plan.confirm_failures);
    while capacity_probe(&mut search, target, report, plan, stream, prefix)
        .await
        .is_some()
    {}
    search.result()
}

/// Runs one step per multiple of `c` with the given streams (rates are multiplied).
async fn steps<T: Target>(
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    name: &str,
    c: f64,
    multiples: &[f64],
    stream: &StreamSpec,
) {
    for &m in multiples {
        let spec = StreamSpec {
            rate: c * m,
            ..stream.clone()
        };
        let label = format!("{name} {}", label_multiple(m));
        recorded_step(target, report, plan, spec, plan.step, &label, Some(m)).await;
    }
}

/// The ramp stream: writes spread over 1000 rows of one partition.
pub fn ramp_stream() -> StreamSpec {
    StreamSpec {
        rate: 0.0,
        read_fraction: 0.0,
        keys: KeyDist::Single { pk: HOT_PK },
        rows: 1000,
    }
}

/// A uniform stream of the given workload.
pub fn uniform_stream(w: Workload, partitions: u64) -> StreamSpec {
    StreamSpec {
        rate: 0.0,
        read_fraction: w.read_fraction(),
        keys: KeyDist::Uniform { partitions },
        rows: 1,
    }
}

/// ScyllaDB's exception experiment: one-partition writes ramping from 0.5·C to 5·C.
pub async fn ramp<T: Target>(
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    c: f64,
    multiples: &[f64],
) {
    steps(target, report, plan, "ramp", c, multiples, &ramp_stream()).await;
}

/// Goodput at multiples of C for uniform writes, uniform reads and a 50/50 mix.
pub async fn sweep<T: Target>(
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    c: f64,
    multiples: &[f64],
) {
    for w in [Workload::Write, Workload::Read, Workload::Mix] {
        let s = uniform_stream(w, plan.partitions);
        steps(target, report, plan, w.name(), c, multiples, &s).await;
    }
    report.fill_goodput_vs_c();
}

/// Settings of the hot-partition experiment.
#[derive(Clone, Debug)]
pub struct HotPlan {
    /// Rate of the uniform (victim) read workload.
    pub uniform_rate: f64,
    /// Attacker rate as a multiple of the uniform rate (open-loop stand-in for 8x concurrency).
    pub attack_multiplier: f64,
}

/// ScyllaDB's rate-limit experiment in three phases: uniform reads alone; plus an attacker
/// reading one wide partition; plus `per_partition_rate_limit` applied by `apply_limit`.
///
/// Classes: 0 = uniform, 1 = attacker. A failing `apply_limit` (e.g. Cassandra, which has no
/// such option) is recorded as unsupported and the third phase runs anyway.
pub async fn hot_partition<T: Target>(
    target: &Arc<T>,
    report: &mut RunReport,
    plan: &Plan,
    hot: &HotPlan,
    apply_limit: impl AsyncFnOnce() -> Result<(), String>,
) {
    let uniform = StreamSpec {
        rate: hot.uniform_rate,
        read_fraction: 1.0,
        keys: KeyDist::Uniform {
            partitions: plan.partitions,
        },
        rows: 1,
    };
    let attacker = StreamSpec {
        rate: hot.uniform_rate * hot.attack_multiplier,
        read_fraction: 1.0,
        keys: KeyDist::Single { pk: HOT_PK },
        rows: 1,
    };
    let idle = StreamSpec {
        rate: 0.0,
        ..attacker.clone()
    };
    for (label, streams) in [
        ("baseline", vec![uniform.clone(), idle]),
        ("attack", vec![uniform.clone(), attacker.clone()]),
    ] {
        settle_before_step(plan, report).await;
        let t = report.next_second();
        let run = run_step(target, &streams, plan.step, &plan.run, t).await;
        report.push_step(label, None, plan.step.as_secs_f64(), run);
    }
    match apply_limit().await {
        Ok(()) => {}
        Err(e) => report.notes.push(format!(
            "per_partition_rate_limit unsupported by the server ({e}); the 'limited' phase runs without it"
        )),
    }
    settle_before_step(plan, report).await;
    let t = report.next_second();
    let run = run_step(target, &[uniform, attacker], plan.step, &plan.run, t).await;
    report.push_step("limited", None, plan.step.as_secs_f64(), run);
}

/// One line on the `limited` step of [`hot_partition`]: the rate the hot partition was
/// accepted at against `limit`, and the other partitions' goodput against the baseline step.
pub fn hot_partition_summary(report: &RunReport, limit: u32) -> Option<String> {
    let step = |label: &str| report.steps.iter().find(|s| s.label == label);
    let (base, limited) = (step("baseline")?, step("limited")?);
    let hot = limited.classes.get(1)?;
    if limited.duration_s <= 0.0 {
        return None;
    }
    let accepted = (hot.counts.ok + hot.counts.late) as f64 / limited.duration_s;
    let others = limited.classes.first()?.goodput_rate;
    let base_others = base.classes.first()?.goodput_rate;
    let vs_limit = if limit > 0 {
        format!("{:+.0}%", (accepted / f64::from(limit) - 1.0) * 100.0)
    } else {
        "-".into()
    };
    let vs_base = if base_others > 0.0 {
        format!("{:.0}%", others / base_others * 100.0)
    } else {
        "-".into()
    };
    Some(format!(
        "hot partition: offered {:.0}/s, accepted {accepted:.0}/s against max_reads_per_second {limit} \
         ({vs_limit}); other partitions' goodput {others:.0}/s, {vs_base} of the baseline step's \
         {base_others:.0}/s (targets: accepted within 10% of the limit, others at least 95%)",
        hot.offered_rate
    ))
}

/// Measures the generator's ceiling: requests/s it can issue and account against a target that
/// answers at once. Returns the median per-second completions of the saturated step.
pub async fn ceiling(report: &mut RunReport, plan: &Plan) -> f64 {
    let target = Arc::new(Immediate::default());
    let flood = StreamSpec {
        // Far above any achievable rate: the dispatcher is always behind and sends flat out.
        rate: 50_000_000.0,
        ..uniform_stream(Workload::Write, plan.partitions)
    };
    let mut cfg = plan.run.clone();
    cfg.progress = false;
    let run = run_step(&target, &[flood], plan.step, &cfg, 0).await;
    let mut per_sec: Vec<u64> = run
        .seconds
        .iter()
        .map(|s| s.total().completed())
        .filter(|n| *n > 0)
        .collect();
    per_sec.sort_unstable();
    let ceiling = per_sec.get(per_sec.len() / 2).copied().unwrap_or(0) as f64;
    report.push_step("saturated", None, plan.step.as_secs_f64(), run);
    report.notes.clear();
    // Check that 80% of the ceiling is sustained on schedule.
    let check = StreamSpec {
        rate: ceiling * 0.8,
        ..uniform_stream(Workload::Write, plan.partitions)
    };
    let t = report.next_second();
    let run = run_step(&target, &[check], plan.step, &cfg, t).await;
    report.push_step("0.8x ceiling", None, plan.step.as_secs_f64(), run);
    ceiling
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeConfig, FakeServer};
    use crate::schedule::Arrival;

    fn plan() -> Plan {
        Plan {
            run: RunConfig {
                arrival: Arrival::Constant,
                deadline: Duration::from_millis(50),
                client_timeout: Duration::from_millis(50),
                lag_tolerance: Duration::from_millis(2),
                max_in_flight: 100_000,
                seed: 5,
                progress: false,
            },
            step: Duration::from_secs(2),
            probe_step: Duration::from_secs(2),
            cooldown: Duration::from_millis(200),
            slo: Duration::from_millis(20),
            start_rate: 200.0,
            partitions: 100,
            max_lag: 0.01,
            settle: None,
            confirm_failures: false,
        }
    }

    fn report(classes: &[&str]) -> RunReport {
        RunReport {
            classes: classes.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn capacity_search_finds_the_service_rate() {
        // 1 ms service: the queue is stable up to 1000/s and grows without bound beyond it.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(1),
            ..Default::default()
        }));
        let p = plan();
        let mut r = report(&["uniform"]);
        let s = uniform_stream(Workload::Write, 100);
        let c = capacity(&fake, &mut r, &p, &s, "").await.expect("capacity");
        assert!((850.0..=1000.0).contains(&c), "C = {c}");
        assert!(r.steps.len() >= 6);
        // Steps are laid end to end on the run's timeline.
        assert_eq!(r.steps[1].start_s, r.steps[0].start_s + 2);
    }

    /// A probe's outcome from whether the generator lagged past `--max-lag` and whether the
    /// server met the SLO.
    fn outcome(lagged: bool, met_slo: bool) -> ProbeOutcome {
        if lagged {
            ProbeOutcome::GeneratorLimited
        } else if met_slo {
            ProbeOutcome::Passed
        } else {
            ProbeOutcome::Failed
        }
    }

    /// Drives `s` to its end, `probe` giving the outcome of each rate probed; returns the
    /// rates in order, the ended search and its notes.
    fn drive_with(
        mut s: CapacitySearch,
        mut probe: impl FnMut(f64) -> ProbeOutcome,
    ) -> (Vec<f64>, CapacitySearch, Vec<String>) {
        let (mut rates, mut notes) = (Vec::new(), Vec::new());
        while let Some(r) = s.next_rate() {
            rates.push(r);
            s.record(probe(r), &mut notes);
            assert!(rates.len() < 50, "search does not end");
        }
        (rates, s, notes)
    }

    /// Drives a search against a server whose true capacity is `c`: a probe passes below it.
    fn drive(
        c: f64,
        start: f64,
        lag_above: Option<f64>,
    ) -> (Vec<f64>, CapacitySearch, Vec<String>) {
        drive_with(CapacitySearch::new(start), |r| {
            outcome(lag_above.is_some_and(|l| r > l), r <= c)
        })
    }

    #[test]
    fn capacity_search_grows_then_bisects_three_times() {
        let (rates, s, notes) = drive(2000.0, 1000.0, None);
        // 1000 and 1500 pass, 2250 fails; then geometric means of the last pass and fail.
        assert_eq!(&rates[..3], &[1000.0, 1500.0, 2250.0]);
        assert_eq!(rates.len(), 6);
        let m1 = (1500.0f64 * 2250.0).sqrt();
        assert!((rates[3] - m1).abs() < 1e-9, "{rates:?}");
        let c = s.result().expect("capacity");
        assert!((1900.0..=2000.0).contains(&c), "C = {c}");
        assert!(rates.contains(&c), "C is a probed rate");
        assert!(!s.generator_limited() && notes.is_empty());
    }

    #[test]
    fn capacity_search_ends_early_when_nothing_passes_or_the_generator_lags() {
        let (rates, s, notes) = drive(500.0, 1000.0, None);
        assert_eq!(rates, vec![1000.0]);
        assert_eq!(s.result(), None);
        assert!(notes[0].contains("even 1000/s missed the SLO"));
        // The generator lags above 2000/s: 2250 is probed twice, then the search stops with
        // C = 1500, a lower bound.
        let (rates, s, notes) = drive(1e9, 1000.0, Some(2000.0));
        assert_eq!(rates, vec![1000.0, 1500.0, 2250.0, 2250.0]);
        assert_eq!(s.result(), Some(1500.0));
        assert!(s.generator_limited());
        assert!(notes[0].contains("2250/s: the generator lagged; probed again"));
        assert!(notes[1].contains("generator could not keep up"));
        assert!(s.is_done() && s.next_rate().is_none());
        // The server misses the SLO at 2250/s, then the generator lags at the first bisection
        // probe: C stays the last pass and is marked as a bound.
        let mut s = CapacitySearch::new(1000.0);
        let mut notes = Vec::new();
        for outcome in [
            ProbeOutcome::Passed,
            ProbeOutcome::Passed,
            ProbeOutcome::Failed,
        ] {
            s.record(outcome, &mut notes);
        }
        assert!(notes.is_empty() && !s.generator_limited());
        let mid = s.next_rate().expect("bisecting");
        assert!((mid - (1500.0f64 * 2250.0).sqrt()).abs() < 1e-9);
        s.record(ProbeOutcome::GeneratorLimited, &mut notes);
        assert_eq!(s.next_rate(), Some(mid), "repeated once");
        s.record(ProbeOutcome::GeneratorLimited, &mut notes);
        assert_eq!(s.result(), Some(1500.0));
        assert!(s.generator_limited() && notes.len() == 2);
    }

    #[test]
    fn a_probe_that_lagged_once_is_repeated_and_the_search_goes_on() {
        // A stall at 1500/s only: the repeat passes and the search ends as if it never was.
        let mut stalled = false;
        let (rates, s, notes) = drive_with(CapacitySearch::new(1000.0), |r| {
            let lagged = r == 1500.0 && !stalled;
            stalled |= lagged;
            outcome(lagged, r <= 2000.0)
        });
        assert_eq!(&rates[..4], &[1000.0, 1500.0, 1500.0, 2250.0]);
        let c = s.result().expect("capacity");
        assert!((1900.0..=2000.0).contains(&c), "C = {c}");
        assert!(!s.generator_limited());
        assert_eq!(notes.len(), 1, "{notes:?}");
    }

    #[test]
    fn a_probe_that_missed_the_slo_while_the_generator_lagged_is_repeated_once() {
        // Below C, a stall of the whole machine at 1500/s: late sends and a missed SLO. The
        // repeat passes and the search goes on as if the stall never was.
        let mut s = CapacitySearch::new(1000.0);
        let mut notes = Vec::new();
        s.record(ProbeOutcome::Passed, &mut notes);
        s.record(ProbeOutcome::FailedWithLag, &mut notes);
        assert_eq!(s.next_rate(), Some(1500.0), "repeated at the same rate");
        assert!(notes[0].contains("1500/s: missed the SLO while the generator lagged"));
        s.record(ProbeOutcome::Passed, &mut notes);
        assert_eq!(s.next_rate(), Some(2250.0));
        // Past C the server misses the SLO again on the repeat: an ordinary failure, so the
        // search bisects and C is not marked as a bound.
        s.record(ProbeOutcome::FailedWithLag, &mut notes);
        assert_eq!(s.next_rate(), Some(2250.0));
        s.record(ProbeOutcome::FailedWithLag, &mut notes);
        let mid = s.next_rate().expect("bisecting");
        assert!((mid - (1500.0f64 * 2250.0).sqrt()).abs() < 1e-9, "{mid}");
        assert!(!s.generator_limited());
        assert_eq!(notes.len(), 2, "{notes:?}");
        // A probe without lag that misses the SLO is not repeated.
        s.record(ProbeOutcome::Failed, &mut notes);
        assert!(
            s.next_rate().is_some_and(|r| r < mid),
            "bisected down at once"
        );
        assert_eq!(notes.len(), 2);
    }

    #[test]
    fn with_confirmed_failures_a_miss_counts_only_when_repeated() {
        // One stall at 1500/s, far below C = 2000/s: the repeat passes and growth goes on.
        let mut stalled = false;
        let search = CapacitySearch::new(1000.0).confirming_failures(true);
        let (rates, s, mut notes) = drive_with(search, |r| {
            let stall = r == 1500.0 && !stalled;
            stalled |= stall;
            outcome(false, r <= 2000.0 && !stall)
        });
        assert_eq!(&rates[..5], &[1000.0, 1500.0, 1500.0, 2250.0, 2250.0]);
        let c = s.result().expect("capacity");
        assert!((1900.0..=2000.0).contains(&c), "C = {c}");
        assert!(
            notes[0].contains("1500/s: missed the SLO; probed again"),
            "{notes:?}"
        );
        // Past C every miss is repeated, and a repeated miss bisects: the 2250/s probe and
        // each failing bisection probe ran twice.
        let misses = notes
            .iter()
            .filter(|n| n.contains("missed the SLO"))
            .count();
        assert_eq!(rates.len(), 5 + 3 + misses - 2, "{rates:?} {notes:?}");
        // Without the option the stall at 1500/s ends the growth there.
        let mut plain = CapacitySearch::new(1000.0);
        plain.record(ProbeOutcome::Passed, &mut notes);
        plain.record(ProbeOutcome::Failed, &mut notes);
        assert!(plain.next_rate().is_some_and(|r| r < 1500.0), "bisecting");
    }

    #[tokio::test(start_paused = true)]
    async fn sweep_reports_goodput_relative_to_capacity() {
        // With admission (queue delay capped at 10 ms), goodput stays at capacity past it.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(1),
            max_queue_delay: Some(Duration::from_millis(10)),
            ..Default::default()
        }));
        let p = plan();
        let mut r = report(&["uniform"]);
        sweep(&fake, &mut r, &p, 1000.0, &[0.5, 1.0, 3.0]).await;
        assert_eq!(r.steps.len(), 9);
        let half = &r.steps[0];
        assert_eq!(half.label, "write 0.5xC");
        let v = half.goodput_vs_c.expect("ratio");
        assert!((0.45..=0.55).contains(&v), "0.5xC ratio {v}");
        let three = &r.steps[2];
        assert!(three.goodput_vs_c.expect("ratio") >= 0.95);
        assert!(three.classes[0].counts.overloaded > 3000);
        assert!(r.steps[5].label.starts_with("read"));
    }

    #[tokio::test(start_paused = true)]
    async fn hot_partition_phases_separate_victim_and_attacker() {
        // The fake's limit stays on for all phases, which isolates the accounting per class.
        let fake = Arc::new(FakeServer::new(FakeConfig {
            partition_limit: Some(50),
            ..Default::default()
        }));
        let p = plan();
        let mut r = report(&["uniform", "attacker"]);
        let hot = HotPlan {
            uniform_rate: 100.0,
            attack_multiplier: 8.0,
        };
        hot_partition(&fake, &mut r, &p, &hot, async || {
            Err("no such option".into())
        })
        .await;
        assert_eq!(r.steps.len(), 3);
        assert_eq!(r.steps[0].classes[1].counts.offered, 0);
        let attack = &r.steps[1];
        assert_eq!(attack.classes[0].counts.ok, 200);
        assert_eq!(attack.classes[1].counts.offered, 1600);
        // 50/s in fixed windows; a 2 s step spans parts of three windows.
        let hot_ok = attack.classes[1].counts.ok;
        assert!((100..=150).contains(&hot_ok), "attacker accepted {hot_ok}");
        assert_eq!(attack.classes[1].counts.rate_limited, 1600 - hot_ok);
        assert!(r.notes.iter().any(|n| n.contains("unsupported")));
        let limited = &r.steps[2];
        let accepted = (limited.classes[1].counts.ok + limited.classes[1].counts.late) as f64 / 2.0;
        let line = hot_partition_summary(&r, 50).expect("summary");
        assert!(
            line.contains(&format!(
                "accepted {accepted:.0}/s against max_reads_per_second 50"
            )),
            "{line}"
        );
        assert!(line.contains("offered 800/s"), "{line}");
        // The fake serves every uniform read in every step.
        assert!(
            line.contains("goodput 100/s, 100% of the baseline step's 100/s"),
            "{line}"
        );
        assert_eq!(hot_partition_summary(&report(&["requests"]), 50), None);
    }

    #[tokio::test]
    async fn ceiling_reports_a_positive_rate() {
        // Real time (a ceiling is a wall-clock figure), kept short.
        let mut p = plan();
        p.step = Duration::from_millis(300);
        let mut r = report(&["generator"]);
        let c = ceiling(&mut r, &p).await;
        assert!(c > 0.0);
        assert_eq!(r.steps.len(), 2);
    }
}
