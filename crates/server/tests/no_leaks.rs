//! Every request gives back what it took: after many requests of every outcome (served,
//! overloaded, expired, rate-limited, an error, and a client that disconnected with requests
//! queued), the in-flight budgets of the shard and of each connection, the admission queue,
//! its slots and the requests it counts as executing are all back to zero. Drives the real
//! pipeline over in-memory connections.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use sluice_server::connection::ConnState;
use sluice_server::shard::ShardCtx;

mod support;

use support::request_path::{bench_with, execute_frame, fixed_admission_config, query_frame};

const RESULT: u8 = 0x08;
const ERROR: u8 = 0x00;

/// An unlogged BATCH of one text statement, at consistency ONE.
fn batch_frame(stream: i16, statement: &str) -> Vec<u8> {
    support::node::batch(stream, &[statement])
}

fn assert_nothing_held(shard: &ShardCtx, conns: &[&Rc<ConnState>]) {
    assert_eq!(shard.inflight.in_use(), 0, "shard requests in flight");
    assert_eq!(shard.inflight_bytes.in_use(), 0, "shard bytes in flight");
    for conn in conns {
        assert_eq!(conn.inflight.in_use(), 0, "connection requests in flight");
        assert_eq!(
            conn.inflight_bytes.in_use(),
            0,
            "connection bytes in flight"
        );
    }
    let admission = shard.admission.borrow();
    assert_eq!(admission.queued(), 0, "admission queue");
    assert_eq!(admission.slots_in_use(), 0, "admission slots");
    assert_eq!(
        admission.executing(),
        0,
        "executing per the concurrency limit"
    );
    assert_eq!(shard.metrics.inflight.load(Relaxed), 0, "inflight gauge");
}

#[test]
fn every_outcome_gives_back_its_budgets_and_admission_slot() {
    // One execution at a time, a queue of four, and every execution takes 2 ms: pipelined
    // requests queue, and beyond the queue they are turned away Overloaded.
    let mut config = fixed_admission_config(4, 1);
    config.test_only_service_delay = Some(Duration::from_millis(2));
    let (bench, _dir) = bench_with(config);
    let engine = bench.wire().shard.engine.clone();
    let id = |text: &str| engine.prepare(None, text).expect("prepare").id;
    let served = id("INSERT INTO ks.t (k, v) VALUES (?, ?)");
    let limited = id("INSERT INTO ks.limited (k, v) VALUES (?, ?)");
    let expired = id("INSERT INTO ks.t (k, v) VALUES (?, ?) USING TIMEOUT 0ms");
    let mut frames = Vec::new();
    for i in 0..4i16 {
        frames.push(execute_frame(10 * i, &served, i.into(), 1));
        frames.push(execute_frame(10 * i + 1, &limited, 7, 1));
        frames.push(execute_frame(10 * i + 2, &expired, i.into(), 1));
        frames.push(query_frame(10 * i + 3, "SELECT * FROM ks.no_such_table"));
        frames.push(batch_frame(
            10 * i + 4,
            "INSERT INTO ks.t (k, v) VALUES (5, 5) USING TIMEOUT 0ms",
        ));
    }

    let mut wire = bench.new_wire();
    let mut answers = std::collections::HashMap::new();
    for _ in 0..10 {
        let got = bench.block_on(async {
            wire.send(&frames).await;
            wire.answers(frames.len()).await
        });
        for a in got {
            *answers.entry(a).or_insert(0usize) += 1;
        }
    }
    // Every outcome happened.
    for (outcome, answer) in [
        ("served", (RESULT, None)),
        ("overloaded", (ERROR, Some(0x1001))),
        ("expired write", (ERROR, Some(0x1100))),
        ("rate limited", (ERROR, Some(0x2300))),
        ("invalid", (ERROR, Some(0x2200))),
    ] {
        assert!(
            answers.contains_key(&answer),
            "no {outcome} answer: {answers:?}"
        );
    }

    // A client that disconnects with requests queued and running.
    let mut gone = bench.new_wire();
    let conn = gone.conn.clone();
    let shard = bench.wire().shard.clone();
    bench.block_on(async {
        gone.send(&frames[..5]).await;
        conn.outbox.close();
        let conn_id = Rc::as_ptr(&conn) as usize;
        shard
            .admission
            .borrow_mut()
            .drop_connection(conn_id, &shard.metrics);
        // Its running requests finish (unanswered) in their tasks.
        let give_up = Instant::now() + Duration::from_secs(20);
        while shard.metrics.inflight.load(Relaxed) > 0 {
            assert!(Instant::now() < give_up, "requests still in flight");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    assert!(
        shard.metrics.abandoned.load(Relaxed) + shard.metrics.dropped_disconnected.load(Relaxed)
            > 0,
        "the disconnected client's requests were dropped"
    );
    assert_nothing_held(&shard, &[&bench.wire().conn, &wire.conn, &conn]);
}
