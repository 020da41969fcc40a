//! Waiting for a quiet machine before a step.
//!
//! When two servers share the cores of one machine (as in `versus`), the work one of them
//! does after its step (a memtable flush, a compaction, garbage collection, JIT compilation)
//! runs into the other's next probe and costs it CPU it would otherwise have. Waiting until
//! the machine's CPUs are nearly idle before each step gives every probe the same start: no
//! leftover work from the step before, whichever endpoint ran it.

use std::time::{Duration, Instant};

/// How long to wait for a quiet machine, and what counts as quiet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settle {
    /// The longest wait before a step starts anyway.
    pub max_wait: Duration,
    /// Quiet: fewer busy CPUs than this, on average over one sample window.
    pub busy_cpus_below: f64,
    /// Length of one sample window; two quiet windows in a row end the wait.
    pub window: Duration,
}

impl Settle {
    /// Waits of at most `max_wait` for two 200 ms windows with less than 0.2 CPUs busy.
    pub fn up_to(max_wait: Duration) -> Settle {
        Settle {
            max_wait,
            busy_cpus_below: 0.2,
            window: Duration::from_millis(200),
        }
    }
}

/// What one wait found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settled {
    /// How long it waited.
    pub waited: Duration,
    /// False if the machine was still busy at `max_wait` (or its CPU use cannot be read).
    pub quiet: bool,
}

/// CPU time counters of the whole machine (the `cpu` line of `/proc/stat`, in ticks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks spent running anything (user, nice, system, irq, softirq, steal).
    pub busy: u64,
    /// Ticks of every kind, idle and iowait included.
    pub total: u64,
    /// Number of CPUs (`cpuN` lines).
    pub cpus: u32,
}

impl CpuTimes {
    /// Parses the text of `/proc/stat`; `None` if it has no aggregate `cpu` line.
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let mut times = None;
        let mut cpus = 0;
        for line in stat.lines() {
            let mut fields = line.split_ascii_whitespace();
            match fields.next() {
                Some("cpu") => {
                    let v: Vec<u64> = fields.filter_map(|f| f.parse().ok()).collect();
                    // user nice system idle iowait irq softirq steal (guest is inside user).
                    let at = |i: usize| v.get(i).copied().unwrap_or(0);
                    let idle = at(3) + at(4);
                    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
                    times = Some((busy, busy + idle));
                }
                Some(name) if name.starts_with("cpu") => cpus += 1,
                _ => {}
            }
        }
        let (busy, total) = times?;
        Some(CpuTimes {
            busy,
            total,
            cpus: cpus.max(1),
        })
    }

    /// Reads the machine's counters (Linux only).
    pub fn read() -> Option<CpuTimes> {
        Self::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// Average number of busy CPUs between `earlier` and `self`.
    pub fn busy_cpus_since(&self, earlier: &CpuTimes) -> f64 {
        let total = self.total.saturating_sub(earlier.total);
        if total == 0 {
            return 0.0;
        }
        let busy = self.busy.saturating_sub(earlier.busy);
        busy as f64 / total as f64 * f64::from(self.cpus)
    }
}

/// Waits until the machine has been quiet for two sample windows in a row, or `max_wait`.
pub async fn settle(s: &Settle) -> Settled {
    let start = Instant::now();
    let Some(mut before) = CpuTimes::read() else {
        return Settled {
            waited: Duration::ZERO,
            quiet: false,
        };
    };
    let mut quiet_windows = 0;
    while start.elapsed() < s.max_wait {
        tokio::time::sleep(s.window).await;
        let Some(now) = CpuTimes::read() else { break };
        if now.busy_cpus_since(&before) < s.busy_cpus_below {
            quiet_windows += 1;
            if quiet_windows == 2 {
                return Settled {
                    waited: start.elapsed(),
                    quiet: true,
                };
            }
        } else {
            quiet_windows = 0;
        }
        before = now;
    }
    Settled {
        waited: start.elapsed(),
        quiet: false,
    }
}

/// Totals of the waits of a run, for its notes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SettleTally {
    /// Steps that waited.
    pub steps: u32,
    /// Of those, steps that started with the machine still busy.
    pub still_busy: u32,
    /// The waits added up.
    pub total: Duration,
    /// The longest wait.
    pub longest: Duration,
}

impl SettleTally {
    /// Counts one wait.
    pub fn add(&mut self, w: Settled) {
        self.steps += 1;
        self.still_busy += u32::from(!w.quiet);
        self.total += w.waited;
        self.longest = self.longest.max(w.waited);
    }

    /// One line for the report's notes.
    pub fn note(&self, s: &Settle) -> String {
        format!(
            "settle: before each of {} steps the generator waited for under {} busy CPUs \
             over two {} ms windows (up to {} s): {:.1} s in all, longest {:.1} s; \
             {} step(s) started with the machine still busy",
            self.steps,
            s.busy_cpus_below,
            s.window.as_millis(),
            s.max_wait.as_secs_f64(),
            self.total.as_secs_f64(),
            self.longest.as_secs_f64(),
            self.still_busy
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT_A: &str = "cpu  100 5 50 1000 20 3 2 0 0 0\n\
                          cpu0 50 2 25 500 10 1 1 0 0 0\n\
                          cpu1 50 3 25 500 10 2 1 0 0 0\n\
                          intr 12345\nctxt 999\n";
    // 30 busy ticks (20 user, 10 system) of 200 over the window, on 2 CPUs: 0.3 busy CPUs.
    const STAT_B: &str = "cpu  120 5 60 1160 30 3 2 0 0 0\n\
                          cpu0 60 2 30 580 15 1 1 0 0 0\n\
                          cpu1 60 3 30 580 15 2 1 0 0 0\n";

    #[test]
    fn parses_the_aggregate_line_and_counts_cpus() {
        let a = CpuTimes::parse(STAT_A).unwrap();
        assert_eq!(
            a,
            CpuTimes {
                busy: 160,
                total: 1180,
                cpus: 2
            }
        );
        assert_eq!(CpuTimes::parse("intr 1\n"), None);
    }

    #[test]
    fn busy_cpus_is_the_busy_share_times_the_cpu_count() {
        let a = CpuTimes::parse(STAT_A).unwrap();
        let b = CpuTimes::parse(STAT_B).unwrap();
        let busy = b.busy_cpus_since(&a);
        assert!((busy - 0.3).abs() < 1e-9, "{busy}");
        assert_eq!(a.busy_cpus_since(&a), 0.0, "no time passed");
    }

    #[test]
    fn a_wait_never_outlasts_its_bound() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        // Nothing counts as quiet below zero busy CPUs: the wait runs to its bound.
        let s = Settle {
            max_wait: Duration::from_millis(150),
            busy_cpus_below: 0.0,
            window: Duration::from_millis(50),
        };
        let w = rt.block_on(settle(&s));
        assert!(!w.quiet);
        assert!(
            w.waited >= s.max_wait && w.waited < Duration::from_secs(2),
            "{w:?}"
        );
        let mut tally = SettleTally::default();
        tally.add(w);
        tally.add(Settled {
            waited: Duration::from_millis(400),
            quiet: true,
        });
        assert_eq!((tally.steps, tally.still_busy), (2, 1));
        assert_eq!(tally.longest, Duration::from_millis(400));
    }
}
