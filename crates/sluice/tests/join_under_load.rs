//! A fourth node joins a three-node cluster while a token-aware writer inserts at QUORUM into a
//! keyspace of replication factor 3 (and the same keys into one of factor 1), and is
//! decommissioned again while the writer goes on; after each step every acknowledged row is
//! read back at QUORUM (`sluice serve` processes on 127.0.0.1-4).
//!
//! At RF 3 a QUORUM read of the new replicas always meets two old replicas that took every
//! write, so only a replica that refused a write can lose one there; at RF 1 the new replica is
//! the only one read, so a write it missed while it joined is lost to readers.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{create_simple_keyspace, nodetool, Ports, ServeNode};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;

/// Concurrent writers, each inserting as fast as it is answered (a phase writes a few
/// thousand rows on a debug build).
const WRITERS: usize = 8;
/// Most rows the test writes, whatever the phases' lengths.
const MAX_ROWS: i32 = 40_000;
/// Concurrent reads of the check.
const READERS: usize = 16;
/// Writing goes on this long before and after each membership change.
const SETTLE: Duration = Duration::from_secs(1);

/// Keyspaces written: (name, replication factor).
const KEYSPACES: [(&str, u32); 2] = [("jl", 3), ("jl1", 1)];

/// The keys of one table acknowledged at QUORUM so far and how many inserts failed.
#[derive(Default)]
struct Written {
    acked: Mutex<Vec<i32>>,
    failed: AtomicU64,
}

/// Inserts rows `next..` at QUORUM from `WRITERS` tasks until `stop`, recording each
/// acknowledged key.
fn start_writer(
    session: Arc<Session>,
    inserts: Vec<PreparedStatement>,
    next: Arc<AtomicI32>,
    stop: Arc<AtomicBool>,
    written: Vec<Arc<Written>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..WRITERS)
        .map(|_| {
            let (session, inserts, next, stop, written) = (
                session.clone(),
                inserts.clone(),
                next.clone(),
                stop.clone(),
                written.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= MAX_ROWS {
                        break;
                    }
                    for (insert, written) in inserts.iter().zip(&written) {
                        match session.execute_unpaged(insert, (k, k)).await {
                            Ok(_) => written.acked.lock().unwrap().push(k),
                            Err(_) => {
                                written.failed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            })
        })
        .collect()
}

async fn stop_writer(stop: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(false, Ordering::Relaxed);
}

/// Reads every key of `keys` at QUORUM; returns the keys read back without their row (or
/// with another value) and the keys no read of five could answer.
async fn unreadable(
    session: &Arc<Session>,
    select: &PreparedStatement,
    keys: &[i32],
) -> (Vec<i32>, Vec<i32>) {
    let keys = Arc::new(keys.to_vec());
    let cursor = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..READERS {
        let (session, select, keys, cursor) = (
            session.clone(),
            select.clone(),
            keys.clone(),
            cursor.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let (mut missing, mut errors) = (Vec::new(), Vec::new());
            loop {
                let i = cursor.fetch_add(1, Ordering::Relaxed);
                let Some(&k) = keys.get(i) else { break };
                let mut answer = None;
                for _ in 0..5 {
                    match session.execute_unpaged(&select, (k,)).await {
                        Ok(r) => {
                            let rows = r.into_rows_result().unwrap();
                            answer = Some(rows.maybe_first_row::<(i32,)>().unwrap());
                            break;
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
                match answer {
                    Some(Some((v,))) if v == k => {}
                    Some(_) => missing.push(k),
                    None => errors.push(k),
                }
            }
            (missing, errors)
        }));
    }
    let (mut missing, mut errors) = (Vec::new(), Vec::new());
    for t in tasks {
        let (m, e) = t.await.unwrap();
        missing.extend(m);
        errors.extend(e);
    }
    missing.sort_unstable();
    errors.sort_unstable();
    (missing, errors)
}

/// Checks that every key acknowledged so far in each keyspace reads back at QUORUM (every
/// keyspace is read and reported before the first failure is raised); returns how many keys
/// the RF 3 keyspace had.
async fn check_all(
    stage: &str,
    session: &Arc<Session>,
    selects: &[PreparedStatement],
    written: &[Arc<Written>],
) -> usize {
    let mut failures = Vec::new();
    let mut counts = Vec::new();
    for (((ks, _), select), written) in KEYSPACES.iter().zip(selects).zip(written) {
        let keys = written.acked.lock().unwrap().clone();
        let started = Instant::now();
        let (missing, errors) = unreadable(session, select, &keys).await;
        println!(
            "{stage}: {ks}: {} acknowledged rows ({} inserts failed), {} missing at QUORUM, \
             {} unanswered, checked in {:?}",
            keys.len(),
            written.failed.load(Ordering::Relaxed),
            missing.len(),
            errors.len(),
            started.elapsed()
        );
        if !missing.is_empty() {
            failures.push(format!(
                "{ks}: {} of {} acknowledged rows not read back at QUORUM, e.g. {:?}",
                missing.len(),
                keys.len(),
                &missing[..missing.len().min(20)]
            ));
        }
        if !errors.is_empty() {
            failures.push(format!(
                "{ks}: {} reads failed five times, e.g. {:?}",
                errors.len(),
                &errors[..errors.len().min(20)]
            ));
        }
        counts.push(keys.len());
    }
    assert!(failures.is_empty(), "{stage}: {failures:?}");
    counts[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_and_leaves_under_quorum_writes_and_loses_no_acknowledged_row() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(4);
    let mut nodes = Vec::new();
    for index in 1..=3 {
        nodes.push(ServeNode::start(dir.path(), index, ports, &[]).0);
    }
    let session = Arc::new(
        SessionBuilder::new()
            .known_nodes((1..=3).map(|i| ports.cql_of(i).to_string()))
            .connection_timeout(Duration::from_secs(20))
            .schema_agreement_timeout(Duration::from_secs(10))
            .build()
            .await
            .expect("connect"),
    );
    let (mut inserts, mut selects) = (Vec::new(), Vec::new());
    for (ks, rf) in KEYSPACES {
        create_simple_keyspace(&session, ks, rf).await;
        session
            .query_unpaged(
                format!("CREATE TABLE {ks}.t (k int PRIMARY KEY, v int)"),
                &[],
            )
            .await
            .unwrap();
    }
    session.await_schema_agreement().await.unwrap();
    for (ks, _) in KEYSPACES {
        let mut insert = session
            .prepare(format!("INSERT INTO {ks}.t (k, v) VALUES (?, ?)"))
            .await
            .unwrap();
        insert.set_consistency(Consistency::Quorum);
        inserts.push(insert);
        let mut select = session
            .prepare(format!("SELECT v FROM {ks}.t WHERE k = ?"))
            .await
            .unwrap();
        select.set_consistency(Consistency::Quorum);
        select.set_is_idempotent(true);
        selects.push(select);
    }

    let next = Arc::new(AtomicI32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let written: Vec<Arc<Written>> = KEYSPACES.iter().map(|_| Arc::default()).collect();

    // The same writer runs under the join and under the decommission.
    let start = || {
        start_writer(
            session.clone(),
            inserts.clone(),
            next.clone(),
            stop.clone(),
            written.clone(),
        )
    };

    // Join under load.
    let writer = start();
    tokio::time::sleep(SETTLE).await;
    let dir_path = dir.path().to_path_buf();
    let (fourth, took) =
        tokio::task::spawn_blocking(move || ServeNode::start(&dir_path, 4, ports, &[]))
            .await
            .unwrap();
    println!("node 4 joined and opened its CQL port in {took:?}");
    tokio::time::sleep(SETTLE).await;
    stop_writer(&stop, writer).await;
    let after_join = check_all(
        &format!("after the join ({took:?})"),
        &session,
        &selects,
        &written,
    )
    .await;

    // Decommission under load.
    let writer = start();
    tokio::time::sleep(SETTLE).await;
    let answer = tokio::task::spawn_blocking(move || nodetool(4, ports, 60, &["decommission"]))
        .await
        .unwrap();
    assert!(answer.contains("decommissioned"), "{answer}");
    let mut fourth = fourth;
    let exit = fourth.wait_exit(Duration::from_secs(30));
    assert!(exit.success(), "node 4: {exit}: {}", fourth.output());
    tokio::time::sleep(SETTLE).await;
    stop_writer(&stop, writer).await;
    let after_leave = check_all("after the decommission", &session, &selects, &written).await;
    assert!(
        after_leave > after_join && after_join > 0,
        "the writer made no progress: {after_join} then {after_leave} rows"
    );
    assert!(
        next.load(Ordering::Relaxed) < MAX_ROWS,
        "the writer ran out of keys before the end"
    );
    println!("test took {:?}", started.elapsed());
    drop(nodes);
}
