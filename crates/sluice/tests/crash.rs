//! Crash test: a client writes at full speed and records every acknowledged write; the
//! server gets SIGKILL mid-stream, restarts on the same data directory, and every
//! acknowledged row must be there: with the default `batch` durability (ack after fsync)
//! and with `periodic` (ack once the journal buffer is in the OS, which a killed process
//! cannot lose).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, create_keyspace, Node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    acknowledged_writes_survive_kill_9_with(&["--durability", "batch"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9_in_periodic_mode() {
    // No timed fsync during the test: only what reached the OS can survive.
    acknowledged_writes_survive_kill_9_with(&[
        "--durability",
        "periodic",
        "--periodic-sync-ms",
        "600000",
    ])
    .await;
}

async fn acknowledged_writes_survive_kill_9_with(durability: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start(&data, 2, durability);
    let session = Arc::new(connect(&node).await);
    create_keyspace(&session, "crash").await;
    session
        .query_unpaged(
            "CREATE TABLE IF NOT EXISTS crash.t (k bigint PRIMARY KEY, v text)",
            &[],
        )
        .await
        .unwrap();
    let ins = session
        .prepare("INSERT INTO crash.t (k, v) VALUES (?, ?)")
        .await
        .unwrap();

    let acked = Arc::new(Mutex::new(Vec::<i64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..32i64 {
        let (session, ins, acked, stop) =
            (session.clone(), ins.clone(), acked.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut k = w;
            while !stop.load(Ordering::Relaxed) {
                match session
                    .execute_unpaged(&ins, (k, format!("value-{k}")))
                    .await
                {
                    Ok(_) => acked.lock().unwrap().push(k),
                    Err(_) => break, // the server died under us: the write is not acknowledged
                }
                k += 32;
            }
        }));
    }
    // Write at full speed until a good number of rows is acknowledged, then kill -9 while
    // writers are still sending.
    for _ in 0..600 {
        if acked.lock().unwrap().len() >= 3000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.kill9();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = tokio::time::timeout(Duration::from_secs(60), w).await;
    }
    drop(session);
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 100,
        "too few writes acknowledged: {}",
        acked.len()
    );

    let node2 = Node::start(&data, 2, &[]);
    let session = connect(&node2).await;
    let sel = session
        .prepare("SELECT v FROM crash.t WHERE k = ?")
        .await
        .unwrap();
    let mut missing = Vec::new();
    for k in &acked {
        let r = session
            .execute_unpaged(&sel, (*k,))
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        match r.maybe_first_row::<(String,)>().unwrap() {
            Some((v,)) => assert_eq!(v, format!("value-{k}")),
            None => missing.push(*k),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged rows lost after kill -9, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(10)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_flushes_storage_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Periodic durability with a long interval: only the shutdown's flush makes these durable.
    let mut node = Node::start(
        &data,
        2,
        &["--durability", "periodic", "--periodic-sync-ms", "600000"],
    );
    let session = connect(&node).await;
    create_keyspace(&session, "term").await;
    session
        .query_unpaged(
            "CREATE TABLE IF NOT EXISTS term.t (k int PRIMARY KEY, v int)",
            &[],
        )
        .await
        .unwrap();
    let ins = session
        .prepare("INSERT INTO term.t (k, v) VALUES (?, ?)")
        .await
        .unwrap();
    for k in 0..500i32 {
        session.execute_unpaged(&ins, (k, k * 3)).await.unwrap();
    }
    drop(session);
    let status = node.terminate();
    assert!(status.success(), "exit status after SIGTERM: {status}");

    let node2 = Node::start(&data, 2, &[]);
    let session = connect(&node2).await;
    let r = session
        .query_unpaged("SELECT COUNT(*) FROM term.t", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (count,): (i64,) = r.single_row().unwrap();
    assert_eq!(count, 500);
}
