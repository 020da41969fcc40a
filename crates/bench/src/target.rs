//! What the generator drives: operations, replies, outcome classes and the `Target` trait.

use crate::runner::Ticket;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// Kind of a single-partition operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Read every row of one partition.
    Read,
    /// Write one row of one partition.
    Write,
}

/// One logical request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// Read or write.
    pub kind: OpKind,
    /// Partition key.
    pub pk: i64,
    /// Clustering key (writes only).
    pub ck: i32,
}

/// Which partitions a stream touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyDist {
    /// Uniformly over `0..partitions`.
    Uniform {
        /// Number of distinct partitions.
        partitions: u64,
    },
    /// Always the same partition.
    Single {
        /// The partition key.
        pk: i64,
    },
}

/// Draws operations for one stream.
#[derive(Debug)]
pub struct OpGen {
    read_fraction: f64,
    keys: KeyDist,
    rows: i32,
    rng: StdRng,
}

impl OpGen {
    /// Reads with probability `read_fraction`, writes otherwise; writes spread over `rows` rows.
    pub fn new(read_fraction: f64, keys: KeyDist, rows: i32, seed: u64) -> Self {
        Self {
            read_fraction,
            keys,
            rows: rows.max(1),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The next operation.
    pub fn next_op(&mut self) -> Op {
        let kind = if self.read_fraction >= 1.0 || self.rng.random::<f64>() < self.read_fraction {
            OpKind::Read
        } else {
            OpKind::Write
        };
        let pk = match self.keys {
            KeyDist::Uniform { partitions } => self.rng.random_range(0..partitions.max(1)) as i64,
            KeyDist::Single { pk } => pk,
        };
        let ck = self.rng.random_range(0..self.rows);
        Op { kind, pk, ck }
    }
}

/// What a target answered (before the generator compares it with the deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Success.
    Ok,
    /// ScyllaDB's per-partition rate limit error (or its Config_error stand-in).
    RateLimited,
    /// `Overloaded` (0x1001).
    Overloaded,
    /// A server-side read or write timeout.
    ServerTimeout,
    /// The client gave up waiting.
    ClientTimeout,
    /// Anything else.
    Other,
}

/// Final classification of a request, counted separately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Succeeded before its deadline: goodput.
    Ok = 0,
    /// Succeeded, but after its deadline (measured from the intended send time).
    Late = 1,
    /// Rejected by the per-partition rate limiter.
    RateLimited = 2,
    /// Rejected as overloaded.
    Overloaded = 3,
    /// Timed out on the server.
    ServerTimeout = 4,
    /// Timed out on the client.
    ClientTimeout = 5,
    /// Any other error.
    Other = 6,
}

/// Number of outcome classes.
pub const OUTCOME_COUNT: usize = 7;

/// All outcomes, in index order.
pub const OUTCOMES: [Outcome; OUTCOME_COUNT] = [
    Outcome::Ok,
    Outcome::Late,
    Outcome::RateLimited,
    Outcome::Overloaded,
    Outcome::ServerTimeout,
    Outcome::ClientTimeout,
    Outcome::Other,
];

impl Outcome {
    /// Short machine-friendly name (JSON keys, table headers).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Late => "late",
            Outcome::RateLimited => "rate_limited",
            Outcome::Overloaded => "overloaded",
            Outcome::ServerTimeout => "server_timeout",
            Outcome::ClientTimeout => "client_timeout",
            Outcome::Other => "other",
        }
    }

    /// Classifies a reply: a success counts as goodput only if it arrived before the deadline.
    pub fn classify(reply: Reply, latency: Duration, deadline: Duration) -> Outcome {
        match reply {
            Reply::Ok if latency <= deadline => Outcome::Ok,
            Reply::Ok => Outcome::Late,
            Reply::RateLimited => Outcome::RateLimited,
            Reply::Overloaded => Outcome::Overloaded,
            Reply::ServerTimeout => Outcome::ServerTimeout,
            Reply::ClientTimeout => Outcome::ClientTimeout,
            Reply::Other => Outcome::Other,
        }
    }
}

/// A database under test. Implemented by the `scylla` driver target and by in-process fakes.
pub trait Target: Send + Sync + 'static {
    /// Executes one operation and reports how it ended; must not retry unless configured to.
    fn execute(&self, op: Op) -> impl Future<Output = Reply> + Send;

    /// Server arrivals so far, counting retries (None when the target cannot tell).
    fn attempts(&self) -> Option<u64> {
        None
    }

    /// Sends `op` without waiting and completes `ticket` with its answer. By default a task
    /// of its own runs [`execute`](Target::execute) under the ticket's client timeout; a
    /// pipelined target queues the request instead, and sends it at the next [`flush`].
    ///
    /// [`flush`]: Target::flush
    fn submit(self: &Arc<Self>, op: Op, ticket: Ticket)
    where
        Self: Sized,
    {
        let target = Arc::clone(self);
        tokio::spawn(async move {
            let reply = tokio::time::timeout(ticket.client_timeout(), target.execute(op))
                .await
                .unwrap_or(Reply::ClientTimeout);
            ticket.complete(reply);
        });
    }

    /// Sends whatever [`submit`](Target::submit) queued; the runner calls it after each burst
    /// of arrivals that were due together. Nothing is queued by default.
    fn flush(&self) {}

    /// The delays from intended send time to socket write (microseconds) recorded since the
    /// last call, if the target measures them; the histogram is reset.
    fn take_send_delays(&self) -> Option<hdrhistogram::Histogram<u64>> {
        None
    }
}

/// Writes `rows` rows in each of `pks` through any target, 128 at a time (closed loop: setup
/// before reads, not measured); returns how many writes failed.
pub async fn populate<T: Target>(target: &Arc<T>, pks: std::ops::Range<i64>, rows: i32) -> u64 {
    let mut set = JoinSet::new();
    let mut failed = 0u64;
    for pk in pks {
        for ck in 0..rows.max(1) {
            while set.len() >= 128 {
                if let Some(r) = set.join_next().await {
                    failed += u64::from(!matches!(r, Ok(Reply::Ok)));
                }
            }
            let t = target.clone();
            set.spawn(async move {
                t.execute(Op {
                    kind: OpKind::Write,
                    pk,
                    ck,
                })
                .await
            });
        }
    }
    while let Some(r) = set.join_next().await {
        failed += u64::from(!matches!(r, Ok(Reply::Ok)));
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_separates_late_successes_from_goodput() {
        let d = Duration::from_millis(10);
        assert_eq!(
            Outcome::classify(Reply::Ok, Duration::from_millis(10), d),
            Outcome::Ok
        );
        assert_eq!(
            Outcome::classify(Reply::Ok, Duration::from_millis(11), d),
            Outcome::Late
        );
        assert_eq!(
            Outcome::classify(Reply::Overloaded, Duration::ZERO, d),
            Outcome::Overloaded
        );
        assert_eq!(
            Outcome::classify(Reply::RateLimited, Duration::ZERO, d),
            Outcome::RateLimited
        );
        for (i, o) in OUTCOMES.iter().enumerate() {
            assert_eq!(*o as usize, i);
        }
    }

    /// Answers Overloaded for odd partitions, Ok otherwise, and records what it was asked.
    #[derive(Default)]
    struct OddFails(std::sync::Mutex<Vec<Op>>);

    impl Target for OddFails {
        async fn execute(&self, op: Op) -> Reply {
            self.0.lock().unwrap().push(op);
            if op.pk % 2 == 1 {
                Reply::Overloaded
            } else {
                Reply::Ok
            }
        }
    }

    #[tokio::test]
    async fn populate_writes_every_row_and_counts_failures() {
        let t = Arc::new(OddFails::default());
        assert_eq!(populate(&t, 0..300, 2).await, 300);
        let mut seen: Vec<(i64, i32)> = t.0.lock().unwrap().iter().map(|o| (o.pk, o.ck)).collect();
        assert!(t.0.lock().unwrap().iter().all(|o| o.kind == OpKind::Write));
        seen.sort_unstable();
        let want: Vec<(i64, i32)> = (0..300).flat_map(|pk| [(pk, 0), (pk, 1)]).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn opgen_respects_mix_and_key_distribution() {
        let mut g = OpGen::new(0.5, KeyDist::Uniform { partitions: 100 }, 1, 3);
        let ops: Vec<Op> = (0..10_000).map(|_| g.next_op()).collect();
        let reads = ops.iter().filter(|o| o.kind == OpKind::Read).count();
        assert!((4_500..5_500).contains(&reads), "reads {reads}");
        assert!(ops.iter().all(|o| (0..100).contains(&o.pk) && o.ck == 0));
        let mut hot = OpGen::new(0.0, KeyDist::Single { pk: 9 }, 10, 3);
        let ops: Vec<Op> = (0..1000).map(|_| hot.next_op()).collect();
        assert!(ops.iter().all(|o| o.pk == 9 && o.kind == OpKind::Write));
        assert!(ops.iter().any(|o| o.ck == 9) && ops.iter().all(|o| (0..10).contains(&o.ck)));
    }
}
