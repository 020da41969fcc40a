//! `versus`: two endpoints (Sluice and the reference Cassandra) measured in one run, by one
//! generator with the same settings, so that their figures can be compared line by line.
//!
//! Order, so that drift and machine noise hit both sides alike: for each workload, the two
//! capacity searches are interleaved probe by probe (A, B, A, B, ...; once one search has
//! ended the other continues alone), then the fixed-rate latency steps run in the reverse order
//! (B, A). The next workload starts with the other endpoint, so over write and read each side
//! opens once and closes once (ABBA). The fixed-rate step runs both endpoints at one common
//! rate (the lower of the two capacities × `common_fraction`), where latency is compared at
//! equal load.

use crate::pause::Stopped;
use crate::report::{
    aligned, esc, html_compare_body, html_page, html_table, RunReport, StepSummary,
};
use crate::runner::StreamSpec;
use crate::scenario::{
    capacity_probe, recorded_step, uniform_stream, CapacitySearch, Plan, Workload,
};
use crate::stats::Percentiles;
use crate::target::Target;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::sync::Arc;

/// Settings of a `versus` run beyond the shared [`Plan`].
#[derive(Clone, Debug)]
pub struct VersusPlan {
    /// Workloads, in the order they run.
    pub workloads: Vec<Workload>,
    /// The fixed-rate step runs at this fraction of the lower of the two capacities.
    pub common_fraction: f64,
    /// A fixed rate for that step instead, requests/s.
    pub common_rate: Option<f64>,
    /// Load each endpoint gets before each workload's capacity search, not part of it.
    pub warm_up: Option<WarmUp>,
    /// The endpoints' server processes, by side: while one side runs a step, the other's
    /// process is stopped ([`Stopped`]), so that its background work cannot take a core the
    /// two share.
    pub pause_pids: [Option<u32>; 2],
}

/// A fixed-rate step that warms an endpoint up before it is measured: a JVM's JIT
/// compiles its hot paths after many calls, so a fresh Cassandra misses the SLO even at
/// 2,000 requests/s in its first search and finds 60,000 or more after one or two.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmUp {
    /// How long each endpoint runs it.
    pub duration: std::time::Duration,
    /// Offered rate, requests/s.
    pub rate: f64,
}

/// One step of the run, in execution order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRef {
    /// Endpoint index: 0 = `--nodes`, 1 = `--against`.
    pub side: usize,
    /// Step label in that side's report.
    pub label: String,
}

/// What one endpoint did during one step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepFigures {
    /// Offered rate, requests/s.
    pub offered_rate: f64,
    /// Goodput, requests/s.
    pub goodput_rate: f64,
    /// Latency of successes.
    pub latency: Percentiles,
    /// Answers that were neither goodput nor a timeout (late successes included).
    pub errors: u64,
    /// Server and client timeouts.
    pub timeouts: u64,
    /// Share of requests the generator sent late or not at all.
    pub lag_fraction: f64,
}

impl StepFigures {
    /// Figures of the first traffic class of a step.
    pub fn of(step: &StepSummary) -> Option<Self> {
        let c = step.classes.first()?;
        let k = &c.counts;
        let timeouts = k.server_timeout + k.client_timeout;
        Some(Self {
            offered_rate: c.offered_rate,
            goodput_rate: c.goodput_rate,
            latency: c.latency,
            errors: k.failed().saturating_sub(timeouts),
            timeouts,
            lag_fraction: step.lag_fraction(),
        })
    }
}

/// One endpoint's results for one workload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SideRow {
    /// Workload name.
    pub workload: String,
    /// Endpoint index: 0 = `--nodes`, 1 = `--against`.
    pub side: usize,
    /// Endpoint label.
    pub endpoint: String,
    /// Capacity C found by the search, requests/s.
    pub capacity: Option<f64>,
    /// The generator ended the search: C is a lower bound.
    pub capacity_lower_bound: bool,
    /// The capacity probe at C.
    pub at_capacity: Option<StepFigures>,
    /// The fixed-rate step at the common rate.
    pub common: Option<StepFigures>,
}

impl SideRow {
    /// Highest generator lag of the steps this row reports.
    pub fn lag_fraction(&self) -> f64 {
        [self.at_capacity, self.common]
            .iter()
            .flatten()
            .map(|f| f.lag_fraction)
            .fold(0.0, f64::max)
    }
}

/// Endpoint 0 over endpoint 1 for one workload.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ratio {
    /// Workload name.
    pub workload: String,
    /// Rate of the common step, requests/s.
    pub common_rate: Option<f64>,
    /// C(0) / C(1).
    pub capacity: Option<f64>,
    /// Which way the ratio is bounded when a C is only a lower bound: ">=", "<=", "?" or "".
    pub capacity_bound: String,
    /// p99(0) / p99(1) at the common rate.
    pub p99_common: Option<f64>,
}

/// The measurements of a `versus` run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct VersusOutcome {
    /// Two rows per workload, endpoint 0 first.
    pub rows: Vec<SideRow>,
    /// One per workload.
    pub ratios: Vec<Ratio>,
    /// Every step in the order it ran.
    pub order: Vec<StepRef>,
}

/// Runs every workload of `vp` against both targets; each side's steps go into its own report.
pub async fn run<T: Target>(
    targets: [&Arc<T>; 2],
    reports: &mut [RunReport; 2],
    plan: &Plan,
    vp: &VersusPlan,
) -> VersusOutcome {
    let mut out = VersusOutcome::default();
    for (k, &w) in vp.workloads.iter().enumerate() {
        // ABBA: the side that opens a workload alternates from one workload to the next.
        let first = k % 2;
        let turns = [first, 1 - first];
        let stream = uniform_stream(w, plan.partitions);
        if let Some(warm) = vp.warm_up {
            let label = format!("{} warm-up {:.0}/s", w.name(), warm.rate);
            for side in turns {
                announce(plan, &reports[side].label, &label);
                let spec = StreamSpec {
                    rate: warm.rate,
                    ..stream.clone()
                };
                let report = &mut reports[side];
                let _other = Stopped::new(vp.pause_pids[1 - side]);
                recorded_step(
                    targets[side],
                    report,
                    plan,
                    spec,
                    warm.duration,
                    &label,
                    None,
                )
                .await;
                out.order.push(StepRef {
                    side,
                    label: label.clone(),
                });
            }
        }
        let prefix = format!("{} capacity ", w.name());
        let mut searches = [
            CapacitySearch::new(plan.start_rate).confirming_failures(plan.confirm_failures),
            CapacitySearch::new(plan.start_rate).confirming_failures(plan.confirm_failures),
        ];
        let mut probes: [Vec<(f64, usize)>; 2] = [Vec::new(), Vec::new()];
        while !searches.iter().all(CapacitySearch::is_done) {
            for side in turns {
                if let Some(rate) = searches[side].next_rate() {
                    announce(plan, &reports[side].label, &format!("{prefix}{rate:.0}/s"));
                }
                let _other = Stopped::new(vp.pause_pids[1 - side]);
                let p = capacity_probe(
                    &mut searches[side],
                    targets[side],
                    &mut reports[side],
                    plan,
                    &stream,
                    &prefix,
                )
                .await;
                if let Some((rate, idx)) = p {
                    probes[side].push((rate, idx));
                    out.order.push(StepRef {
                        side,
                        label: reports[side].steps[idx].label.clone(),
                    });
                }
            }
        }
        let caps = [searches[0].result(), searches[1].result()];
        let common_rate = vp.common_rate.or_else(|| {
            caps.iter()
                .flatten()
                .copied()
                .reduce(f64::min)
                .map(|c| c * vp.common_fraction)
        });
        let mut commons = [None, None];
        match common_rate {
            Some(rate) => {
                let label = format!("{} common {rate:.0}/s", w.name());
                for side in [turns[1], turns[0]] {
                    announce(plan, &reports[side].label, &label);
                    let spec = StreamSpec {
                        rate,
                        ..stream.clone()
                    };
                    let report = &mut reports[side];
                    let _other = Stopped::new(vp.pause_pids[1 - side]);
                    let idx =
                        recorded_step(targets[side], report, plan, spec, plan.step, &label, None)
                            .await;
                    commons[side] = StepFigures::of(&report.steps[idx]);
                    out.order.push(StepRef {
                        side,
                        label: label.clone(),
                    });
                }
            }
            None => {
                for r in reports.iter_mut() {
                    r.notes.push(format!(
                        "{}: neither endpoint met the SLO at any rate; no common-rate step (pass --common-rate)",
                        w.name()
                    ));
                }
            }
        }
        for side in 0..2 {
            // The probe at C is the one whose rate is exactly the value the search returned
            // (the last one: a probe repeated after generator lag comes first).
            let at_capacity = caps[side]
                .and_then(|c| probes[side].iter().rev().find(|(r, _)| *r == c))
                .and_then(|&(_, idx)| reports[side].steps.get(idx))
                .and_then(StepFigures::of);
            out.rows.push(SideRow {
                workload: w.name().into(),
                side,
                endpoint: reports[side].label.clone(),
                capacity: caps[side],
                capacity_lower_bound: searches[side].generator_limited(),
                at_capacity,
                common: commons[side],
            });
        }
        let bound = match (
            searches[0].generator_limited(),
            searches[1].generator_limited(),
        ) {
            (false, false) => "",
            (true, false) => ">=",
            (false, true) => "<=",
            (true, true) => "?",
        };
        let p99 = |f: &Option<StepFigures>| f.map(|f| f.latency.p99_us as f64);
        out.ratios.push(Ratio {
            workload: w.name().into(),
            common_rate,
            capacity: match caps {
                [Some(a), Some(b)] if b > 0.0 => Some(a / b),
                _ => None,
            },
            capacity_bound: bound.into(),
            p99_common: match (p99(&commons[0]), p99(&commons[1])) {
                (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                _ => None,
            },
        });
    }
    for r in reports.iter_mut() {
        crate::scenario::note_settle(plan, r);
    }
    out
}

fn announce(plan: &Plan, label: &str, step: &str) {
    if plan.run.progress {
        eprintln!("-- {label}: {step}");
    }
}

/// Everything a `versus` run wrote: what `--json` saves and `--report` draws.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VersusReport {
    /// The generator settings both sides shared, as one line.
    pub shared: String,
    /// Durability as the user stated it (`--durability-note`), verbatim.
    pub durability_note: Option<String>,
    /// Durability as each endpoint reported it, or `unknown (why)`.
    pub durability: [String; 2],
    /// Rows, ratios and execution order.
    pub outcome: VersusOutcome,
    /// The full per-side runs (per-second data, every probe).
    pub runs: [RunReport; 2],
    /// Share of late or unsent requests above which a step is flagged.
    pub max_lag: f64,
}

/// Column headers of the versus table.
pub const VERSUS_HEADERS: [&str; 12] = [
    "workload",
    "endpoint",
    "C req/s",
    "p50@C ms",
    "p99@C ms",
    "p999@C ms",
    "common req/s",
    "goodput/s",
    "p99@common ms",
    "errors",
    "timeouts",
    "gen lag",
];

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn times(x: Option<f64>, bound: &str) -> String {
    match x {
        // Both capacities are lower bounds: their ratio says nothing.
        Some(_) if bound == "?" => "? (both C >=)".into(),
        Some(v) => format!("{bound}{v:.2}x"),
        None => "-".into(),
    }
}

/// The generator-lag cell: the worst lag of the reported steps, `LAG` when it exceeds
/// `max_lag`, and `search LAG` when the generator ended the capacity search (C is a bound).
fn lag_cell(lag: f64, max_lag: f64, search_limited: bool) -> String {
    let mut s = format!("{:.1}%", lag * 100.0);
    if lag > max_lag {
        s.push_str(" LAG");
    }
    if search_limited {
        s.push_str(", search LAG");
    }
    s
}

impl VersusReport {
    /// The table: two rows per workload, then the ratio endpoint 0 / endpoint 1.
    pub fn table_rows(&self) -> Vec<Vec<String>> {
        let dash = || "-".to_string();
        let mut rows = Vec::new();
        for (i, ratio) in self.outcome.ratios.iter().enumerate() {
            for r in self.outcome.rows.iter().skip(2 * i).take(2) {
                let c = |f: fn(&StepFigures) -> String| r.at_capacity.as_ref().map_or_else(dash, f);
                let m = |f: fn(&StepFigures) -> String| r.common.as_ref().map_or_else(dash, f);
                let lag = r.lag_fraction();
                rows.push(vec![
                    r.workload.clone(),
                    r.endpoint.clone(),
                    match (r.capacity, r.capacity_lower_bound) {
                        (Some(c), true) => format!(">={c:.0}"),
                        (Some(c), false) => format!("{c:.0}"),
                        (None, _) => dash(),
                    },
                    c(|f| ms(f.latency.p50_us)),
                    c(|f| ms(f.latency.p99_us)),
                    c(|f| ms(f.latency.p999_us)),
                    ratio.common_rate.map_or_else(dash, |x| format!("{x:.0}")),
                    m(|f| format!("{:.0}", f.goodput_rate)),
                    m(|f| ms(f.latency.p99_us)),
                    m(|f| f.errors.to_string()),
                    m(|f| f.timeouts.to_string()),
                    lag_cell(lag, self.max_lag, r.capacity_lower_bound),
                ]);
            }
            let blank = String::new;
            rows.push(vec![
                ratio.workload.clone(),
                format!("{} / {}", self.runs[0].label, self.runs[1].label),
                times(ratio.capacity, &ratio.capacity_bound),
                blank(),
                blank(),
                blank(),
                blank(),
                blank(),
                times(ratio.p99_common, ""),
                blank(),
                blank(),
                blank(),
            ]);
        }
        rows
    }

    /// The header lines: endpoints, shared settings, durability stated and reported.
    pub fn header(&self) -> String {
        let [a, b] = &self.runs;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "== versus: {} ({}) vs {} ({}) ==",
            a.label, a.target, b.label, b.target
        );
        let _ = writeln!(o, "same generator for both: {}", self.shared);
        let _ = writeln!(
            o,
            "durability (stated): {}",
            self.durability_note
                .as_deref()
                .unwrap_or("not stated (pass --durability-note)")
        );
        for (r, d) in self.runs.iter().zip(&self.durability) {
            let _ = writeln!(o, "durability reported by {}: {d}", r.label);
        }
        if self.durability_differs() {
            let _ = writeln!(
                o,
                "WARNING: the endpoints report different durability settings"
            );
        }
        o
    }

    /// Both endpoints reported their settings, and a setting both report differs (one side
    /// may report more names, e.g. Cassandra's `*_in_ms` aliases).
    pub fn durability_differs(&self) -> bool {
        let known = |d: &str| !d.starts_with("unknown");
        let pairs = |d: &str| -> Vec<(String, String)> {
            d.split(", ")
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let [x, y] = &self.durability;
        if !known(x) || !known(y) {
            return false;
        }
        let theirs = pairs(y);
        pairs(x)
            .iter()
            .any(|(k, v)| theirs.iter().any(|(k2, v2)| k == k2 && v != v2))
    }

    /// Header, table, and both sides' notes as text.
    pub fn text(&self) -> String {
        let mut o = self.header();
        o.push_str(&aligned(&VERSUS_HEADERS, &self.table_rows(), 2));
        for r in &self.runs {
            for n in &r.notes {
                let _ = writeln!(o, "note ({}): {n}", r.label);
            }
        }
        o
    }

    /// One self-contained HTML page: the versus table, then both runs side by side.
    pub fn html(&self) -> String {
        let mut body = String::new();
        for line in self.header().lines().skip(1) {
            let _ = write!(body, "<p>{}</p>", esc(line));
        }
        body.push_str(&html_table(&VERSUS_HEADERS, &self.table_rows()));
        body.push_str(&html_compare_body(&self.runs[0], &self.runs[1]));
        let [a, b] = &self.runs;
        html_page(
            &format!("sluice bench versus: {} vs {}", a.label, b.label),
            &body,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeConfig, FakeServer};
    use crate::runner::RunConfig;
    use crate::schedule::Arrival;
    use std::time::Duration;

    fn plan() -> Plan {
        Plan {
            run: RunConfig {
                arrival: Arrival::Constant,
                deadline: Duration::from_millis(100),
                client_timeout: Duration::from_millis(100),
                lag_tolerance: Duration::from_millis(2),
                max_in_flight: 100_000,
                seed: 3,
                progress: false,
            },
            step: Duration::from_secs(2),
            probe_step: Duration::from_secs(2),
            // Long enough for a fake's backlog from a failed probe (at most 1 s) to drain.
            cooldown: Duration::from_secs(2),
            slo: Duration::from_millis(20),
            start_rate: 200.0,
            partitions: 100,
            max_lag: 0.01,
            settle: None,
            confirm_failures: false,
        }
    }

    fn reports() -> [RunReport; 2] {
        let r = |label: &str| RunReport {
            label: label.into(),
            scenario: "versus".into(),
            target: format!("{label}:9042"),
            classes: vec!["requests".into()],
            ..Default::default()
        };
        [r("sluice"), r("cassandra")]
    }

    /// Write then read, the common step at 0.8 x the lower C, no warm-up.
    fn write_then_read() -> VersusPlan {
        VersusPlan {
            workloads: vec![Workload::Write, Workload::Read],
            common_fraction: 0.8,
            common_rate: None,
            warm_up: None,
            pause_pids: [None, None],
        }
    }

    fn fake(service_ms: u64) -> Arc<FakeServer> {
        Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(service_ms),
            ..Default::default()
        }))
    }

    /// A server slower than the SLO at any rate, which sheds what would wait over 10 ms (so that
    /// its backlog stays bounded and later steps still see successes).
    fn hopeless() -> Arc<FakeServer> {
        Arc::new(FakeServer::new(FakeConfig {
            service: Duration::from_millis(30),
            max_queue_delay: Some(Duration::from_millis(10)),
            ..Default::default()
        }))
    }

    fn report(outcome: VersusOutcome, runs: [RunReport; 2], note: Option<&str>) -> VersusReport {
        VersusReport {
            shared: "constant arrivals".into(),
            durability_note: note.map(str::to_string),
            durability: [
                "unknown (system_views.settings: keyspace does not exist)".into(),
                "commitlog_sync=periodic, commitlog_sync_period=10000ms".into(),
            ],
            outcome,
            runs,
            max_lag: 0.01,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn two_fakes_give_the_true_capacity_ratio_and_equal_load_latency() {
        // Single-server queues: 1 ms service saturates at 1000/s, 2 ms at 500/s (true ratio 2).
        let (a, b) = (fake(1), fake(2));
        let mut runs = reports();
        let p = plan();
        let vp = VersusPlan {
            workloads: vec![Workload::Write],
            common_fraction: 0.8,
            common_rate: None,
            warm_up: None,
            pause_pids: [None, None],
        };
        let out = run([&a, &b], &mut runs, &p, &vp).await;
        assert_eq!(out.rows.len(), 2);
        let (ca, cb) = (
            out.rows[0].capacity.expect("C of a"),
            out.rows[1].capacity.expect("C of b"),
        );
        assert!((850.0..=1000.0).contains(&ca), "C a = {ca}");
        assert!((425.0..=500.0).contains(&cb), "C b = {cb}");
        let ratio = out.ratios[0].capacity.expect("ratio");
        assert!((1.8..=2.2).contains(&ratio), "ratio {ratio}");
        assert_eq!(out.ratios[0].capacity_bound, "");
        // The common step runs both at 0.8 x the lower C, where neither queues: p99 is the
        // service time, 1 ms against 2 ms, plus up to 1 ms of timer rounding (tokio timers
        // round up to whole milliseconds and this rate's gaps are not whole milliseconds).
        let common = out.ratios[0].common_rate.expect("common rate");
        assert!((common - cb * 0.8).abs() < 1e-9, "common {common}");
        let (fa, fb) = (
            out.rows[0].common.expect("a common"),
            out.rows[1].common.expect("b common"),
        );
        assert!(
            (1000..=2000).contains(&fa.latency.p99_us),
            "{:?}",
            fa.latency
        );
        assert!(
            (2000..=3000).contains(&fb.latency.p99_us),
            "{:?}",
            fb.latency
        );
        let p99 = out.ratios[0].p99_common.expect("p99 ratio");
        assert!((0.33..=1.0).contains(&p99), "p99 ratio {p99}");
        assert_eq!(
            (fa.errors, fa.timeouts, fb.errors, fb.timeouts),
            (0, 0, 0, 0)
        );
        // Both sides were offered the same rate for the same time.
        assert_eq!(fa.offered_rate, fb.offered_rate);
        // The figures at C come from the probe at exactly C.
        let at_c = out.rows[0].at_capacity.expect("a at C");
        assert!(
            (at_c.offered_rate - ca).abs() <= 1.0,
            "{} vs {ca}",
            at_c.offered_rate
        );
        assert!(runs[0].steps.iter().all(|s| s.label.starts_with("write ")));
    }

    #[tokio::test(start_paused = true)]
    async fn the_warm_up_runs_on_both_sides_before_each_search_and_is_not_a_probe() {
        let (a, b) = (fake(1), fake(2));
        let mut runs = reports();
        let vp = VersusPlan {
            warm_up: Some(WarmUp {
                duration: Duration::from_secs(1),
                rate: 100.0,
            }),
            ..write_then_read()
        };
        let out = run([&a, &b], &mut runs, &plan(), &vp).await;
        for (w, first) in [("write", 0), ("read", 1)] {
            let steps: Vec<&StepRef> = out
                .order
                .iter()
                .filter(|s| s.label.starts_with(&format!("{w} ")))
                .collect();
            let label = format!("{w} warm-up 100/s");
            // Both sides warm up, in the workload's turn order, before any probe.
            assert_eq!(
                steps[0],
                &StepRef {
                    side: first,
                    label: label.clone()
                }
            );
            assert_eq!(
                steps[1],
                &StepRef {
                    side: 1 - first,
                    label: label.clone()
                }
            );
            assert!(steps[2..].iter().all(|s| s.label != label));
            for r in &runs {
                let step = r.steps.iter().find(|s| s.label == label).expect("recorded");
                assert_eq!(step.classes[0].counts.offered, 100, "1 s at 100/s");
            }
        }
        // The searches are unchanged by it: C of a is still about 1000/s.
        let ca = out.rows[0].capacity.expect("C of a");
        assert!((850.0..=1000.0).contains(&ca), "C a = {ca}");
    }

    #[tokio::test(start_paused = true)]
    async fn probes_alternate_and_the_common_steps_run_in_abba_order() {
        let (a, b) = (fake(1), fake(4));
        let mut runs = reports();
        let vp = write_then_read();
        let out = run([&a, &b], &mut runs, &plan(), &vp).await;
        let per_workload: Vec<Vec<&StepRef>> = ["write", "read"]
            .iter()
            .map(|w| {
                out.order
                    .iter()
                    .filter(|s| s.label.starts_with(&format!("{w} ")))
                    .collect()
            })
            .collect();
        assert_eq!(
            per_workload[0].len() + per_workload[1].len(),
            out.order.len()
        );
        for (k, steps) in per_workload.iter().enumerate() {
            let first = k % 2;
            let (probes, common): (Vec<&&StepRef>, Vec<&&StepRef>) =
                steps.iter().partition(|s| s.label.contains(" capacity "));
            let n = [0, 1].map(|side| probes.iter().filter(|s| s.side == side).count());
            assert!(n[0] > 0 && n[1] > 0, "both searched: {n:?}");
            // While both searches run, sides alternate starting with `first`; the side with the
            // longer search then continues alone.
            let both = 2 * n[0].min(n[1]);
            for (i, s) in probes.iter().take(both).enumerate() {
                let want = if i % 2 == 0 { first } else { 1 - first };
                assert_eq!(s.side, want, "workload {k} probe {i}: {:?}", s.label);
            }
            let longer = if n[0] > n[1] { 0 } else { 1 };
            assert!(probes.iter().skip(both).all(|s| s.side == longer));
            // The slower server (side 1) has a lower C, so its search ends first.
            assert!(n[0] > n[1], "{n:?}");
            // The common steps come last, in the reverse order of the probes.
            let sides: Vec<usize> = common.iter().map(|s| s.side).collect();
            assert_eq!(sides, vec![1 - first, first], "workload {k}");
            assert_eq!(steps.last().map(|s| s.side), Some(first));
            assert!(steps[steps.len() - 2].label.contains(" common "));
        }
        // Each side's own report holds exactly its steps, in run order.
        for (side, run) in runs.iter().enumerate() {
            let mine: Vec<&str> = out
                .order
                .iter()
                .filter(|s| s.side == side)
                .map(|s| s.label.as_str())
                .collect();
            let theirs: Vec<&str> = run.steps.iter().map(|s| s.label.as_str()).collect();
            assert_eq!(mine, theirs);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_side_without_capacity_is_still_measured_at_the_other_sides_rate() {
        let (a, b) = (fake(1), hopeless());
        let mut runs = reports();
        let vp = VersusPlan {
            workloads: vec![Workload::Write],
            common_fraction: 0.5,
            common_rate: None,
            warm_up: None,
            pause_pids: [None, None],
        };
        let out = run([&a, &b], &mut runs, &plan(), &vp).await;
        assert!(out.rows[1].capacity.is_none());
        assert!(out.rows[1].at_capacity.is_none());
        let ca = out.rows[0].capacity.expect("C of a");
        assert_eq!(out.ratios[0].common_rate, Some(ca * 0.5));
        assert!(out.ratios[0].capacity.is_none());
        // Far above its 33/s service rate, side 1 sheds most requests and serves the rest in
        // 30-40 ms, against 1 ms on side 0.
        let p99 = out.ratios[0].p99_common.expect("p99 ratio");
        assert!(p99 < 0.05, "p99 ratio {p99}");
        assert!(out.rows[1].common.expect("b common").errors > 100);
        assert!(runs[1].notes.iter().any(|n| n.contains("missed the SLO")));
        let text = report(out, runs, None).text();
        assert!(text.contains("not stated (pass --durability-note)"));
    }

    #[tokio::test(start_paused = true)]
    async fn table_lists_both_endpoints_the_ratio_and_durability() {
        let (a, b) = (fake(1), fake(2));
        let mut runs = reports();
        let vp = VersusPlan {
            workloads: vec![Workload::Write],
            common_fraction: 0.8,
            // A 4 ms gap: whole milliseconds, so latencies are exactly the service times.
            common_rate: Some(250.0),
            warm_up: None,
            pause_pids: [None, None],
        };
        let out = run([&a, &b], &mut runs, &plan(), &vp).await;
        let note = "both periodic, fsync every 10 s";
        let v = report(out, runs, Some(note));
        let rows = v.table_rows();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0][1], "sluice");
        assert_eq!(rows[1][1], "cassandra");
        assert_eq!(rows[2][1], "sluice / cassandra");
        assert_eq!(rows[0][6], "250");
        assert_eq!(rows[0][8], "1.00");
        assert_eq!(rows[1][8], "2.00");
        assert_eq!(rows[2][8], "0.50x");
        assert!(rows[2][2].ends_with('x') && rows[2][2] != "-");
        let text = v.text();
        assert!(text.contains(&format!("durability (stated): {note}\n")));
        assert!(text.contains("durability reported by sluice: unknown ("));
        assert!(text.contains(
            "durability reported by cassandra: commitlog_sync=periodic, commitlog_sync_period=10000ms"
        ));
        assert!(!text.contains("WARNING"));
        assert!(text
            .lines()
            .any(|l| l.starts_with("workload") && l.contains("p99@common ms")));
        let html = v.html();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<th>p99@common ms</th>") && html.contains("<td>0.50x</td>"));
        assert!(html.contains(&esc(note)));
        assert_eq!(html.matches("<svg").count(), 6, "both runs' charts");
        let back: VersusReport =
            serde_json::from_str(&serde_json::to_string(&v).expect("json")).expect("parse");
        assert_eq!(back.table_rows(), rows);
    }

    #[test]
    fn lag_and_bounded_ratio_cells_say_what_the_generator_did() {
        assert_eq!(lag_cell(0.002, 0.01, false), "0.2%");
        assert_eq!(lag_cell(0.05, 0.01, false), "5.0% LAG");
        assert_eq!(lag_cell(0.0, 0.01, true), "0.0%, search LAG");
        assert_eq!(times(Some(1.5), ""), "1.50x");
        assert_eq!(times(Some(1.5), ">="), ">=1.50x");
        assert_eq!(times(Some(1.5), "?"), "? (both C >=)");
        assert_eq!(times(None, ""), "-");
    }

    #[test]
    fn different_reported_durability_is_flagged() {
        let mut v = report(VersusOutcome::default(), reports(), None);
        assert!(!v.durability_differs(), "one side unknown");
        v.durability[0] = "commitlog_sync=batch".into();
        assert!(v.durability_differs());
        assert!(v
            .header()
            .contains("WARNING: the endpoints report different durability"));
        v.durability[0] = v.durability[1].clone();
        assert!(!v.durability_differs());
        // Names only one side reports do not count; a shared name with another value does.
        v.durability[0] = "commitlog_sync=periodic, commitlog_sync_period=10000ms".into();
        v.durability[1] = "commitlog_sync=periodic, commitlog_sync_period=10000ms, \
                           commitlog_sync_period_in_ms=10000"
            .into();
        assert!(!v.durability_differs());
        v.durability[1] = "commitlog_sync=periodic, commitlog_sync_period=2000ms".into();
        assert!(v.durability_differs());
    }
}
