//! One connection into one shard, as the reader sees it: a windowed client (a driver with
//! requests in flight, a bulk loader) or an open-loop one, a kernel socket buffer, the
//! reader's buffer, requests run one after another on the shard's CPU, and the real
//! [`AdmissionController`] and [`BacklogWatch`] over a fake clock.
//!
//! It shows what [`crate::backlog`] is for: the window is a bounded backlog, served without
//! a single `Overloaded`; the open-loop client's backlog grows, so its excess is turned away
//! and the shard keeps its goodput.

use crate::admission::{AdmissionConfig, AdmissionController, Arrival, Verdict};
use crate::backlog::{BacklogConfig, BacklogWatch, GrowingBacklogs};
use crate::clock::{duration_nanos, Nanos};
use crate::deadline::Deadline;
use std::collections::VecDeque;
use std::time::Duration;

/// Frames the reader takes between two read-aheads (the server's reader yields after 64
/// requests it ran itself).
pub const READ_AHEAD_EVERY: usize = 64;

/// How the client sends.
#[derive(Copy, Clone, Debug, PartialEq)]
pub enum Client {
    /// This many requests in flight: one new request per answer.
    Window(usize),
    /// Evenly spaced arrivals at this multiple of the shard's capacity, whatever the answers.
    OpenLoop(f64),
}

/// One run.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct WindowSim {
    /// The client.
    pub client: Client,
    /// CPU time of one request served.
    pub service: Duration,
    /// CPU time of one request turned away from its header.
    pub rejection: Duration,
    /// Frames the kernel's socket buffer holds; beyond it the client's own queue grows.
    pub socket_frames: usize,
    /// Frames one socket read takes.
    pub read_frames: usize,
    /// While the connection is paced, the reader moves what the socket holds into its
    /// buffer, up to this many bytes, every [`READ_AHEAD_EVERY`] frames it takes (as the
    /// server's reader does when it yields), so that an open-loop client's backlog keeps
    /// growing where the watch sees it; a buffer that reaches it is pushing at once (0: no
    /// read-ahead).
    pub read_ahead_bytes: u64,
    /// Bytes per frame.
    pub frame_bytes: u64,
    /// The server's deadline, from the request's arrival in the socket.
    pub deadline: Duration,
    /// A success counts as goodput when answered this soon after the client meant to send.
    pub goodput_deadline: Duration,
    /// Simulated time.
    pub duration: Duration,
}

impl Default for WindowSim {
    fn default() -> Self {
        WindowSim {
            client: Client::Window(256),
            service: Duration::from_millis(1),
            rejection: Duration::from_micros(20),
            socket_frames: 4096,
            read_frames: 64,
            read_ahead_bytes: 16 << 20,
            frame_bytes: 1_000,
            deadline: Duration::from_secs(2),
            goodput_deadline: Duration::from_secs(2),
            duration: Duration::from_secs(10),
        }
    }
}

/// What a run measured.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct WindowReport {
    /// Requests the client sent (or meant to send).
    pub offered: u64,
    /// Served.
    pub served: u64,
    /// Served within the goodput deadline of the client's intended send time.
    pub goodput: u64,
    /// Answered `Overloaded`.
    pub overloaded: u64,
    /// Answered with a timeout (deadline passed in the queue).
    pub expired: u64,
    /// Longest time from intended send to a successful answer.
    pub max_latency: Duration,
    /// The connection was pushing at the end.
    pub pushing: bool,
}

/// A request: when its client meant to send it, and when it reached the socket.
#[derive(Copy, Clone, Debug)]
struct Req {
    intended: u64,
    in_socket: u64,
}

/// The client sends what it queued into the socket while the socket has room; returns how
/// many requests it sent.
fn send_into_socket(
    client_queue: &mut VecDeque<u64>,
    socket: &mut VecDeque<u32>,
    reqs: &mut Vec<Req>,
    now: u64,
    sim: &WindowSim,
) -> u64 {
    let mut sent = 0;
    while socket.len() < sim.socket_frames {
        let Some(intended) = client_queue.pop_front() else {
            break;
        };
        sent += 1;
        reqs.push(Req {
            intended,
            in_socket: intended.max(now),
        });
        socket.push_back(reqs.len() as u32 - 1);
    }
    sent
}

/// Runs one simulation.
pub fn run_window(sim: &WindowSim) -> WindowReport {
    let mut ctl = AdmissionController::<u32>::new(AdmissionConfig::default());
    let mut watch = BacklogWatch::new(BacklogConfig::default());
    // One connection: the shard's growing backlogs are its own.
    let growing = GrowingBacklogs::new();
    let service = duration_nanos(sim.service);
    let rejection = duration_nanos(sim.rejection);
    let end = duration_nanos(sim.duration);
    let capacity = 1e9 / service as f64;
    let mut reqs: Vec<Req> = Vec::new();
    let mut client_queue: VecDeque<u64> = VecDeque::new();
    let mut socket: VecDeque<u32> = VecDeque::new();
    let mut buffer: VecDeque<u32> = VecDeque::new();
    let mut report = WindowReport::default();
    let (gap, mut next_open) = match sim.client {
        Client::Window(w) => {
            for _ in 0..w {
                client_queue.push_back(0);
            }
            (u64::MAX, u64::MAX)
        }
        Client::OpenLoop(load) => ((1e9 / (capacity * load)) as u64, 0),
    };
    let mut now = 0u64;
    let mut taken = 0usize;
    let answer = |report: &mut WindowReport,
                  client_queue: &mut VecDeque<u64>,
                  r: Req,
                  at: u64,
                  outcome: Verdict| {
        match outcome {
            Verdict::Serve => {
                report.served += 1;
                let latency = at.saturating_sub(r.intended);
                if latency <= duration_nanos(sim.goodput_deadline) {
                    report.goodput += 1;
                }
                report.max_latency = report.max_latency.max(Duration::from_nanos(latency));
            }
            Verdict::Shed => report.overloaded += 1,
            Verdict::Expired => report.expired += 1,
        }
        if let Client::Window(_) = sim.client {
            // One new request per answer, sent at once.
            client_queue.push_back(at);
        }
    };
    while now < end {
        // The client: open-loop arrivals up to now, then into the socket while it has room.
        while next_open <= now {
            client_queue.push_back(next_open);
            next_open += gap;
        }
        report.offered += send_into_socket(&mut client_queue, &mut socket, &mut reqs, now, sim);
        if buffer.is_empty() {
            if socket.is_empty() {
                now = next_open.min(end);
                continue;
            }
            let take = sim.read_frames.min(socket.len());
            buffer.extend(socket.drain(..take));
            let backlog = (socket.len() + buffer.len()) as u64 * sim.frame_bytes;
            watch.observe(Nanos(now), backlog, &growing);
        }
        let read_ahead_frames = (sim.read_ahead_bytes / sim.frame_bytes.max(1)) as usize;
        taken += 1;
        if read_ahead_frames > 0
            && taken.is_multiple_of(READ_AHEAD_EVERY)
            && !watch.is_pushing(Nanos(now))
        {
            while buffer.len() < read_ahead_frames {
                // The client sends into the room the reads make.
                report.offered +=
                    send_into_socket(&mut client_queue, &mut socket, &mut reqs, now, sim);
                let Some(id) = socket.pop_front() else {
                    break;
                };
                buffer.push_back(id);
            }
            watch.observe(
                Nanos(now),
                (socket.len() + buffer.len()) as u64 * sim.frame_bytes,
                &growing,
            );
            if buffer.len() >= read_ahead_frames {
                watch.mark_pushing(Nanos(now));
            }
        }
        let Some(id) = buffer.pop_front() else {
            continue;
        };
        let r = reqs[id as usize];
        watch.on_frame(sim.frame_bytes as usize);
        let paced = !watch.is_pushing(Nanos(now));
        let arrival = Arrival::Received(Nanos(r.in_socket));
        let deadline = Deadline(Nanos(r.in_socket).saturating_add(sim.deadline));
        let at_once = if paced {
            ctl.dispatch_paced_at_once(arrival, Nanos(now), deadline)
        } else {
            ctl.dispatch_at_once(arrival, Nanos(now), deadline)
        };
        if at_once.is_some() {
            now += service;
            ctl.on_complete(sim.service, Nanos(now));
            answer(&mut report, &mut client_queue, r, now, Verdict::Serve);
            continue;
        }
        let queued = if paced {
            ctl.enqueue_paced(id, arrival, Nanos(now), deadline)
        } else {
            ctl.enqueue_read(id, arrival, Nanos(now), deadline)
        };
        if queued.is_err() {
            now += rejection;
            watch.on_turned_away();
            answer(&mut report, &mut client_queue, r, now, Verdict::Shed);
            continue;
        }
        let mut turned = Vec::new();
        while let Some(q) = ctl.dispatch(Nanos(now), |item, v| turned.push((item, v))) {
            now += service;
            ctl.on_complete(sim.service, Nanos(now));
            let r = reqs[q.item as usize];
            answer(&mut report, &mut client_queue, r, now, Verdict::Serve);
        }
        for (item, v) in turned {
            now += rejection;
            let r = reqs[item as usize];
            answer(&mut report, &mut client_queue, r, now, v);
        }
    }
    report.pushing = watch.is_pushing(Nanos(now));
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_windowed_bulk_load_is_served_without_a_rejection() {
        // 256 requests of 1 ms in flight: a 256 ms backlog, far past CoDel's 5 ms target and
        // well inside the 2 s deadline.
        let r = run_window(&WindowSim::default());
        println!("{r:?}");
        assert_eq!((r.overloaded, r.expired), (0, 0), "{r:?}");
        assert!(!r.pushing);
        assert!(r.served >= 9_500, "the shard ran at capacity: {r:?}");
        assert_eq!(r.goodput, r.served, "all within the deadline: {r:?}");
        assert!(r.max_latency < Duration::from_millis(400), "{r:?}");
    }

    #[test]
    fn an_open_loop_client_at_three_times_capacity_is_shed_and_goodput_holds() {
        let sim = WindowSim {
            client: Client::OpenLoop(3.0),
            service: Duration::from_micros(100),
            rejection: Duration::from_micros(2),
            goodput_deadline: Duration::from_millis(100),
            ..WindowSim::default()
        };
        let r = run_window(&sim);
        println!("{r:?}");
        let capacity = 10_000 * 10;
        assert!(r.pushing, "{r:?}");
        assert!(r.overloaded > capacity, "the excess is turned away: {r:?}");
        assert!(
            r.goodput as f64 >= 0.9 * capacity as f64,
            "goodput {} of {capacity}: {r:?}",
            r.goodput
        );
    }

    #[test]
    fn an_open_loop_client_behind_a_small_socket_is_seen_only_with_read_ahead() {
        // When the kernel's buffer holds too little for the growth to show there (256 frames,
        // under the watch's floor of 1,024), and the
        // reader does not read ahead, the open-loop client is served as a window would be,
        // its own queue grows, and little is on time.
        // Goodput is what the server answers within its 2 s deadline, over 10 s.
        let sim = WindowSim {
            client: Client::OpenLoop(3.0),
            service: Duration::from_micros(100),
            rejection: Duration::from_micros(2),
            socket_frames: 256,
            ..WindowSim::default()
        };
        let capacity = 10_000.0 * 10.0;
        let blind = run_window(&WindowSim {
            read_ahead_bytes: 0,
            ..sim
        });
        println!("{blind:?}");
        assert!(!blind.pushing, "{blind:?}");
        assert!(
            (blind.goodput as f64) < 0.5 * capacity,
            "little on time: {blind:?}"
        );
        // Reading ahead into the reader's own buffer, the growth shows: pushing, and the
        // shard keeps its goodput, at every load.
        for load in [2.0, 3.0, 5.0, 10.0] {
            let r = run_window(&WindowSim {
                client: Client::OpenLoop(load),
                ..sim
            });
            println!("{load}x {r:?}");
            assert!(r.pushing, "{load}x: {r:?}");
            let least = if load >= 10.0 { 0.8 } else { 0.9 };
            assert!(
                r.goodput as f64 >= least * capacity,
                "{load}x: goodput {} of {capacity}",
                r.goodput
            );
        }
    }

    #[test]
    fn a_window_read_ahead_behind_a_small_socket_is_still_a_window() {
        let r = run_window(&WindowSim {
            socket_frames: 16,
            read_frames: 16,
            ..WindowSim::default()
        });
        println!("{r:?}");
        assert_eq!((r.overloaded, r.expired), (0, 0), "{r:?}");
        assert!(!r.pushing, "{r:?}");
        assert!(r.served >= 9_500, "the shard ran at capacity: {r:?}");
    }
}
