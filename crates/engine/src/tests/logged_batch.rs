//! LOGGED batches over several replica sets, through a transaction log shared by the trio:
//! a commit is applied on every node that follows the log, and on a node held back once it
//! catches up, as a restarted node replays the log.

use super::*;
use crate::transaction::replicated::{
    LoggedDecision, LoggedTxn, TxnLog, TxnLogError, TxnLogFuture,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// One committed entry: (timestamp, provisional, mutations).
type Entry = (i64, i64, Bytes);

/// The trio's transaction log.
struct SharedLog {
    nodes: Vec<(Uuid, Arc<Engine>)>,
    entries: Mutex<Vec<Entry>>,
    /// How many entries each node has applied.
    applied: Mutex<HashMap<Uuid, usize>>,
    /// Nodes that do not apply entries until they catch up.
    held_back: Mutex<HashSet<Uuid>>,
    /// Whether each submitted transaction kept its timestamps.
    kept: Mutex<Vec<bool>>,
    /// Answer every submit with a timeout, committing nothing.
    refuse: AtomicBool,
    submits: AtomicUsize,
    max_bytes: usize,
}

impl SharedLog {
    fn over(trio: &Trio, max_bytes: usize) -> Arc<SharedLog> {
        Arc::new(SharedLog {
            nodes: (0..3)
                .map(|i| (host(i as u8 + 1), trio.nodes[i].engine.clone()))
                .collect(),
            entries: Mutex::new(Vec::new()),
            applied: Mutex::new(HashMap::new()),
            held_back: Mutex::new(HashSet::new()),
            kept: Mutex::new(Vec::new()),
            refuse: AtomicBool::new(false),
            submits: AtomicUsize::new(0),
            max_bytes,
        })
    }

    /// Applies on `host` every entry it has not applied yet.
    fn catch_up(&self, host: Uuid) {
        let entries = self.entries.lock().unwrap().clone();
        let mut applied = self.applied.lock().unwrap();
        let done = applied.entry(host).or_insert(0);
        let engine = &self.nodes.iter().find(|(h, _)| *h == host).unwrap().1;
        for (timestamp, provisional, mutations) in &entries[*done..] {
            engine.apply_logged_commit(*timestamp, *provisional, mutations);
        }
        *done = entries.len();
    }

    fn hold_back(&self, host: Uuid, held: bool) {
        let mut set = self.held_back.lock().unwrap();
        if held {
            set.insert(host);
        } else {
            set.remove(&host);
        }
    }

    fn submits(&self) -> usize {
        self.submits.load(Ordering::Relaxed)
    }
}

impl TxnLog for SharedLog {
    fn read_barrier(&self, _deadline: Instant) -> TxnLogFuture<Result<u64, TxnLogError>> {
        let at = self.last_applied();
        Box::pin(async move { Ok(at) })
    }

    fn last_applied(&self) -> u64 {
        self.entries.lock().unwrap().len() as u64
    }

    fn submit(
        &self,
        txn: LoggedTxn,
        _deadline: Instant,
    ) -> TxnLogFuture<Result<LoggedDecision, TxnLogError>> {
        self.submits.fetch_add(1, Ordering::Relaxed);
        self.kept.lock().unwrap().push(txn.keeps_timestamps);
        if self.refuse.load(Ordering::Relaxed) {
            return Box::pin(async { Err(TxnLogError::Timeout) });
        }
        // Only batches reach this log: they keep their timestamps.
        let timestamp = txn.provisional;
        self.entries
            .lock()
            .unwrap()
            .push((timestamp, txn.provisional, txn.mutations));
        let held = self.held_back.lock().unwrap().clone();
        for (host, _) in &self.nodes {
            if !held.contains(host) {
                self.catch_up(*host);
            }
        }
        Box::pin(async move { Ok(LoggedDecision::Committed { timestamp }) })
    }

    fn max_txn_bytes(&self) -> usize {
        self.max_bytes
    }
}

impl Trio {
    /// Gives nodes 2 and 3 node 1's ring, so that each writes only what it replicates.
    fn share_ring(&self) {
        let ring = self.nodes[0].engine.ring();
        for h in &self.nodes[1..] {
            h.engine.set_ring(ring.clone());
        }
    }

    /// `v`, `writetime(v)` and `ttl(v)` of row (pk, 100) in one node's own storage.
    async fn row_100(&mut self, node: usize, pk: i32) -> Option<(String, i64, Option<i32>)> {
        let rows = self.nodes[node]
            .select(
                &format!("SELECT v, writetime(v), ttl(v) FROM k1.t WHERE pk = {pk} AND ck = 100"),
                vec![],
            )
            .await;
        rows.first().map(|r| {
            (
                ctext(&r[0]),
                cbig(&r[1]),
                r[2].as_ref().map(|_| cint(&r[2])),
            )
        })
    }

    fn rows_everywhere(&self) -> Vec<usize> {
        let mut out = Vec::new();
        for node in 0..3 {
            let t = self.nodes[node].engine.table("k1", "t").unwrap();
            let page = self.nodes[node]
                .engine
                .storage()
                .scan(
                    &t.layout,
                    &sluice_storage::ScanStart::Token(std::ops::Bound::Unbounded),
                    std::ops::Bound::Unbounded,
                    10_000,
                    0,
                )
                .unwrap();
            out.push(page.partitions.iter().map(|p| p.read.rows.len()).sum());
        }
        out
    }
}

/// The second of `0..30` whose one replica is node `i`.
fn second_pk_on(trio: &Trio, i: u8) -> i32 {
    let ring = trio.nodes[0].engine.ring();
    (0..30)
        .filter(|pk: &i32| {
            ring.node(ring.owner_of(Token::of_key(&pk.to_be_bytes())).unwrap())
                .host_id
                == host(i)
        })
        .nth(1)
        .expect("two partitions on that node")
}

fn mutations_sent(trio: &Trio, to: u8) -> usize {
    trio.transport
        .sent
        .lock()
        .unwrap()
        .iter()
        .filter(|(h, v)| *h == host(to) && *v == ReplicaVerb::Mutation)
        .count()
}

#[tokio::test]
async fn a_logged_batch_over_three_replica_sets_is_committed_to_the_log_and_applied_whole() {
    let mut trio = trio_rf1(30).await;
    let log = SharedLog::over(&trio, 1 << 20);
    assert!(trio.nodes[0].engine.set_txn_log(log.clone()));
    trio.share_ring();
    let (on1, on2, on3) = (pk_on(&trio, 1), pk_on(&trio, 2), pk_on(&trio, 3));
    let batch = format!(
        "BEGIN BATCH
           INSERT INTO k1.t (pk, ck, v) VALUES ({on1}, 100, 'a');
           INSERT INTO k1.t (pk, ck, v) VALUES ({on2}, 100, 'b') USING TIMESTAMP 12345;
           UPDATE k1.t USING TTL 600 SET v = 'c' WHERE pk = {on3} AND ck = 100;
         APPLY BATCH"
    );
    let sent_before = (mutations_sent(&trio, 2), mutations_sent(&trio, 3));
    assert!(matches!(
        trio.run(0, &batch, Consistency::All).await,
        Ok(ResultMessage::Void)
    ));
    assert_eq!(log.submits(), 1);
    assert_eq!(*log.kept.lock().unwrap(), vec![true]);
    // Each replica holds its part with the statement's own timestamp and TTL.
    let (v1, ts1, ttl1) = trio.row_100(0, on1).await.expect("node 1 has its part");
    let (v2, ts2, _) = trio.row_100(1, on2).await.expect("node 2 has its part");
    let (v3, ts3, ttl3) = trio.row_100(2, on3).await.expect("node 3 has its part");
    assert_eq!((v1.as_str(), v2.as_str(), v3.as_str()), ("a", "b", "c"));
    assert_eq!(ts2, 12345, "USING TIMESTAMP is kept through the log");
    assert_eq!(
        ts1, ts3,
        "the statements without one share the batch's timestamp"
    );
    assert!(ts1 > 1_000_000_000_000_000, "a wall-clock timestamp: {ts1}");
    assert_eq!(ttl1, None);
    assert!(ttl3.is_some_and(|t| t > 0 && t <= 600), "{ttl3:?}");
    // The level's answer came from the replicas too: one MUTATION to each remote replica.
    assert_eq!(
        (mutations_sent(&trio, 2), mutations_sent(&trio, 3)),
        (sent_before.0 + 1, sent_before.1 + 1)
    );

    // One replica set, an UNLOGGED batch and a single partition keep the ordinary path.
    let on2b = second_pk_on(&trio, 2);
    for q in [
        format!(
            "BEGIN BATCH
               INSERT INTO k1.t (pk, ck, v) VALUES ({on2}, 101, 'd');
               INSERT INTO k1.t (pk, ck, v) VALUES ({on2b}, 101, 'd');
             APPLY BATCH"
        ),
        format!(
            "BEGIN UNLOGGED BATCH
               INSERT INTO k1.t (pk, ck, v) VALUES ({on1}, 101, 'e');
               INSERT INTO k1.t (pk, ck, v) VALUES ({on3}, 101, 'e');
             APPLY BATCH"
        ),
        format!(
            "BEGIN BATCH
               INSERT INTO k1.t (pk, ck, v) VALUES ({on3}, 102, 'f');
               INSERT INTO k1.t (pk, ck, v) VALUES ({on3}, 103, 'f');
             APPLY BATCH"
        ),
    ] {
        trio.run(0, &q, Consistency::One).await.unwrap();
    }
    assert_eq!(log.submits(), 1, "none of them went through the log");
    let rows = trio.nodes[2]
        .select(
            &format!("SELECT v FROM k1.t WHERE pk = {on3} AND ck IN (101, 102, 103)"),
            vec![],
        )
        .await;
    assert_eq!(rows.len(), 3);
}

#[tokio::test]
async fn a_logged_batch_fails_without_a_write_before_the_log_and_completes_whole_after_it() {
    let mut trio = trio_rf1(30).await;
    let log = SharedLog::over(&trio, 1024);
    assert!(trio.nodes[0].engine.set_txn_log(log.clone()));
    trio.share_ring();
    let (on1, on2, on3) = (pk_on(&trio, 1), pk_on(&trio, 2), pk_on(&trio, 3));
    let batch = format!(
        "BEGIN BATCH
           INSERT INTO k1.t (pk, ck, v) VALUES ({on1}, 100, 'a');
           INSERT INTO k1.t (pk, ck, v) VALUES ({on2}, 100, 'b');
           INSERT INTO k1.t (pk, ck, v) VALUES ({on3}, 100, 'c');
         APPLY BATCH"
    );
    let start = trio.rows_everywhere();

    // A replica down for the failure detector: Unavailable, nothing logged or written.
    trio.nodes[0].engine.set_node_up(host(3), false);
    let e = error_of(trio.run(0, &batch, Consistency::One).await);
    assert!(
        matches!(
            e,
            DbError::Unavailable {
                consistency: Consistency::One,
                required: 1,
                alive: 0
            }
        ),
        "{e:?}"
    );
    assert_eq!(log.submits(), 0);
    assert_eq!(trio.rows_everywhere(), start);
    trio.nodes[0].engine.set_node_up(host(3), true);

    // The log does not confirm in time: Write_timeout BATCH_LOG, nothing written.
    log.refuse.store(true, Ordering::Relaxed);
    let e = error_of(trio.run(0, &batch, Consistency::One).await);
    assert!(
        matches!(
            e,
            DbError::WriteTimeout {
                consistency: Consistency::One,
                received: 0,
                block_for: 1,
                write_type: sluice_protocol::WriteType::BatchLog,
            }
        ),
        "{e:?}"
    );
    assert_eq!(trio.rows_everywhere(), start);
    log.refuse.store(false, Ordering::Relaxed);

    // Larger than one log entry: Invalid naming the bound, nothing logged or written.
    let big = "x".repeat(2048);
    let too_big = format!(
        "BEGIN BATCH
           INSERT INTO k1.t (pk, ck, v) VALUES ({on1}, 100, '{big}');
           INSERT INTO k1.t (pk, ck, v) VALUES ({on3}, 100, 'c');
         APPLY BATCH"
    );
    let submits = log.submits();
    let e = trio.run(0, &too_big, Consistency::One).await.unwrap_err();
    assert_eq!(e.error, DbError::Invalid);
    assert!(
        e.message.contains("one transaction log entry") && e.message.contains("UNLOGGED"),
        "{}",
        e.message
    );
    assert_eq!(log.submits(), submits);
    assert_eq!(trio.rows_everywhere(), start);

    // Node 3 stops before the failure detector notices: the batch is logged, its answer is
    // Write_timeout BATCH at the deadline, nodes 1 and 2 hold their parts, and node 3 gets
    // its part once it catches up with the log.
    log.hold_back(host(3), true);
    trio.transport.set(host(3), Behaviour::Drop);
    let started = Instant::now();
    let e = error_of(
        trio.run_with_deadline(0, &batch, Consistency::One, Duration::from_millis(300))
            .await,
    );
    assert!(
        matches!(
            e,
            DbError::WriteTimeout {
                consistency: Consistency::One,
                received: 0,
                block_for: 1,
                write_type: sluice_protocol::WriteType::Batch,
            }
        ),
        "{e:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(
        trio.row_100(0, on1).await.map(|r| r.0).as_deref(),
        Some("a")
    );
    assert_eq!(
        trio.row_100(1, on2).await.map(|r| r.0).as_deref(),
        Some("b")
    );
    assert_eq!(trio.row_100(2, on3).await, None);
    log.catch_up(host(3));
    let (v3, ts3, _) = trio.row_100(2, on3).await.expect("node 3 has its part");
    let (_, ts1, _) = trio.row_100(0, on1).await.unwrap();
    assert_eq!((v3.as_str(), ts3), ("c", ts1));
    let end = trio.rows_everywhere();
    assert_eq!(
        end.iter().sum::<usize>(),
        start.iter().sum::<usize>() + 3,
        "{start:?} -> {end:?}"
    );
}
