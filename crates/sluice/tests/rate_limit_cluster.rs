//! The per-partition write and read limits on three `sluice serve` nodes (127.0.0.1-3, RF 3):
//! one partition written (or read) far above its limit, each request sent to the next node in
//! turn (a round-robin client), is accepted at about the limit across the cluster, not at
//! three times it as when each node limits alone. Writes share the limit because every
//! replica counts every admitted write; reads because the replicas exchange their admitted
//! reads.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{session_without_retries, Ports, ServeNode};

use scylla::errors::{DbError, ExecutionError, RequestAttemptError};

/// Bound on every node seeing the table.
const SCHEMA_TIMEOUT: Duration = Duration::from_secs(30);
/// Writes (or reads) per second allowed on one partition.
const LIMIT: u32 = 10;
/// How long the hot partition is written.
const LOAD: Duration = Duration::from_secs(6);

fn is_rate_limited(e: &ExecutionError) -> bool {
    matches!(
        e,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::RateLimitReached { .. },
            _
        ))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_robin_client_gets_about_the_limit_from_three_replicas() {
    round_robin_against_the_limit(Op::Write).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_robin_reader_gets_about_the_limit_from_three_replicas() {
    round_robin_against_the_limit(Op::Read).await;
}

/// What the hot partition is offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write,
    Read,
}

async fn round_robin_against_the_limit(op: Op) {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(3);
    let nodes: Vec<ServeNode> = (1..=3)
        .map(|i| ServeNode::start(dir.path(), i, ports, &[]).0)
        .collect();
    let mut sessions = Vec::new();
    for node in &nodes {
        sessions.push(session_without_retries(node.cql()).await);
    }
    sessions[0]
        .query_unpaged(
            "CREATE KEYSPACE rl WITH replication = \
             {'class': 'SimpleStrategy', 'replication_factor': 3}",
            &[],
        )
        .await
        .unwrap();
    sessions[0]
        .query_unpaged(
            format!(
                "CREATE TABLE rl.t (pk int PRIMARY KEY, v int) \
                 WITH per_partition_rate_limit = {{'{option}': {LIMIT}}}",
                option = match op {
                    Op::Write => "max_writes_per_second",
                    Op::Read => "max_reads_per_second",
                }
            ),
            &[],
        )
        .await
        .unwrap();
    let deadline = Instant::now() + SCHEMA_TIMEOUT;
    for s in &sessions {
        while s
            .query_unpaged("SELECT pk FROM rl.t WHERE pk = 1", &[])
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "a node lacks the table");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let mut prepared = Vec::new();
    for s in &sessions {
        prepared.push(
            s.prepare(match op {
                Op::Write => "INSERT INTO rl.t (pk, v) VALUES (0, ?)",
                Op::Read => "SELECT v FROM rl.t WHERE pk = ?",
            })
            .await
            .unwrap(),
        );
    }
    // Let the failure detector see every node up, so writes replicate rather than hint.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Three requests in flight at a time, one through each node: a round-robin client.
    let (mut accepted, mut limited, mut other) = (0u32, 0u32, Vec::new());
    let start = Instant::now();
    let mut v = 0i32;
    while start.elapsed() < LOAD {
        v += 3;
        // A write sets a new value of partition 0; a read names partition 0.
        let bound = |x: i32| if op == Op::Write { x } else { 0 };
        let round = tokio::join!(
            sessions[0].execute_unpaged(&prepared[0], (bound(v),)),
            sessions[1].execute_unpaged(&prepared[1], (bound(v + 1),)),
            sessions[2].execute_unpaged(&prepared[2], (bound(v + 2),)),
        );
        for r in [round.0, round.1, round.2] {
            match r {
                Ok(_) => accepted += 1,
                Err(e) if is_rate_limited(&e) => limited += 1,
                Err(e) => other.push(e.to_string()),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let offered = f64::from(accepted + limited) / secs;
    let rate = f64::from(accepted) / secs;
    eprintln!(
        "{op:?}: offered {offered:.0}/s, accepted {rate:.1}/s against {LIMIT}/s; \
         {limited} rate-limited, {} other errors",
        other.len()
    );
    assert!(other.len() <= 3, "unexpected errors: {other:?}");
    // The bound below means something only if the cluster was offered well above it (each
    // node alone would then accept the limit: about 3x in total).
    assert!(
        offered >= f64::from(LIMIT) * 6.0,
        "offered only {offered:.0}/s: the machine is too loaded for this test"
    );
    // Generous for a loaded machine: the first window's burst of `LIMIT` is included.
    let bound = 1.5 * f64::from(LIMIT) * secs + f64::from(LIMIT);
    assert!(
        f64::from(accepted) <= bound,
        "{accepted} accepted in {secs:.1} s, bound {bound:.0}"
    );
    assert!(
        f64::from(accepted) >= 0.5 * f64::from(LIMIT) * secs,
        "{accepted} accepted in {secs:.1} s: the limit rejects too much"
    );
    drop(nodes);
}
