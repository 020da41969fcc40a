//! Telling a connection's bounded backlog from overload that backpressure cannot stop.
//!
//! A closed-loop client (a driver with a window of requests in flight, a bulk loader) sends
//! about one request per answer: whatever it has waiting for the shard, in the kernel's
//! socket buffer and in the reader's buffer, stays at most its window, a backlog that
//! finishes well inside its requests' deadlines. CoDel's 5 ms target sees that backlog as a
//! standing queue; turning it away makes every stock driver fail or retry, so it is served,
//! held back by the reader taking the socket no faster than it answers. An open-loop client
//! does not slow down when it is not answered: its backlog keeps growing. So each
//! connection's backlog (unread bytes in the kernel plus unprocessed bytes in the reader's
//! buffer, in frames of the connection's mean size) is compared from one interval to the
//! next; a connection whose backlog grew in consecutive intervals by more than a share of
//! what it was answered meanwhile is *pushing*: while the shard is overloaded, its excess is
//! turned away with `Overloaded`, as the shard's CoDel decides, for a while. One interval of
//! growth is not enough: a windowed client fills its window once, when it starts.
//!
//! Many open-loop connections may each add little, while the shard's backlog grows as fast
//! as their sum: eight at three times the capacity each add a few hundred frames per
//! interval, and one at a time they would cross the floor only after about half a second,
//! served in order meanwhile. So the connections whose backlog grew in their latest interval
//! report it to their shard ([`GrowingBacklogs`]), and a connection that grew in consecutive
//! intervals is pushing when its own backlog passes the floor, or when the growing backlogs
//! of the shard together pass it and its own holds at least half their mean. A single
//! windowed client stays under the floor however slowly it builds its window.
//!
//! The growth shows only until the kernel's socket buffer is full: after that TCP paces an
//! open-loop client by the reads, as a window paces itself (the rest waits in the client).
//! So the server's reader, when it holds a connection back (a pause over an in-flight cap, a
//! quantum of frames still buffered), first reads the socket ahead into its own bounded
//! buffer, where the growth goes on showing; a connection whose read-ahead reaches that
//! bound is pushing at once ([`BacklogWatch::mark_pushing`]). The watch runs all the time,
//! not only once the shard is overloaded, and a pushing connection whose excess is still
//! turned away faster than it is served stays pushing.

use crate::clock::{duration_nanos, Nanos};
use std::cell::Cell;
use std::time::Duration;

/// Constants of [`BacklogWatch`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct BacklogConfig {
    /// Length of one observation window (the CoDel interval, 100 ms).
    pub interval: Duration,
    /// Growth below this many frames in a window is never pushing (32): a client's own
    /// jitter, a few requests sent before the answers that would have paced them.
    pub slack_frames: u64,
    /// Growth above `answered / answered_divisor` frames in a window counts (8: a backlog
    /// that grows by more than an eighth of what the connection was answered meanwhile, an
    /// open-loop load an eighth above what the shard serves it; a window, however slowly it
    /// is built, is told apart by its size, not by its growth).
    pub answered_divisor: u64,
    /// Consecutive growing windows that make a connection pushing (2).
    pub windows: u32,
    /// A backlog of up to this many frames is a client's window however it grows (1024):
    /// a driver that builds requests slower than the shard would serve them fills its window
    /// over many intervals, as slowly as it can send. Drivers keep a few hundred in flight
    /// per connection (cqlsh's COPY 512); an open-loop client's backlog grows without bound.
    /// The same floor applies to the growing backlogs of a shard's connections together
    /// ([`GrowingBacklogs`]).
    pub max_window_frames: u64,
    /// How long a connection stays pushing once seen so (5 s): while it is, its excess is
    /// read and turned away, so its backlog no longer grows and says nothing.
    pub hold: Duration,
}

impl Default for BacklogConfig {
    fn default() -> Self {
        BacklogConfig {
            interval: Duration::from_millis(100),
            slack_frames: 32,
            answered_divisor: 8,
            windows: 2,
            max_window_frames: 1024,
            hold: Duration::from_secs(5),
        }
    }
}

/// One connection's backlog watch (see the module documentation). No allocation; the
/// reader feeds it the frames it takes and, while the shard is overloaded, its backlog.
#[derive(Copy, Clone, Debug)]
pub struct BacklogWatch {
    interval: u64,
    slack_frames: u64,
    answered_divisor: u64,
    windows: u32,
    max_window_frames: u64,
    hold: u64,
    /// End of the current window; `None`: no window open (the shard is not overloaded).
    window_end: Option<Nanos>,
    /// Backlog in frames when the window opened.
    window_start_frames: u64,
    /// Frames taken from the buffer since the window opened.
    answered: u64,
    /// Of those, frames turned away (`Overloaded`) since the window opened.
    turned_away: u64,
    /// Consecutive windows in which the backlog grew too much.
    growing: u32,
    /// Pushing until this instant.
    pushing_until: Nanos,
    /// Mean frame size (bytes, header included), a moving average; 0 before any frame.
    frame_bytes: u64,
    /// What this connection last reported to its shard's [`GrowingBacklogs`]: the interval's
    /// number and the frames.
    reported: Option<(u64, u64)>,
}

/// The backlogs of a shard's connections that grew in their latest interval: their frames
/// together and how many connections, over the current interval and the one before (each
/// connection reports once per interval, at the end of its own; a report older than that,
/// such as a closed connection's, no longer counts). One per shard; no allocation.
#[derive(Debug, Default)]
pub struct GrowingBacklogs {
    /// By interval number modulo 2.
    buckets: [Cell<Bucket>; 2],
}

/// The growing backlogs reported in one interval.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
struct Bucket {
    /// The interval's number (time / interval).
    interval: u64,
    /// Frames reported.
    frames: u64,
    /// Connections that reported.
    connections: u64,
}

impl GrowingBacklogs {
    /// No growing backlog.
    pub fn new() -> GrowingBacklogs {
        GrowingBacklogs::default()
    }

    fn bucket(&self, interval: u64) -> Bucket {
        let b = self.buckets[(interval % 2) as usize].get();
        if b.interval == interval {
            b
        } else {
            Bucket {
                interval,
                ..Bucket::default()
            }
        }
    }

    /// Frames and connections of the growing backlogs reported in interval `interval` and
    /// the one before.
    pub fn total(&self, interval: u64) -> (u64, u64) {
        let now = self.bucket(interval);
        let before = interval
            .checked_sub(1)
            .map_or(Bucket::default(), |i| self.bucket(i));
        (
            now.frames + before.frames,
            now.connections + before.connections,
        )
    }

    fn add(&self, interval: u64, frames: u64) {
        let mut b = self.bucket(interval);
        b.frames += frames;
        b.connections += 1;
        self.buckets[(interval % 2) as usize].set(b);
    }

    /// Takes back a report made in `interval`, if it still counts.
    fn remove(&self, interval: u64, frames: u64) {
        let slot = &self.buckets[(interval % 2) as usize];
        let mut b = slot.get();
        if b.interval != interval {
            return;
        }
        debug_assert!(
            b.frames >= frames && b.connections >= 1,
            "a report taken back was counted: {b:?}, {frames}"
        );
        b.frames = b.frames.saturating_sub(frames);
        b.connections = b.connections.saturating_sub(1);
        slot.set(b);
    }
}

impl BacklogWatch {
    /// A watch that has seen nothing: not pushing.
    pub fn new(cfg: BacklogConfig) -> BacklogWatch {
        BacklogWatch {
            interval: duration_nanos(cfg.interval).max(1),
            slack_frames: cfg.slack_frames,
            answered_divisor: cfg.answered_divisor.max(1),
            windows: cfg.windows.max(1),
            max_window_frames: cfg.max_window_frames,
            hold: duration_nanos(cfg.hold),
            window_end: None,
            window_start_frames: 0,
            answered: 0,
            turned_away: 0,
            growing: 0,
            pushing_until: Nanos::ZERO,
            frame_bytes: 0,
            reported: None,
        }
    }

    /// The reader took a frame of `bytes` (header included) from its buffer: served, queued
    /// or turned away, it is one answer the client will get.
    #[inline]
    pub fn on_frame(&mut self, bytes: usize) {
        let bytes = bytes as u64;
        self.frame_bytes = if self.frame_bytes == 0 {
            bytes
        } else {
            // A 1/16 moving average: integer, no float on the reader's path.
            (self.frame_bytes * 15 + bytes) / 16
        };
        self.answered += 1;
    }

    /// The frame last taken was turned away `Overloaded`. A pushing connection whose excess
    /// is still turned away when its hold ends stays pushing: turned away, its backlog no
    /// longer grows, and would otherwise look like a window.
    #[inline]
    pub fn on_turned_away(&mut self) {
        self.turned_away += 1;
    }

    /// The connection's backlog at `now`, `backlog_bytes` (unread in the kernel plus not yet
    /// taken from the reader's buffer). Closes the window when it is over, reports a growing
    /// backlog to the shard's `growing` backlogs, and says whether the connection is pushing.
    pub fn observe(&mut self, now: Nanos, backlog_bytes: u64, growing: &GrowingBacklogs) -> bool {
        let frames = backlog_bytes / self.frame_bytes.max(1);
        match self.window_end {
            None => self.open_window(now, frames),
            Some(end) if now >= end => {
                let served = self.answered.saturating_sub(self.turned_away);
                if self.is_pushing(now) && self.turned_away > self.slack_frames.max(served) {
                    self.pushing_until = now.saturating_add(Duration::from_nanos(self.hold));
                }
                let grew = frames.saturating_sub(self.window_start_frames);
                let allowed = self.slack_frames.max(self.answered / self.answered_divisor);
                let interval = now.0 / self.interval;
                if let Some((at, reported)) = self.reported.take() {
                    growing.remove(at, reported);
                }
                if grew > allowed {
                    self.growing += 1;
                    growing.add(interval, frames);
                    self.reported = Some((interval, frames));
                    if self.growing >= self.windows
                        && self.beyond_a_window(frames, interval, growing)
                    {
                        self.pushing_until = now.saturating_add(Duration::from_nanos(self.hold));
                        self.growing = 0;
                    }
                } else {
                    self.growing = 0;
                }
                self.open_window(now, frames);
            }
            Some(_) => {}
        }
        self.is_pushing(now)
    }

    /// True if a backlog of `frames` that keeps growing is more than a window: it passed the
    /// floor, or the shard's growing backlogs together passed it and this one holds at least
    /// half their mean (so that a window growing beside open-loop connections, whose backlogs
    /// grow without bound, is not taken for one of them).
    fn beyond_a_window(&self, frames: u64, interval: u64, growing: &GrowingBacklogs) -> bool {
        let (shard_frames, connections) = growing.total(interval);
        frames > self.max_window_frames
            || (shard_frames > self.max_window_frames
                && frames.saturating_mul(connections).saturating_mul(2) >= shard_frames)
    }

    /// The connection sent more than any window that is served (its reader's read-ahead
    /// reached its bound): pushing at once, for the hold.
    pub fn mark_pushing(&mut self, now: Nanos) {
        self.pushing_until = now.saturating_add(Duration::from_nanos(self.hold));
        self.growing = 0;
    }

    /// True while the connection is known not to slow down when held back.
    #[inline]
    pub fn is_pushing(&self, now: Nanos) -> bool {
        now < self.pushing_until
    }

    fn open_window(&mut self, now: Nanos, frames: u64) {
        self.window_end = Some(Nanos(now.0.saturating_add(self.interval)));
        self.window_start_frames = frames;
        self.answered = 0;
        self.turned_away = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: u64) -> Nanos {
        Nanos::from_millis(ms)
    }

    #[test]
    fn a_steady_window_is_never_pushing_and_a_growing_backlog_is_after_two_intervals() {
        let shard = GrowingBacklogs::new();
        let mut w = BacklogWatch::new(BacklogConfig::default());
        // 100-byte frames; 50 answered per 10 ms and a steady 256-frame backlog.
        for t in (0..2_000).step_by(10) {
            for _ in 0..50 {
                w.on_frame(100);
            }
            assert!(!w.observe(at_ms(t), 25_600, &shard), "t={t}");
        }
        // Now the backlog grows by 100 frames per 10 ms: more than the slack and an eighth
        // of the 500 answered per interval.
        let mut first = None;
        for (i, t) in (2_000..2_500).step_by(10).enumerate() {
            for _ in 0..50 {
                w.on_frame(100);
            }
            if w.observe(at_ms(t), 25_600 + 10_000 * i as u64, &shard) && first.is_none() {
                first = Some(t);
            }
        }
        assert_eq!(first, Some(2_200), "two whole windows of growth");
        // It stays pushing for the hold, even with the backlog gone, and longer while its
        // excess is still turned away.
        for t in (2_500..9_000).step_by(10) {
            for _ in 0..50 {
                w.on_frame(100);
                w.on_turned_away();
            }
            assert!(w.observe(at_ms(t), 0, &shard), "t={t}");
        }
        assert!(w.is_pushing(at_ms(13_850)));
        assert!(!w.is_pushing(at_ms(13_950)), "the hold ended");
    }

    #[test]
    fn one_window_of_growth_is_a_client_filling_its_window() {
        let shard = GrowingBacklogs::new();
        let mut w = BacklogWatch::new(BacklogConfig::default());
        w.on_frame(1_000);
        w.observe(at_ms(0), 0, &shard);
        // 512 frames arrive at once, then the backlog is steady.
        assert!(!w.observe(at_ms(100), 512_000, &shard));
        for t in (110..1_000).step_by(10) {
            w.on_frame(1_000);
            assert!(!w.observe(at_ms(t), 512_000, &shard), "t={t}");
        }
        // A client that builds its window slower than it is served: 1,000 frames over a
        // second, growing in every interval, still a window.
        let alone = GrowingBacklogs::new();
        let mut slow = BacklogWatch::new(BacklogConfig::default());
        for t in (0..1_000).step_by(10) {
            slow.on_frame(1_000);
            assert!(
                !slow.observe(at_ms(t), t * 1_000_000 / 1_000, &alone),
                "t={t}"
            );
        }
    }

    /// Eight connections that each add 125 frames per interval (an open-loop load of twice
    /// the capacity dealt among them) are pushing after two intervals, long before any of
    /// them alone passes the floor; a window built slowly beside them is not, nor is a
    /// window growing alone; and reports older than the interval before no longer count.
    #[test]
    fn many_slowly_growing_connections_are_pushing_together() {
        let shard = GrowingBacklogs::new();
        let mut open: Vec<BacklogWatch> = (0..8)
            .map(|_| BacklogWatch::new(BacklogConfig::default()))
            .collect();
        let mut window = BacklogWatch::new(BacklogConfig::default());
        let mut first = None;
        for t in (0..400).step_by(10) {
            let step = t / 10;
            for w in open.iter_mut() {
                // 100-byte frames, 12 answered per 10 ms, the backlog 12.5 frames more.
                for _ in 0..12 {
                    w.on_frame(100);
                }
                let pushing = w.observe(at_ms(t), step * 1_250, &shard);
                if pushing && first.is_none() {
                    first = Some(t);
                }
            }
            // The window: 5 frames more per 10 ms, up to 300.
            for _ in 0..12 {
                window.on_frame(100);
            }
            assert!(
                !window.observe(at_ms(t), (step * 500).min(30_000), &shard),
                "t={t}"
            );
        }
        assert_eq!(first, Some(200), "two intervals of growth, 250 frames each");
        assert!(open.iter().all(|w| w.is_pushing(at_ms(400))));

        // One connection growing alone the same way stays a window.
        let alone = GrowingBacklogs::new();
        let mut w = BacklogWatch::new(BacklogConfig::default());
        for t in (0..800).step_by(10) {
            for _ in 0..12 {
                w.on_frame(100);
            }
            assert!(!w.observe(at_ms(t), t / 10 * 1_250, &alone), "t={t}");
        }

        // A report counts in its interval and the next one only.
        let reports = GrowingBacklogs::new();
        reports.add(3, 700);
        reports.add(4, 500);
        assert_eq!(reports.total(4), (1_200, 2));
        assert_eq!(reports.total(5), (500, 1));
        assert_eq!(reports.total(6), (0, 0));
        reports.remove(4, 500);
        assert_eq!(reports.total(4), (700, 1));
    }
}
