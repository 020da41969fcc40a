//! Run results: the JSON model, the summary table, and a self-contained HTML report with inline
//! SVG charts (no scripts, no external references).

use crate::runner::StepRun;
use crate::stats::{Counts, Percentiles, SecondRow};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Generator settings recorded with every run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Settings {
    /// Arrival process.
    pub arrival: String,
    /// Goodput deadline, ms.
    pub deadline_ms: f64,
    /// Client timeout, ms.
    pub client_timeout_ms: f64,
    /// Lag tolerance, ms.
    pub lag_tolerance_ms: f64,
    /// Connections per host.
    pub connections: usize,
    /// Threads of the generator's runtime (0 in runs recorded before it was recorded).
    #[serde(default)]
    pub generator_threads: usize,
    /// Retry policy name.
    pub retry_policy: String,
    /// Seconds per step.
    pub step_secs: f64,
}

/// One traffic class over one step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClassSummary {
    /// Class name.
    pub name: String,
    /// Offered requests per second.
    pub offered_rate: f64,
    /// Goodput, requests per second.
    pub goodput_rate: f64,
    /// Counts.
    pub counts: Counts,
    /// Latency of successes.
    pub latency: Percentiles,
}

/// One step of a scenario.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepSummary {
    /// Step label, e.g. `write 2xC`.
    pub label: String,
    /// Offered load as a multiple of capacity, when the scenario uses one.
    pub multiple: Option<f64>,
    /// First run second of the step.
    pub start_s: u64,
    /// Scheduled duration in seconds.
    pub duration_s: f64,
    /// Per class.
    pub classes: Vec<ClassSummary>,
    /// Goodput of class 0 as a fraction of the same workload's goodput at 1xC.
    pub goodput_vs_c: Option<f64>,
    /// Server arrivals per logical request sent (retry amplification).
    pub arrivals_per_request: Option<f64>,
    /// The generator's delay from intended send time to socket write, if measured.
    #[serde(default)]
    pub send_delay: Option<crate::runner::SendDelay>,
}

impl StepSummary {
    /// Share of offered requests that went out late or not at all.
    pub fn lag_fraction(&self) -> f64 {
        let (mut lag, mut off) = (0u64, 0u64);
        for c in &self.classes {
            lag += c.counts.lagged + c.counts.unsent;
            off += c.counts.offered;
        }
        if off == 0 {
            0.0
        } else {
            lag as f64 / off as f64
        }
    }
}

/// Everything a run measured; this is what `--json` writes and `--compare` reads.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunReport {
    /// Human label (e.g. `sluice` or `cassandra`).
    pub label: String,
    /// Scenario name.
    pub scenario: String,
    /// Contact points, or `in-process`.
    pub target: String,
    /// Start time, seconds since the Unix epoch.
    pub started_unix: u64,
    /// Generator settings.
    pub settings: Settings,
    /// Traffic class names, in the order used by every row.
    pub classes: Vec<String>,
    /// Capacity C used for multiples, requests/s.
    pub capacity: Option<f64>,
    /// Things worth knowing (unsupported features, generator lag).
    pub notes: Vec<String>,
    /// Per step.
    pub steps: Vec<StepSummary>,
    /// Per second.
    pub seconds: Vec<SecondRow>,
    /// Full latency histogram per step and class, `(step label, class name, histogram)`;
    /// written as `.hgrm` files, not part of the JSON.
    #[serde(skip)]
    pub histograms: Vec<(String, String, Histogram<u64>)>,
    /// The waits for a quiet machine before its steps (see [`crate::settle`]).
    #[serde(skip)]
    pub settle: crate::settle::SettleTally,
}

impl RunReport {
    /// The next free run second (where the next step starts).
    pub fn next_second(&self) -> u64 {
        self.seconds.last().map(|r| r.t + 1).unwrap_or(0)
    }

    /// Appends a step; `rates` are the offered rates per class.
    pub fn push_step(
        &mut self,
        label: &str,
        multiple: Option<f64>,
        duration_s: f64,
        run: StepRun,
    ) -> &StepSummary {
        let start_s = self.next_second();
        let classes: Vec<ClassSummary> = run
            .totals
            .iter()
            .enumerate()
            .map(|(i, t)| ClassSummary {
                name: self.classes.get(i).cloned().unwrap_or_default(),
                offered_rate: t.counts.offered as f64 / duration_s.max(1e-9),
                goodput_rate: t.counts.ok as f64 / duration_s.max(1e-9),
                counts: t.counts,
                latency: Percentiles::of(&t.hist),
            })
            .collect();
        let sent: u64 = classes.iter().map(|c| c.counts.sent).sum();
        let arrivals_per_request = run
            .attempts
            .filter(|_| sent > 0)
            .map(|a| a as f64 / sent as f64);
        let step = StepSummary {
            label: label.to_string(),
            multiple,
            start_s,
            duration_s,
            classes,
            goodput_vs_c: None,
            arrivals_per_request,
            send_delay: run.send_delay,
        };
        if step.lag_fraction() > 0.01 {
            self.notes.push(format!(
                "generator could not keep up in step '{label}': {:.1}% of requests went out late or not at all; that step measures the generator, not the server",
                step.lag_fraction() * 100.0
            ));
        }
        self.seconds.extend(run.seconds);
        for (c, t) in step.classes.iter().zip(run.totals) {
            self.histograms
                .push((step.label.clone(), c.name.clone(), t.hist));
        }
        self.steps.push(step);
        self.steps.last().expect("just pushed")
    }

    /// Fills `goodput_vs_c`: each step's goodput over that of the step with the same label
    /// prefix (the workload) at multiple 1.
    pub fn fill_goodput_vs_c(&mut self) {
        let base: Vec<(String, f64)> = self
            .steps
            .iter()
            .filter(|s| s.multiple == Some(1.0))
            .filter_map(|s| Some((workload_of(&s.label), s.classes.first()?.goodput_rate)))
            .collect();
        for s in &mut self.steps {
            let w = workload_of(&s.label);
            if let (Some((_, g1)), Some(c)) =
                (base.iter().find(|(b, _)| *b == w), s.classes.first())
            {
                if *g1 > 0.0 {
                    s.goodput_vs_c = Some(c.goodput_rate / g1);
                }
            }
        }
    }
}

fn workload_of(label: &str) -> String {
    label.split_whitespace().next().unwrap_or("").to_string()
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// Column headers of the summary table.
pub const TABLE_HEADERS: [&str; 18] = [
    "step",
    "class",
    "offered/s",
    "goodput/s",
    "vs 1xC",
    "late",
    "rate-lim",
    "overload",
    "srv-t/o",
    "cli-t/o",
    "other",
    "lag %",
    "p50 ms",
    "p99 ms",
    "p999 ms",
    "arrivals/req",
    "send p99 ms",
    "send >1ms %",
];

/// The summary table: one row per step and class.
pub fn table_rows(r: &RunReport) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    for s in &r.steps {
        for (i, c) in s.classes.iter().enumerate() {
            let k = &c.counts;
            let lag = if k.offered == 0 {
                0.0
            } else {
                (k.lagged + k.unsent) as f64 * 100.0 / k.offered as f64
            };
            rows.push(vec![
                s.label.clone(),
                c.name.clone(),
                format!("{:.0}", c.offered_rate),
                format!("{:.0}", c.goodput_rate),
                match (i, s.goodput_vs_c) {
                    (0, Some(v)) => format!("{:.2}", v),
                    _ => "-".into(),
                },
                k.late.to_string(),
                k.rate_limited.to_string(),
                k.overloaded.to_string(),
                k.server_timeout.to_string(),
                k.client_timeout.to_string(),
                k.other.to_string(),
                format!("{lag:.1}"),
                ms(c.latency.p50_us),
                ms(c.latency.p99_us),
                ms(c.latency.p999_us),
                s.arrivals_per_request
                    .filter(|_| i == 0)
                    .map(|a| format!("{a:.2}"))
                    .unwrap_or_else(|| "-".into()),
                s.send_delay
                    .filter(|_| i == 0)
                    .map(|d| ms(d.p99_us))
                    .unwrap_or_else(|| "-".into()),
                s.send_delay
                    .filter(|_| i == 0)
                    .map(|d| format!("{:.1}", d.over_1ms * 100.0))
                    .unwrap_or_else(|| "-".into()),
            ]);
        }
    }
    rows
}

/// The summary table as aligned text.
pub fn text_table(r: &RunReport) -> String {
    aligned(&TABLE_HEADERS, &table_rows(r), 2)
}

/// Rows under headers as aligned text: the first `left` columns left-aligned, the rest right.
pub fn aligned(headers: &[&str], rows: &[Vec<String>], left: usize) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, cells: &[String]| {
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i < left {
                let _ = write!(out, "{c:<w$}  ");
            } else {
                let _ = write!(out, "{c:>w$}  ");
            }
        }
        out.truncate(out.trim_end().len());
        out.push('\n');
    };
    let headers: Vec<String> = headers.iter().map(|s| s.to_string()).collect();
    line(&mut out, &headers);
    for row in rows {
        line(&mut out, row);
    }
    out
}

/// A table as HTML (cells escaped); the first two columns are left-aligned by the page style.
pub fn html_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut o = String::from("<table><tr>");
    for h in headers {
        let _ = write!(o, "<th>{}</th>", esc(h));
    }
    o.push_str("</tr>");
    for row in rows {
        o.push_str("<tr>");
        for c in row {
            let _ = write!(o, "<td>{}</td>", esc(c));
        }
        o.push_str("</tr>");
    }
    o.push_str("</table>");
    o
}

/// A latency histogram (microseconds) in HdrHistogram's percentile-distribution text format,
/// values in milliseconds, as `HistogramLogProcessor` and the online plotters read it.
pub fn hgrm(h: &Histogram<u64>) -> String {
    let mut o = String::from("       Value     Percentile TotalCount 1/(1-Percentile)\n\n");
    let mut total = 0u64;
    for v in h.iter_quantiles(5) {
        total += v.count_since_last_iteration();
        let q = v.quantile_iterated_to();
        let value = v.value_iterated_to() as f64 / 1000.0;
        if q < 1.0 {
            let _ = writeln!(
                o,
                "{value:12.3} {q:14.12} {total:10} {:14.2}",
                1.0 / (1.0 - q)
            );
        } else {
            let _ = writeln!(o, "{value:12.3} {q:14.12} {total:10}");
        }
    }
    let _ = writeln!(
        o,
        "#[Mean    = {:12.3}, StdDeviation   = {:12.3}]",
        h.mean() / 1000.0,
        h.stdev() / 1000.0
    );
    let _ = writeln!(
        o,
        "#[Max     = {:12.3}, Total count    = {:12}]",
        h.max() as f64 / 1000.0,
        h.len()
    );
    let _ = writeln!(
        o,
        "#[Buckets = {:12}, SubBuckets     = {:12}]",
        h.buckets(),
        h.distinct_values()
    );
    o
}

/// A file name made of the safe characters of `s`.
pub fn file_stem(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Escapes text for HTML and SVG.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Compact number for axis labels: 950, 1.5k, 2M.
fn si(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = if x.fract().abs() < 1e-9 {
        format!("{x:.0}")
    } else if x.abs() < 10.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.1}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}{suffix}")
}

/// A line on a chart.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Stroke colour.
    pub color: &'static str,
    /// Dashed stroke.
    pub dashed: bool,
    /// (x, y) points; non-finite y or (on log charts) y <= 0 breaks the line.
    pub points: Vec<(f64, f64)>,
}

/// Chart options.
pub struct ChartSpec<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// Logarithmic y axis.
    pub log_y: bool,
    /// Shared upper bound of the y axis (for side-by-side charts).
    pub y_max: Option<f64>,
    /// Shared upper bound of the x axis.
    pub x_max: Option<f64>,
    /// Vertical markers at step starts: (x, label).
    pub marks: &'a [(f64, String)],
}

const W: f64 = 640.0;
const H: f64 = 250.0;
const ML: f64 = 58.0;
const MR: f64 = 12.0;
const MT: f64 = 34.0;
const MB: f64 = 34.0;

fn nice_step(range: f64, ticks: f64) -> f64 {
    let raw = (range / ticks).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    let m = if n <= 1.0 {
        1.0
    } else if n <= 2.0 {
        2.0
    } else if n <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// Upper y bound a chart of these series would use.
pub fn data_y_max(series: &[Series]) -> f64 {
    series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .filter(|y| y.is_finite())
        .fold(0.0, f64::max)
}

/// Draws a line chart as an inline `<svg>` element (no namespace needed inside HTML).
pub fn line_chart(spec: &ChartSpec<'_>, series: &[Series]) -> String {
    let pw = W - ML - MR;
    let ph = H - MT - MB;
    let x_max = spec
        .x_max
        .unwrap_or_else(|| {
            series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.0))
                .fold(0.0, f64::max)
        })
        .max(1.0);
    let y_data = spec.y_max.unwrap_or_else(|| data_y_max(series));
    let (y_lo, y_hi, ticks): (f64, f64, Vec<f64>) = if spec.log_y {
        let min_pos = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .filter(|y| y.is_finite() && *y > 0.0)
            .fold(f64::INFINITY, f64::min);
        let lo = if min_pos.is_finite() {
            10f64.powf(min_pos.log10().floor())
        } else {
            0.1
        };
        let hi = 10f64.powf(y_data.max(lo * 10.0).log10().ceil());
        let mut t = Vec::new();
        let mut v = lo;
        while v <= hi * 1.0001 {
            t.push(v);
            v *= 10.0;
        }
        (lo, hi, t)
    } else {
        let step = nice_step(y_data.max(1.0), 5.0);
        let hi = (y_data.max(1.0) / step).ceil() * step;
        let t = (0..=((hi / step).round() as usize))
            .map(|i| i as f64 * step)
            .collect();
        (0.0, hi, t)
    };
    let sx = |x: f64| ML + x / x_max * pw;
    let sy = |y: f64| {
        let f = if spec.log_y {
            (y.log10() - y_lo.log10()) / (y_hi.log10() - y_lo.log10())
        } else {
            (y - y_lo) / (y_hi - y_lo)
        };
        MT + ph - f.clamp(0.0, 1.05) * ph
    };
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        o,
        r#"<text x="{ML}" y="14" font-size="13" font-weight="bold">{}</text>"#,
        esc(spec.title)
    );
    for t in &ticks {
        let y = sy(*t);
        let _ = write!(
            o,
            r##"<line x1="{ML}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ML + pw,
            ML - 4.0,
            y + 4.0,
            si(*t)
        );
    }
    let xstep = nice_step(x_max, 8.0).max(1.0);
    let mut x = 0.0;
    while x <= x_max + 1e-9 {
        let px = sx(x);
        let _ = write!(
            o,
            r##"<line x1="{px:.1}" x2="{px:.1}" y1="{}" y2="{}" stroke="#999"/><text x="{px:.1}" y="{}" text-anchor="middle">{}s</text>"##,
            MT + ph,
            MT + ph + 4.0,
            MT + ph + 16.0,
            si(x)
        );
        x += xstep;
    }
    let _ = write!(
        o,
        r##"<rect x="{ML}" y="{MT}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##
    );
    for (mx, label) in spec.marks {
        let px = sx(*mx);
        let _ = write!(
            o,
            r##"<line x1="{px:.1}" x2="{px:.1}" y1="{MT}" y2="{}" stroke="#bbb" stroke-dasharray="3,3"/><text x="{:.1}" y="{}" font-size="9" fill="#666">{}</text>"##,
            MT + ph,
            px + 2.0,
            MT + 9.0,
            esc(label)
        );
    }
    for s in series {
        let dash = if s.dashed {
            r#" stroke-dasharray="6,3""#
        } else {
            ""
        };
        let mut seg: Vec<String> = Vec::new();
        let flush = |seg: &mut Vec<String>, o: &mut String| {
            if seg.len() == 1 {
                let _ = write!(
                    o,
                    r#"<circle cx="{}" r="1.5" fill="{}"/>"#,
                    seg[0].replace(',', r#"" cy=""#),
                    s.color
                );
            } else if seg.len() > 1 {
                let _ = write!(
                    o,
                    r#"<polyline fill="none" stroke="{}" stroke-width="1.5"{dash} points="{}"/>"#,
                    s.color,
                    seg.join(" ")
                );
            }
            seg.clear();
        };
        for &(x, y) in &s.points {
            if !y.is_finite() || (spec.log_y && y <= 0.0) {
                flush(&mut seg, &mut o);
                continue;
            }
            seg.push(format!("{:.1},{:.1}", sx(x), sy(y)));
        }
        flush(&mut seg, &mut o);
    }
    // Legend along the bottom edge.
    let mut lx = ML;
    for s in series {
        let dash = if s.dashed {
            r#" stroke-dasharray="6,3""#
        } else {
            ""
        };
        let _ = write!(
            o,
            r#"<line x1="{lx}" x2="{}" y1="{}" y2="{}" stroke="{}" stroke-width="2"{dash}/><text x="{}" y="{}">{}</text>"#,
            lx + 14.0,
            H - 5.0,
            H - 5.0,
            s.color,
            lx + 17.0,
            H - 1.5,
            esc(&s.name)
        );
        lx += 24.0 + 6.2 * s.name.chars().count() as f64;
    }
    o.push_str("</svg>");
    o
}

const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Reads one count out of a row.
type CountFn = fn(&Counts) -> u64;
/// Reads one percentile out of a row.
type PctFn = fn(&Percentiles) -> u64;

/// The three chart families of one run, as (title, log scale, series).
pub fn chart_series(r: &RunReport) -> Vec<(String, bool, Vec<Series>)> {
    let pts = |f: &dyn Fn(&SecondRow) -> f64| -> Vec<(f64, f64)> {
        r.seconds.iter().map(|s| (s.t as f64, f(s))).collect()
    };
    let mut load = vec![Series {
        name: "offered".into(),
        color: "#777",
        dashed: true,
        points: pts(&|s| s.total().offered as f64),
    }];
    for (i, name) in r.classes.iter().enumerate() {
        load.push(Series {
            name: format!("goodput {name}"),
            color: PALETTE[i % PALETTE.len()],
            dashed: false,
            points: pts(&|s| s.classes.get(i).map_or(0.0, |c| c.counts.ok as f64)),
        });
    }
    let kinds: [(&str, CountFn); 7] = [
        ("late", |c| c.late),
        ("rate-limited", |c| c.rate_limited),
        ("overloaded", |c| c.overloaded),
        ("server timeout", |c| c.server_timeout),
        ("client timeout", |c| c.client_timeout),
        ("other", |c| c.other),
        ("generator lag", |c| c.lagged + c.unsent),
    ];
    let rej = kinds
        .iter()
        .enumerate()
        .map(|(i, (name, f))| Series {
            name: (*name).into(),
            color: PALETTE[(i + 1) % PALETTE.len()],
            dashed: *name == "generator lag",
            points: pts(&|s| f(&s.total()) as f64),
        })
        .collect();
    let mut lat = Vec::new();
    let pct: [(&str, PctFn); 3] = [
        ("p50", |p| p.p50_us),
        ("p99", |p| p.p99_us),
        ("p99.9", |p| p.p999_us),
    ];
    for (ci, cname) in r.classes.iter().enumerate().take(2) {
        for (pi, (pname, f)) in pct.iter().enumerate() {
            lat.push(Series {
                name: if r.classes.len() > 1 {
                    format!("{pname} {cname}")
                } else {
                    (*pname).to_string()
                },
                color: PALETTE[pi % PALETTE.len()],
                dashed: ci > 0,
                points: r
                    .seconds
                    .iter()
                    .map(|s| {
                        let us = s.classes.get(ci).map_or(0, |c| f(&c.latency));
                        (s.t as f64, us as f64 / 1000.0)
                    })
                    .collect(),
            });
        }
    }
    vec![
        ("Offered load and goodput (requests/s)".into(), false, load),
        (
            "Rejections, failures and generator lag (per second)".into(),
            false,
            rej,
        ),
        (
            "Latency of successes from intended send time (ms, log scale)".into(),
            true,
            lat,
        ),
    ]
}

fn marks(r: &RunReport) -> Vec<(f64, String)> {
    r.steps
        .iter()
        .map(|s| (s.start_s as f64, s.label.clone()))
        .collect()
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}th{background:#f2f2f2}.cols{display:flex;gap:24px;flex-wrap:wrap}.note{color:#a33}code{background:#f4f4f4}";

fn html_run_header(r: &RunReport) -> String {
    let mut o = String::new();
    let s = &r.settings;
    let _ = write!(
        o,
        "<h2>{} &mdash; {}</h2><p>target <code>{}</code>; arrivals {}; deadline {} ms; client timeout {} ms; {} connection(s)/host; generator threads {}; retry policy {}; {} s per step{}</p>",
        esc(&r.label),
        esc(&r.scenario),
        esc(&r.target),
        esc(&s.arrival),
        s.deadline_ms,
        s.client_timeout_ms,
        s.connections,
        s.generator_threads,
        esc(&s.retry_policy),
        s.step_secs,
        r.capacity
            .map(|c| format!("; capacity C = {c:.0} requests/s"))
            .unwrap_or_default()
    );
    for n in &r.notes {
        let _ = write!(o, "<p class=\"note\">{}</p>", esc(n));
    }
    o.push_str(&html_table(&TABLE_HEADERS, &table_rows(r)));
    o
}

/// A complete page around `body`, with the shared style and the method footnote.
pub(crate) fn html_page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body><h1>{}</h1>{body}<p><small>Open-loop load: latency is measured from each request's intended send time; goodput counts successes before the deadline.</small></p></body></html>\n",
        esc(title),
        esc(title)
    )
}

/// A self-contained HTML report of one run.
pub fn html_report(r: &RunReport) -> String {
    let mut body = html_run_header(r);
    let m = marks(r);
    for (title, log_y, series) in chart_series(r) {
        body.push_str("<div>");
        body.push_str(&line_chart(
            &ChartSpec {
                title: &title,
                log_y,
                y_max: None,
                x_max: None,
                marks: &m,
            },
            &series,
        ));
        body.push_str("</div>");
    }
    html_page(&format!("sluice bench: {}", r.scenario), &body)
}

/// Two runs side by side, each chart pair on a shared scale.
pub fn html_compare(a: &RunReport, b: &RunReport) -> String {
    html_page(
        &format!("sluice bench: {} vs {} ({})", a.label, b.label, a.scenario),
        &html_compare_body(a, b),
    )
}

/// The body of [`html_compare`]: both run headers, then each chart pair on a shared scale.
pub(crate) fn html_compare_body(a: &RunReport, b: &RunReport) -> String {
    let mut body = String::from("<div class=\"cols\">");
    for r in [a, b] {
        let _ = write!(body, "<div>{}</div>", html_run_header(r));
    }
    body.push_str("</div>");
    let (ca, cb) = (chart_series(a), chart_series(b));
    let (ma, mb) = (marks(a), marks(b));
    let x_max = (a.next_second().max(b.next_second())) as f64;
    for ((title, log_y, sa), (_, _, sb)) in ca.into_iter().zip(cb) {
        let y_max = data_y_max(&sa).max(data_y_max(&sb));
        body.push_str("<div class=\"cols\">");
        for (r, s, m) in [(a, &sa, &ma), (b, &sb, &mb)] {
            let t = format!("{}: {title}", r.label);
            body.push_str(&line_chart(
                &ChartSpec {
                    title: &t,
                    log_y,
                    y_max: Some(y_max),
                    x_max: Some(x_max),
                    marks: m,
                },
                s,
            ));
        }
        body.push_str("</div>");
    }
    body
}

/// The charts of one run stacked into a standalone SVG file (for docs).
pub fn standalone_svg(r: &RunReport) -> String {
    let m = marks(r);
    let charts = chart_series(r);
    let mut o = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{}" viewBox="0 0 {W} {}"><rect width="100%" height="100%" fill="white"/>"#,
        H * charts.len() as f64,
        H * charts.len() as f64
    );
    for (i, (title, log_y, series)) in charts.into_iter().enumerate() {
        let t = format!("{} / {}: {title}", r.label, r.scenario);
        let _ = write!(o, r#"<g transform="translate(0 {})">"#, H * i as f64);
        o.push_str(&line_chart(
            &ChartSpec {
                title: &t,
                log_y,
                y_max: None,
                x_max: None,
                marks: &m,
            },
            &series,
        ));
        o.push_str("</g>");
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::ClassSecond;

    fn sample() -> RunReport {
        let mut r = RunReport {
            label: "fake <a&b>".into(),
            scenario: "ramp".into(),
            target: "in-process".into(),
            classes: vec!["requests".into()],
            capacity: Some(1000.0),
            ..Default::default()
        };
        for t in 0..10u64 {
            let mut c = ClassSecond::default();
            c.counts.offered = 1000 + t * 100;
            c.counts.ok = 1000;
            c.counts.overloaded = t * 100;
            c.latency = Percentiles {
                p50_us: 900,
                p99_us: 2_000 + t * 10,
                p999_us: 5_000,
                max_us: 9_000,
            };
            r.seconds.push(SecondRow {
                t,
                classes: vec![c],
            });
        }
        r.steps.push(StepSummary {
            label: "ramp 1xC".into(),
            multiple: Some(1.0),
            start_s: 0,
            duration_s: 10.0,
            classes: vec![ClassSummary {
                name: "requests".into(),
                offered_rate: 1450.0,
                goodput_rate: 1000.0,
                counts: r.seconds[0].classes[0].counts,
                latency: r.seconds[0].classes[0].latency,
            }],
            goodput_vs_c: None,
            arrivals_per_request: Some(1.0),
            send_delay: None,
        });
        r
    }

    #[test]
    fn html_report_is_self_contained_with_charts() {
        let html = html_report(&sample());
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<svg").count(), 3, "three charts");
        assert!(html.contains("<polyline"), "charts have data lines");
        for needle in ["http://", "https://", "<script", "<link", "src="] {
            assert!(!html.contains(needle), "external reference {needle}");
        }
        assert!(html.contains("fake &lt;a&amp;b&gt;"), "labels are escaped");
        assert!(html.contains("goodput requests") && html.contains("overloaded"));
        assert!(html.contains("ramp 1xC"));
    }

    #[test]
    fn compare_report_shows_both_runs_on_shared_scales() {
        let a = sample();
        let mut b = sample();
        b.label = "other".into();
        for s in &mut b.seconds {
            s.classes[0].counts.offered *= 4;
        }
        let html = html_compare(&a, &b);
        assert_eq!(html.matches("<svg").count(), 6);
        assert!(html.contains("other: Offered load"));
        assert!(!html.contains("http://") && !html.contains("https://"));
        // Both load charts share the y axis of the larger run (4 x 1900 -> 8k top tick).
        assert_eq!(html.matches(">8k</text>").count(), 2);
    }

    #[test]
    fn json_round_trips_for_compare() {
        let r = sample();
        let back: RunReport =
            serde_json::from_str(&serde_json::to_string(&r).expect("serialize")).expect("parse");
        assert_eq!(back.seconds, r.seconds);
        assert_eq!(back.steps.len(), 1);
    }

    #[test]
    fn table_and_ratios() {
        let mut r = sample();
        let mut s2 = r.steps[0].clone();
        s2.label = "ramp 3xC".into();
        s2.multiple = Some(3.0);
        s2.classes[0].goodput_rate = 950.0;
        r.steps.push(s2);
        r.fill_goodput_vs_c();
        assert_eq!(r.steps[0].goodput_vs_c, Some(1.0));
        assert_eq!(r.steps[1].goodput_vs_c, Some(0.95));
        let t = text_table(&r);
        assert!(t.lines().count() == 3 && t.contains("0.95"));
        let svg = standalone_svg(&r);
        assert!(svg.starts_with("<svg xmlns="));
    }

    #[test]
    fn hgrm_lists_percentiles_in_milliseconds() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("histogram");
        for us in 1..=1000u64 {
            h.record(us * 10).expect("record");
        }
        let text = hgrm(&h);
        assert!(text.starts_with("       Value     Percentile"));
        let last = text
            .lines()
            .rfind(|l| !l.starts_with('#') && !l.trim().is_empty())
            .expect("rows");
        let cols: Vec<&str> = last.split_whitespace().collect();
        // The last row is the maximum, 10 ms (to the histogram's 3 digits), with every sample.
        let max: f64 = cols[0].parse().expect("number");
        assert!((max - 10.0).abs() < 0.02, "max {max}");
        assert_eq!(cols[2], "1000");
        assert!(text.contains("Total count    =         1000"));
        assert_eq!(file_stem("write 0.5xC/uniform"), "write_0.5xC_uniform");
    }

    #[test]
    fn si_labels() {
        assert_eq!(si(950.0), "950");
        assert_eq!(si(1500.0), "1.5k");
        assert_eq!(si(2_000_000.0), "2M");
        assert_eq!(si(0.25), "0.25");
    }
}
