//! BATCH goes through the same checks as QUERY and EXECUTE: its `USING TIMEOUT` sets its
//! deadline, an expired batch is answered with a write timeout and is no latency sample for
//! the adaptive concurrency limit, and the rate limiter answers a limited batch with the
//! rate-limit error. Drives the real server over loopback with frames from the protocol's request codec.

use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;

mod support;

use support::node::{ask, batch, query, TestNode, ERROR, RESULT};

/// A node with the default configuration.
fn start() -> TestNode {
    TestNode::start(|_| {})
}

/// The latency samples the shard's concurrency limit has been taught.
fn latency_samples(node: &TestNode) -> u64 {
    node.server().metrics()[0].latency_samples.load(Relaxed)
}

fn create(s: &mut TcpStream, ddl: &[&str]) {
    for (i, q) in ddl.iter().enumerate() {
        assert_eq!(ask(s, &query(i as i16 + 1, q)), (RESULT, None), "{q}");
    }
}

#[test]
fn an_expired_batch_is_a_write_timeout_and_no_latency_sample() {
    let node = start();
    let mut s = node.connect();
    create(
        &mut s,
        &[
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ks.t (k int PRIMARY KEY, v int)",
        ],
    );
    let served = batch(
        20,
        &[
            "INSERT INTO ks.t (k, v) VALUES (1, 1)",
            "INSERT INTO ks.t (k, v) VALUES (2, 2)",
        ],
    );
    let samples = latency_samples(&node);
    assert_eq!(ask(&mut s, &served), (RESULT, None), "a batch in time runs");
    assert_eq!(
        latency_samples(&node),
        samples + 1,
        "and is a latency sample"
    );

    // The smallest USING TIMEOUT among the statements is the batch's: zero has passed on
    // arrival.
    let expired = batch(
        21,
        &[
            "INSERT INTO ks.t (k, v) VALUES (3, 3) USING TIMEOUT 10s",
            "INSERT INTO ks.t (k, v) VALUES (4, 4) USING TIMEOUT 0ms",
        ],
    );
    let samples = latency_samples(&node);
    for _ in 0..20 {
        assert_eq!(
            ask(&mut s, &expired),
            (ERROR, Some(0x1100)),
            "write timeout"
        );
    }
    assert_eq!(
        latency_samples(&node),
        samples,
        "an expired batch taught the concurrency limit a latency"
    );
    let m = &node.server().metrics()[0];
    assert_eq!(m.expired_before_execution.load(Relaxed), 20);
    assert_eq!(m.errors_with_code(0x1100), 20);
    // Nothing of the expired batches was written.
    let (opcode, _) = ask(&mut s, &query(30, "SELECT * FROM ks.t WHERE k = 4"));
    assert_eq!(opcode, RESULT);
}

#[test]
fn a_rate_limited_batch_is_answered_with_the_rate_limit_error() {
    let node = start();
    let mut s = node.connect();
    create(
        &mut s,
        &[
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ks.t (k int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 1}",
        ],
    );
    let limited = batch(40, &["INSERT INTO ks.t (k, v) VALUES (7, 1)"]);
    let samples = latency_samples(&node);
    let mut answers = std::collections::HashMap::new();
    const N: usize = 50;
    for _ in 0..N {
        *answers.entry(ask(&mut s, &limited)).or_insert(0usize) += 1;
    }
    // Not negotiated at STARTUP: Config_error, which no default retry policy retries.
    let rejected = answers.get(&(ERROR, Some(0x2300))).copied().unwrap_or(0);
    let served = answers.get(&(RESULT, None)).copied().unwrap_or(0);
    assert_eq!(
        rejected + served,
        N,
        "only results and rate-limit errors: {answers:?}"
    );
    assert!(
        rejected >= N - 10,
        "the limiter turned batches away: {answers:?}"
    );
    let m = &node.server().metrics()[0];
    assert_eq!(m.rejected_rate_limited.load(Relaxed), rejected as u64);
    assert_eq!(
        latency_samples(&node),
        samples + served as u64,
        "only the batches that ran are latency samples"
    );
}
