//! Reads through any node: three `sluice serve` processes on 127.0.0.1-3, keyspaces of
//! replication factor 1 and 2, so that most partitions are not on the node asked. Every node
//! answers every single-partition read (paged, at ONE and QUORUM) and every scan (SELECT *
//! paged with a small page size, each page asked of the next node, and COUNT(*)) with every
//! row exactly once; so does a round-robin (not token-aware) driver session. With RF 2 and one
//! node killed, both survivors still answer every read at ONE. No driver retries:
//! only a request the node's admission sheds under the shared machine's load ("Server is
//! overloaded") is asked again, bounded; the old "not a replica" refusal fails the test.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use common::cluster::{
    create_simple_keyspace, page_of, round_robin_session, session_without_retries, wait_for_peers,
    Ports, ServeNode, LIVENESS_TIMEOUT,
};

use scylla::client::session::Session;
use scylla::response::PagingState;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;

const PARTITIONS: i32 = 40;
const ROWS_PER_PARTITION: i32 = 3;

fn expected_rows() -> BTreeSet<(i32, i32, String)> {
    (0..PARTITIONS)
        .flat_map(|pk| (0..ROWS_PER_PARTITION).map(move |ck| (pk, ck, format!("{pk}-{ck}"))))
        .collect()
}

async fn prepare(session: &Session, q: &str, cl: Consistency, page: i32) -> PreparedStatement {
    let mut p = session.prepare(q).await.unwrap();
    p.set_consistency(cl);
    p.set_page_size(page);
    p
}

/// Pages through `SELECT pk, ck, v` asking each page of the next session in `sessions`: the
/// paging state one node returned resumes the scan on another.
async fn scan_rotating(
    sessions: &[&Session],
    ks: &str,
    cl: Consistency,
) -> Vec<(i32, i32, String)> {
    let q = format!("SELECT pk, ck, v FROM {ks}.t");
    let mut prepared = Vec::new();
    for s in sessions {
        prepared.push(prepare(s, &q, cl, 7).await);
    }
    let mut rows = Vec::new();
    let mut state = PagingState::start();
    for page in 0.. {
        assert!(page < 1000, "the scan of {ks} did not end");
        let i = page % sessions.len();
        let (result, next) = page_of(sessions[i], &prepared[i], (), &state)
            .await
            .unwrap_or_else(|e| panic!("page {page} of {ks} through session {i}: {e}"));
        let result = result.into_rows_result().unwrap();
        assert!(result.rows_num() <= 7, "a page holds at most its size");
        for row in result.rows::<(i32, i32, String)>().unwrap() {
            rows.push(row.unwrap());
        }
        match next.into_paging_control_flow() {
            ControlFlow::Break(()) => break,
            ControlFlow::Continue(s) => state = s,
        }
    }
    rows
}

/// Every read `session` can make of `ks` at `cl` answers every row: each partition (paged
/// two rows at a time), the whole table (paged), and COUNT(*).
async fn check_reads(label: &str, sessions: &[&Session], ks: &str, cl: Consistency) {
    let session = sessions[0];
    let by_pk = prepare(
        session,
        &format!("SELECT ck, v FROM {ks}.t WHERE pk = ?"),
        cl,
        2,
    )
    .await;
    for pk in 0..PARTITIONS {
        let mut got = Vec::new();
        let mut state = PagingState::start();
        loop {
            let (result, next) = page_of(session, &by_pk, (pk,), &state)
                .await
                .unwrap_or_else(|e| panic!("{label}: {ks} pk {pk}: {e}"));
            for row in result
                .into_rows_result()
                .unwrap()
                .rows::<(i32, String)>()
                .unwrap()
            {
                got.push(row.unwrap());
            }
            match next.into_paging_control_flow() {
                ControlFlow::Break(()) => break,
                ControlFlow::Continue(s) => state = s,
            }
        }
        let want: Vec<(i32, String)> = (0..ROWS_PER_PARTITION)
            .map(|ck| (ck, format!("{pk}-{ck}")))
            .collect();
        assert_eq!(got, want, "{label}: {ks} pk {pk}");
    }
    let scanned = scan_rotating(sessions, ks, cl).await;
    let unique: BTreeSet<_> = scanned.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        scanned.len(),
        "{label}: {ks}: a row came twice"
    );
    assert_eq!(unique, expected_rows(), "{label}: {ks}: SELECT *");
    let count = prepare(session, &format!("SELECT COUNT(*) FROM {ks}.t"), cl, 5).await;
    let (result, _) = page_of(session, &count, (), &PagingState::start())
        .await
        .unwrap_or_else(|e| panic!("{label}: {ks} COUNT(*): {e}"));
    let (n,): (i64,) = result.into_rows_result().unwrap().single_row().unwrap();
    assert_eq!(
        n,
        i64::from(PARTITIONS * ROWS_PER_PARTITION),
        "{label}: {ks} COUNT(*)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_answers_every_read_at_rf1_and_rf2() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(3);
    let _nodes: Vec<ServeNode> = (1..=3)
        .map(|i| ServeNode::start(dir.path(), i, ports, &[]).0)
        .collect();
    let addrs: Vec<SocketAddr> = (1..=3).map(|i| ports.cql_of(i)).collect();
    let mut pinned = Vec::new();
    for addr in &addrs {
        pinned.push(session_without_retries(*addr).await);
    }
    for (ks, rf) in [("r1", 1), ("r2", 2)] {
        create_simple_keyspace(&pinned[0], ks, rf).await;
        pinned[0]
            .query_unpaged(
                format!("CREATE TABLE {ks}.t (pk int, ck int, v text, PRIMARY KEY (pk, ck))"),
                &[],
            )
            .await
            .unwrap();
    }
    // Every node sees the whole ring and is up for the others before reads go through it.
    for session in &pinned {
        wait_for_peers(session, 2).await;
    }
    let rr = round_robin_session(&addrs).await;
    for (ks, cl) in [("r1", Consistency::One), ("r2", Consistency::Quorum)] {
        let insert = prepare(
            &rr,
            &format!("INSERT INTO {ks}.t (pk, ck, v) VALUES (?, ?, ?)"),
            cl,
            100,
        )
        .await;
        for (pk, ck, v) in expected_rows() {
            page_of(&rr, &insert, (pk, ck, v.clone()), &PagingState::start())
                .await
                .unwrap_or_else(|e| panic!("{ks} ({pk}, {ck}): {e}"));
        }
    }
    for (ks, cl) in [("r1", Consistency::One), ("r2", Consistency::Quorum)] {
        for i in 0..3 {
            // Each node alone for the partition reads; the scan's pages rotate from it.
            let rotation: Vec<&Session> = (0..3).map(|k| &pinned[(i + k) % 3]).collect();
            check_reads(&format!("node {}", i + 1), &rotation, ks, cl).await;
        }
        check_reads("round robin", &[&rr], ks, cl).await;
    }
    // RF 2 at ONE too, through every node: each read on a single replica.
    for i in 0..3 {
        let rotation: Vec<&Session> = (0..3).map(|k| &pinned[(i + k) % 3]).collect();
        check_reads(
            &format!("node {} at ONE", i + 1),
            &rotation,
            "r2",
            Consistency::One,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_through_any_node_go_around_a_dead_replica() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(3);
    let mut nodes: Vec<ServeNode> = (1..=3)
        .map(|i| ServeNode::start(dir.path(), i, ports, &[]).0)
        .collect();
    let mut pinned = Vec::new();
    for i in 1..=3 {
        pinned.push(session_without_retries(ports.cql_of(i)).await);
    }
    for q in [
        "CREATE KEYSPACE r2 WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 2}",
        "CREATE TABLE r2.t (pk int, ck int, v text, PRIMARY KEY (pk, ck))",
    ] {
        pinned[0].query_unpaged(q, &[]).await.unwrap();
    }
    let insert = prepare(
        &pinned[0],
        "INSERT INTO r2.t (pk, ck, v) VALUES (?, ?, ?)",
        Consistency::All,
        100,
    )
    .await;
    let started = Instant::now();
    for (pk, ck, v) in expected_rows() {
        // ALL until the nodes have seen each other up (a fresh start), then every row is on
        // both of its replicas.
        while let Err(e) = page_of(
            &pinned[0],
            &insert,
            (pk, ck, v.clone()),
            &PagingState::start(),
        )
        .await
        {
            assert!(
                started.elapsed() < LIVENESS_TIMEOUT,
                "({pk}, {ck}) at ALL: {e}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // Node 3 dies: every partition still has a live replica.
    nodes[2].kill9();
    pinned.pop();
    let alive: Vec<&Session> = pinned.iter().collect();
    // Once both survivors' failure detectors have seen it go, every read through either of
    // them, forwarded or scanned, is answered by a live replica.
    let count = prepare(&pinned[0], "SELECT COUNT(*) FROM r2.t", Consistency::One, 5).await;
    let deadline = Instant::now() + LIVENESS_TIMEOUT;
    for session in &alive {
        loop {
            let counted = page_of(session, &count, (), &PagingState::start())
                .await
                .ok()
                .and_then(|(r, _)| r.into_rows_result().ok())
                .and_then(|r| r.single_row::<(i64,)>().ok());
            if counted == Some((i64::from(PARTITIONS * ROWS_PER_PARTITION),)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "COUNT(*) with node 3 dead: {counted:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    check_reads("node 1, node 3 dead", &alive, "r2", Consistency::One).await;
    let reversed: Vec<&Session> = alive.iter().rev().copied().collect();
    check_reads("node 2, node 3 dead", &reversed, "r2", Consistency::One).await;
}
