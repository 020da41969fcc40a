//! A shard's event loop under overload, with the queue admission cannot see.
//!
//! [`super::run_admission`] hands every request to the controller the instant it arrives.
//! A real shard does not: bytes wait in the kernel socket buffer until the connection's
//! reader task is polled, and the reader is one task among many on a cooperative,
//! single-threaded scheduler. This simulation models that scheduler as tokio's
//! current-thread runtime with a `LocalSet` behaves:
//!
//! * one FIFO run queue; at most [`LoopSim::tick`] (61) task polls between two polls of the
//!   I/O driver, which delivers socket readiness (an idle reader whose socket holds data
//!   becomes ready), fires timers and re-queues the tasks that yielded: a task that yields
//!   waits for the next driver poll, then for every task queued before it;
//! * a reader reads when its buffer is empty: up to [`LoopSim::read_chunk`] frames (64 KiB),
//!   twice as much after a read that filled its buffer, up to [`LoopSim::read_ahead`]; it
//!   handles at most [`LoopSim::read_quantum`] frames per poll, then yields. The former
//!   reader awaited four semaphores per frame, each spending one unit of tokio's cooperative
//!   budget of 128 per poll, so it yielded every 32 frames, and always read 64 KiB;
//! * each admitted frame spawns a request task, polled once to wait for its admission
//!   outcome; a dispatched request runs its service time when polled, and its completion
//!   dispatches (wakes) the next; with [`LoopSim::run_in_reader`] (as the server now does),
//!   a frame dispatched at once runs in the reader instead, without a task;
//! * a connection at its in-flight cap pauses its reader until one of its requests is
//!   answered or, while overloaded with `reject_over_cap`, reads on and rejects;
//! * with a `lag_probe_interval`, a probe task sleeps, makes itself ready (a yield) and
//!   reports how long it waited to the controller.
//!
//! The server does not know the client's deadline (no `USING TIMEOUT`): requests carry the
//! server's default write timeout, so only CoDel and the lag can protect goodput.
//!
//! With the former reader, each tick gives the reader one poll of 32 frames while the rest of
//! the tick chains through dispatched requests: reading is throttled to about the service
//! rate, the admission queue never builds, CoDel never sheds, and the excess waits in the
//! socket until the client gives up. [`run_loop`] reproduces that collapse (the test
//! `former_reader_hides_the_queue_in_the_socket`) and what the current shard does instead.

use super::{exp_sample, percentile, Arrivals, Service};
use crate::admission::{AdmissionConfig, AdmissionController, Arrival, Verdict};
use crate::clock::{duration_nanos, Nanos};
use crate::deadline::Deadline;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::VecDeque;
use std::time::Duration;

/// What a request run in the reader counts towards the read quantum (as in the server).
pub const INLINE_RUN_WEIGHT: u32 = 8;

/// One event-loop simulation run.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct LoopSim {
    /// Offered load as a multiple of the service capacity (`1 / mean service time`).
    pub load: f64,
    /// Arrival process (all connections together; arrivals are dealt round-robin).
    pub arrivals: Arrivals,
    /// CPU time of executing one admitted request.
    pub service: Service,
    /// Client connections on the shard, one reader task each.
    pub connections: u32,
    /// CPU of one read syscall.
    pub read_syscall: Duration,
    /// Reader CPU per frame: header, in-flight slots, admission decision.
    pub read_cost: Duration,
    /// Reader CPU per admitted frame: spawning its task.
    pub spawn_cost: Duration,
    /// CPU of a request task's first poll (it registers for its admission outcome).
    pub park_cost: Duration,
    /// CPU to answer `Overloaded` from the header (the pre-encoded frame).
    pub reject_cost: Duration,
    /// CPU to answer a request shed or expired in the queue (its task woken and polled).
    pub shed_cost: Duration,
    /// Frames a reader handles per poll before it yields.
    pub read_quantum: u32,
    /// Frames one read takes at most after a read that did not fill its buffer.
    pub read_chunk: u32,
    /// Frames one read takes at most after reads that filled their buffer (doubling).
    pub read_ahead: u32,
    /// Every frame of one read is stamped with the read's instant (else with the instant the
    /// reader reaches it, as the former reader did).
    pub arrival_per_read: bool,
    /// Every frame carries the instant it reached the kernel (`Arrival::Received`), as the
    /// server's receive stamps do; the server spreads a read's stamp over its frames, here it
    /// is exact. Overrides `arrival_per_read`.
    pub kernel_stamps: bool,
    /// The reader runs a request that is dispatched at once itself, instead of spawning a
    /// task for it, and counts it as [`INLINE_RUN_WEIGHT`] frames of its quantum.
    pub run_in_reader: bool,
    /// In-flight requests per connection before its reader pauses (or rejects).
    pub conn_cap: u32,
    /// Task polls between two polls of the I/O driver (tokio: 61).
    pub tick: u32,
    /// Client deadline from the send time; later answers are not goodput.
    pub deadline: Duration,
    /// The server's own deadline for a request (its default timeout; it cannot know the
    /// client's).
    pub server_timeout: Duration,
    /// Simulated time.
    pub duration: Duration,
    /// Initial period excluded from the figures.
    pub warmup: Duration,
    /// Admission constants; `lag_probe_interval`, `shed_at_enqueue` and `reject_over_cap`
    /// are honoured.
    pub admission: AdmissionConfig,
    /// RNG seed.
    pub seed: u64,
}

impl LoopSim {
    /// The shard as it is now: the reader drains what it read and stamps arrival per read;
    /// admission counts the loop lag, sheds at enqueue and rejects over the cap while
    /// overloaded (the [`AdmissionConfig`] defaults). Costs are in the proportions of the
    /// server's (a served write ≈ 50 µs of CPU per shard, a header rejection 0.2 µs).
    pub fn current() -> LoopSim {
        LoopSim {
            load: 1.0,
            arrivals: Arrivals::Poisson,
            service: Service::Exponential(Duration::from_micros(50)),
            connections: 4,
            read_syscall: Duration::from_micros(2),
            read_cost: Duration::from_nanos(150),
            spawn_cost: Duration::from_nanos(700),
            park_cost: Duration::from_nanos(300),
            reject_cost: Duration::from_nanos(100),
            shed_cost: Duration::from_micros(1),
            read_quantum: 512,
            read_chunk: 512,
            read_ahead: 8192,
            arrival_per_read: true,
            kernel_stamps: false,
            run_in_reader: false,
            conn_cap: 1024,
            tick: 61,
            deadline: Duration::from_millis(20),
            server_timeout: Duration::from_secs(2),
            duration: Duration::from_secs(4),
            warmup: Duration::from_secs(1),
            admission: AdmissionConfig::default(),
            seed: 1,
        }
    }

    /// The former shard: a reader that yields every 32 frames and stamps arrival when it
    /// reaches a frame; no lag probe, no shedding at enqueue, pausing at the caps.
    pub fn former() -> LoopSim {
        LoopSim {
            read_quantum: 32,
            read_ahead: 512,
            arrival_per_read: false,
            kernel_stamps: false,
            run_in_reader: false,
            admission: AdmissionConfig {
                lag_probe_interval: Duration::ZERO,
                shed_at_enqueue: false,
                reject_over_cap: false,
                ..AdmissionConfig::default()
            },
            ..LoopSim::current()
        }
    }
}

/// The outcome of an event-loop simulation (figures exclude the warm-up).
#[derive(Clone, Debug, PartialEq)]
pub struct LoopReport {
    /// Requests sent by clients.
    pub arrived: u64,
    /// Requests executed, in time or not.
    pub served: u64,
    /// Requests answered with a result before their client deadline.
    pub good: u64,
    /// Requests answered `Overloaded` (at enqueue, over a cap, or shed in the queue).
    pub rejected: u64,
    /// Requests answered with a timeout before execution.
    pub expired: u64,
    /// Goodput as a fraction of the service capacity.
    pub goodput_ratio: f64,
    /// 99th percentile of the wait in the socket, from send to read, of requests read.
    pub unread_p99: Duration,
    /// Requests sent but not yet handled by a reader at the end.
    pub unread_at_end: u64,
    /// 99th percentile response time (send to completion) of served requests.
    pub latency_p99: Duration,
    /// Largest loop lag measured by the probe (zero without a probe).
    pub lag_max: Duration,
    /// Share of the CPU spent executing requests that completed after their deadline.
    pub wasted_cpu: f64,
    /// The concurrency limit at the end.
    pub final_limit: u32,
    /// The controller's counters (whole run).
    pub stats: crate::admission::AdmissionStats,
}

/// A task of the simulated loop.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Task {
    Reader(usize),
    /// A request task's first poll.
    First(usize),
    /// A dispatched request, executing.
    Exec(usize),
    /// A request shed or expired in the queue, answering.
    Unserved(usize),
    Probe,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    /// Queued; its task has not been polled yet.
    Queued,
    /// Queued; its task was polled and waits for the outcome.
    Parked,
    /// Dispatched before its task's first poll: that poll executes it.
    Dispatched,
    /// Turned away in the queue before its first poll: that poll answers it.
    Rejected,
    Done,
}

struct Req {
    sent: u64,
    conn: usize,
    state: State,
    dispatched: u64,
}

struct Conn {
    socket: VecDeque<u64>,
    /// Frames read, not yet handled: (send time, read time).
    buffer: VecDeque<(u64, u64)>,
    inflight: u32,
    /// The reader is ready, running or yielded (not waiting for I/O or a slot).
    scheduled: bool,
    /// The reader waits for one of its requests to be answered (at its cap).
    capped: bool,
    /// Frames the next read takes at most.
    chunk: u32,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Probe {
    Off,
    /// Sleeping until this instant.
    Sleeping(u64),
    /// Its timer fired; queued for its first poll.
    Woken,
    /// Yielded; waits to run again (the lag being measured).
    Yielded,
}

/// The simulated shard.
struct World<'a> {
    sim: &'a LoopSim,
    rng: StdRng,
    ctl: AdmissionController<usize>,
    conns: Vec<Conn>,
    reqs: Vec<Req>,
    run: VecDeque<Task>,
    deferred: Vec<Task>,
    probe: Probe,
    now: u64,
    warm: u64,
    deadline: u64,
    served: u64,
    good: u64,
    rejected: u64,
    expired: u64,
    late_cpu: u64,
    unread: Vec<u64>,
    latencies: Vec<u64>,
    lag_max: Duration,
}

impl World<'_> {
    fn counted(&self, id: usize) -> u64 {
        u64::from(self.reqs[id].sent >= self.warm)
    }

    /// The I/O driver: tasks that yielded, readers whose socket has data, the probe's timer.
    fn driver_poll(&mut self) {
        self.run.extend(self.deferred.drain(..));
        for (i, c) in self.conns.iter_mut().enumerate() {
            if !c.scheduled && !c.capped && !c.socket.is_empty() {
                c.scheduled = true;
                self.run.push_back(Task::Reader(i));
            }
        }
        if let Probe::Sleeping(due) = self.probe {
            if self.now >= due {
                self.probe = Probe::Woken;
                self.run.push_back(Task::Probe);
            }
        }
    }

    fn poll(&mut self, task: Task) {
        match task {
            Task::Probe => {
                self.now += 100;
                let now = Nanos(self.now);
                if self.probe == Probe::Woken {
                    self.ctl.lag_probe_started(now);
                    self.probe = Probe::Yielded;
                    self.deferred.push(Task::Probe);
                } else {
                    let lag = self.ctl.lag_probe_finished(now);
                    self.lag_max = self.lag_max.max(lag);
                    let every = duration_nanos(self.sim.admission.lag_probe_interval);
                    self.probe = Probe::Sleeping(self.now + every);
                    self.pump();
                }
            }
            Task::Reader(ci) => self.poll_reader(ci),
            Task::First(id) => match self.reqs[id].state {
                State::Queued => {
                    self.now += duration_nanos(self.sim.park_cost);
                    self.reqs[id].state = State::Parked;
                }
                State::Dispatched => self.execute(id),
                State::Rejected => self.answer_unserved(id),
                State::Parked | State::Done => {}
            },
            Task::Exec(id) => self.execute(id),
            Task::Unserved(id) => self.answer_unserved(id),
        }
    }

    fn poll_reader(&mut self, ci: usize) {
        let sim = self.sim;
        let mut handled = 0u32;
        loop {
            if self.conns[ci].buffer.is_empty() {
                // read(): up to a chunk of what the socket holds, stamped with this instant.
                if self.conns[ci].socket.is_empty() {
                    break;
                }
                self.now += duration_nanos(sim.read_syscall);
                let (c, read_at) = (&mut self.conns[ci], self.now);
                let n = c.socket.len().min(c.chunk as usize);
                let filled = n == c.chunk as usize;
                c.buffer
                    .extend(c.socket.drain(..n).map(|sent| (sent, read_at)));
                c.chunk = if filled {
                    (c.chunk * 2).min(sim.read_ahead.max(sim.read_chunk))
                } else {
                    sim.read_chunk
                };
            }
            if handled >= sim.read_quantum {
                break;
            }
            let Some(&(sent, read_at)) = self.conns[ci].buffer.front() else {
                break;
            };
            self.now += duration_nanos(sim.read_cost);
            handled += 1;
            if self.conns[ci].inflight >= sim.conn_cap {
                if self.ctl.reject_over_cap(Nanos(self.now)) {
                    self.conns[ci].buffer.pop_front();
                    self.note_read(sent, read_at);
                    self.now += duration_nanos(sim.reject_cost);
                    self.rejected += u64::from(sent >= self.warm);
                    continue;
                }
                // Backpressure: the reader waits until one of its requests is answered.
                self.conns[ci].capped = true;
                self.conns[ci].scheduled = false;
                return;
            }
            self.conns[ci].buffer.pop_front();
            self.note_read(sent, read_at);
            let arrival = if sim.kernel_stamps {
                Arrival::Received(Nanos(sent))
            } else if sim.arrival_per_read {
                Arrival::Read(Nanos(read_at))
            } else {
                Arrival::Read(Nanos(self.now))
            };
            let id = self.reqs.len();
            let dl = Deadline(arrival.at().saturating_add(sim.server_timeout));
            let queued = self.ctl.enqueue_read(id, arrival, Nanos(self.now), dl);
            if queued.is_err() {
                self.now += duration_nanos(sim.reject_cost);
                self.rejected += u64::from(sent >= self.warm);
                continue;
            }
            self.reqs.push(Req {
                sent,
                conn: ci,
                state: State::Queued,
                dispatched: 0,
            });
            self.conns[ci].inflight += 1;
            self.pump();
            if sim.run_in_reader && self.reqs[id].state == State::Dispatched {
                handled += INLINE_RUN_WEIGHT - 1;
                self.execute(id);
            } else {
                self.now += duration_nanos(sim.spawn_cost);
                self.run.push_back(Task::First(id));
            }
        }
        let c = &mut self.conns[ci];
        if c.buffer.is_empty() && c.socket.is_empty() {
            c.scheduled = false; // waits for readiness
        } else {
            self.deferred.push(Task::Reader(ci)); // quantum used: yield
        }
    }

    fn note_read(&mut self, sent: u64, read_at: u64) {
        if sent >= self.warm {
            self.unread.push(read_at.saturating_sub(sent));
        }
    }

    /// Dispatches what the controller allows now; wakes dispatched and rejected requests.
    fn pump(&mut self) {
        let now = Nanos(self.now);
        let mut turned_away: Vec<(usize, Verdict)> = Vec::new();
        while self.ctl.can_dispatch() {
            let next = self.ctl.dispatch(now, |id, v| turned_away.push((id, v)));
            let Some(q) = next else { break };
            let r = &mut self.reqs[q.item];
            r.dispatched = self.now;
            match r.state {
                State::Queued => r.state = State::Dispatched,
                _ => self.run.push_back(Task::Exec(q.item)),
            }
        }
        for (id, v) in turned_away {
            match v {
                Verdict::Expired => self.expired += self.counted(id),
                _ => self.rejected += self.counted(id),
            }
            let r = &mut self.reqs[id];
            match r.state {
                State::Queued => r.state = State::Rejected,
                _ => self.run.push_back(Task::Unserved(id)),
            }
        }
    }

    fn execute(&mut self, id: usize) {
        let start = self.now;
        self.now += self.sim.service.sample(&mut self.rng);
        let r = &self.reqs[id];
        let (sent, dispatched) = (r.sent, r.dispatched);
        if sent >= self.warm {
            self.served += 1;
            self.latencies.push(self.now - sent);
            if self.now <= sent + self.deadline {
                self.good += 1;
            } else {
                self.late_cpu += self.now - start;
            }
        }
        let latency = Duration::from_nanos(self.now - dispatched);
        self.ctl.on_complete(latency, Nanos(self.now));
        self.release(id);
        self.pump();
    }

    fn answer_unserved(&mut self, id: usize) {
        self.now += duration_nanos(self.sim.shed_cost);
        self.release(id);
    }

    /// The request is answered: its connection slot is free again.
    fn release(&mut self, id: usize) {
        let r = &mut self.reqs[id];
        r.state = State::Done;
        let c = &mut self.conns[r.conn];
        c.inflight -= 1;
        if c.capped {
            // Backpressure: what waited in its buffer waited in the client's queue.
            let now = self.now;
            c.buffer.iter_mut().for_each(|f| f.1 = now);
            c.capped = false;
            c.scheduled = true;
            self.run.push_back(Task::Reader(r.conn));
        }
    }
}

/// Runs one event-loop simulation.
pub fn run_loop(sim: &LoopSim) -> LoopReport {
    let mean_service = duration_nanos(sim.service.mean()).max(1) as f64;
    let capacity = 1e9 / mean_service;
    let gap = mean_service / sim.load.max(1e-9);
    let end = duration_nanos(sim.duration);
    let probe_every = duration_nanos(sim.admission.lag_probe_interval);
    let mut w = World {
        sim,
        rng: StdRng::seed_from_u64(sim.seed),
        ctl: AdmissionController::new(sim.admission),
        conns: (0..sim.connections.max(1))
            .map(|_| Conn {
                socket: VecDeque::new(),
                buffer: VecDeque::new(),
                inflight: 0,
                scheduled: false,
                capped: false,
                chunk: sim.read_chunk,
            })
            .collect(),
        reqs: Vec::new(),
        run: VecDeque::new(),
        deferred: Vec::new(),
        probe: if probe_every > 0 {
            Probe::Sleeping(probe_every)
        } else {
            Probe::Off
        },
        now: 0,
        warm: duration_nanos(sim.warmup),
        deadline: duration_nanos(sim.deadline),
        served: 0,
        good: 0,
        rejected: 0,
        expired: 0,
        late_cpu: 0,
        unread: Vec::new(),
        latencies: Vec::new(),
        lag_max: Duration::ZERO,
    };
    let mut next_arrival = 0u64;
    let mut dealt = 0usize;
    let mut arrived = 0u64;
    let mut polls = 0u32;
    let mut busy = 0u64;
    while w.now < end {
        // Clients send; the kernel queues the bytes.
        while next_arrival <= w.now {
            let n = w.conns.len();
            w.conns[dealt % n].socket.push_back(next_arrival);
            dealt += 1;
            arrived += u64::from(next_arrival >= w.warm);
            next_arrival += match sim.arrivals {
                Arrivals::Constant => gap.max(1.0) as u64,
                Arrivals::Poisson => exp_sample(&mut w.rng, gap),
            };
        }
        if polls >= sim.tick || w.run.is_empty() {
            polls = 0;
            w.driver_poll();
            if w.run.is_empty() {
                // Idle: sleep until the next arrival or timer.
                let timer = match w.probe {
                    Probe::Sleeping(due) => due,
                    _ => u64::MAX,
                };
                w.now = next_arrival.min(timer).max(w.now);
                continue;
            }
        }
        let Some(task) = w.run.pop_front() else {
            continue;
        };
        polls += 1;
        let before = w.now;
        w.poll(task);
        if before >= w.warm {
            busy += w.now - before;
        }
    }
    let secs = (end - w.warm) as f64 / 1e9;
    let unread_at_end = w
        .conns
        .iter()
        .map(|c| c.socket.len() + c.buffer.len())
        .sum::<usize>() as u64;
    LoopReport {
        arrived,
        served: w.served,
        good: w.good,
        rejected: w.rejected,
        expired: w.expired,
        goodput_ratio: w.good as f64 / secs / capacity,
        unread_p99: percentile(&mut w.unread, 0.99),
        unread_at_end,
        latency_p99: percentile(&mut w.latencies, 0.99),
        lag_max: w.lag_max,
        wasted_cpu: w.late_cpu as f64 / busy.max(1) as f64,
        final_limit: w.ctl.concurrency_limit(),
        stats: w.ctl.stats(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(name: &str, sim: LoopSim) -> LoopReport {
        let r = run_loop(&sim);
        eprintln!("{name} load={} seed={}: {r:?}", sim.load, sim.seed);
        r
    }

    fn at(load: f64, sim: LoopSim) -> LoopSim {
        LoopSim { load, ..sim }
    }

    #[test]
    fn the_former_reader_hides_the_queue_in_the_socket() {
        // Below capacity it serves everything, promptly.
        let calm = run("former", at(0.5, LoopSim::former()));
        assert_eq!(calm.good, calm.served, "{calm:?}");
        assert!((calm.goodput_ratio - 0.5).abs() < 0.02, "{calm:?}");
        // Past capacity the reader admits about what is served: the admission queue never
        // builds, nothing is shed, and the excess ages in the socket until every answer is
        // late; the CPU works on requests nobody waits for.
        for load in [1.3, 2.0, 3.0] {
            let r = run("former", at(load, LoopSim::former()));
            assert_eq!(r.rejected + r.expired, 0, "CoDel never saw it: {r:?}");
            assert!(r.goodput_ratio < 0.05, "{r:?}");
            assert!(r.unread_p99 > Duration::from_millis(100), "{r:?}");
            assert!(r.unread_at_end > 10_000, "{r:?}");
        }
    }

    #[test]
    fn the_current_shard_keeps_goodput_at_3x_and_10x() {
        for seed in 1..=2 {
            let sim = LoopSim {
                seed,
                ..LoopSim::current()
            };
            let calm = run("current", at(0.5, sim));
            assert_eq!((calm.rejected, calm.expired), (0, 0), "{calm:?}");
            assert!((calm.goodput_ratio - 0.5).abs() < 0.02, "{calm:?}");
            let capacity = run("current", at(1.0, sim));
            for load in [3.0, 10.0] {
                let r = run("current", at(load, sim));
                assert!(
                    r.goodput_ratio >= 0.95 * capacity.goodput_ratio,
                    "{load}x: {r:?} vs {capacity:?}"
                );
                // The excess is turned away as it arrives, not left to age unread.
                assert!(r.unread_p99 < Duration::from_millis(10), "{r:?}");
                assert!(r.latency_p99 < sim.deadline / 2, "{r:?}");
                assert!(r.wasted_cpu < 0.01, "{r:?}");
                assert!(r.rejected as f64 >= 0.9 * (r.arrived - r.served) as f64);
            }
        }
    }

    #[test]
    fn a_reader_that_yields_every_32_frames_leaves_the_excess_unread_longer() {
        // Everything else as now: in slices of 32 frames per tick, the reader reaches what
        // arrived at 10x late. Turning away what is known to be old keeps its goodput (before
        // that rule, it fell under 0.2 of capacity), but the excess waits unread longer.
        let slow = run(
            "quantum 32",
            at(
                10.0,
                LoopSim {
                    read_quantum: 32,
                    ..LoopSim::current()
                },
            ),
        );
        let now = run("current", at(10.0, LoopSim::current()));
        assert!(now.goodput_ratio > 0.9, "{now:?}");
        assert!(slow.goodput_ratio > 0.85, "{slow:?}");
        assert!(slow.unread_p99 > now.unread_p99 * 2, "{slow:?} vs {now:?}");
        assert!(slow.latency_p99 > now.latency_p99, "{slow:?} vs {now:?}");
    }

    #[test]
    fn a_reader_that_runs_its_requests_keeps_goodput_with_kernel_stamps() {
        // The server as it runs now: most requests finish in the reader, so the admission
        // queue stays empty and the backlog is in the socket. With each frame's kernel stamp,
        // what has waited there longer than half the target is turned away and what is
        // served is fresh; with only the read's instant, goodput holds (the loop lag stands
        // in for the wait) but the served requests wait several times longer.
        let inline = LoopSim {
            run_in_reader: true,
            kernel_stamps: true,
            ..LoopSim::current()
        };
        let unstamped = LoopSim {
            kernel_stamps: false,
            ..inline
        };
        for seed in 1..=2 {
            let capacity = run("inline", at(1.0, LoopSim { seed, ..inline }));
            for load in [3.0, 10.0] {
                let r = run("inline", at(load, LoopSim { seed, ..inline }));
                assert!(
                    r.goodput_ratio >= 0.95 * capacity.goodput_ratio,
                    "{load}x: {r:?} vs {capacity:?}"
                );
                assert!(r.latency_p99 < inline.admission.codel.target, "{r:?}");
                assert!(r.wasted_cpu < 0.01, "{r:?}");
                assert!(r.rejected as f64 >= 0.9 * (r.arrived - r.served) as f64);
                let u = run("inline, unstamped", at(load, LoopSim { seed, ..unstamped }));
                assert!(u.goodput_ratio > 0.9, "{u:?}");
                assert!(u.latency_p99 > r.latency_p99 * 3, "{u:?} vs {r:?}");
            }
        }
    }

    #[test]
    fn turning_the_excess_away_at_enqueue_keeps_rejection_cheap() {
        // Without the overloaded bound at enqueue, every arrival spawns a task that is later
        // woken only to be shed: at 10x that costs more than the work served.
        let mut unbounded = at(10.0, LoopSim::current());
        unbounded.admission.shed_at_enqueue = false;
        let unbounded = run("no bound at enqueue", unbounded);
        let now = run("current", at(10.0, LoopSim::current()));
        assert!(unbounded.goodput_ratio < 0.75, "{unbounded:?}");
        assert!(now.goodput_ratio > unbounded.goodput_ratio + 0.2, "{now:?}");
    }

    #[test]
    fn the_loop_lag_protects_heavy_requests() {
        // 1 ms requests: each pass of the loop runs several of them, so a reader waits
        // milliseconds before it reads, and the queue alone underestimates every age.
        let heavy = LoopSim {
            service: Service::Exponential(Duration::from_millis(1)),
            ..LoopSim::current()
        };
        let mut blind = heavy;
        blind.admission.lag_probe_interval = Duration::ZERO;
        for load in [1.0, 3.0] {
            let with = run("heavy", at(load, heavy));
            let without = run("heavy, no probe", at(load, blind));
            assert!(with.goodput_ratio > 0.8, "{with:?}");
            assert!(without.goodput_ratio < 0.5, "{without:?}");
            assert!(
                with.lag_max > Duration::from_millis(5),
                "the probe saw it: {with:?}"
            );
        }
    }
}
