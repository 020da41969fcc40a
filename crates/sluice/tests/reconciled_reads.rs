//! Reads that need more than one node's copy, on three `sluice serve` processes on
//! 127.0.0.1-3 (8 tokens each, hinted handoff off so that a node that was down misses the
//! writes it was down for).
//!
//! - RF 3: node 1 is killed, rows are written at QUORUM through node 2, node 1 comes back
//!   without them. Through node 1, a scan and COUNT(*) at ONE read its own stale copy; at
//!   QUORUM they see every row (each page reconciled with another replica), and node 1's copy
//!   is repaired by it.
//! - RF 1: a multi-partition IN through each node and through a round-robin session answers
//!   every row, in the IN's order, paged and unpaged, with LIMIT.
//!
//! No driver retries: only a request the node's admission sheds under the shared machine's
//! load ("Server is overloaded") is asked again, bounded.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use common::cluster::{
    create_simple_keyspace, page_of, round_robin_session, session_without_retries, token_replicas,
    wait_for_peers, Ports, ServeNode, LIVENESS_TIMEOUT,
};

use scylla::client::session::Session;
use scylla::response::PagingState;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;

async fn prepare(session: &Session, q: &str, cl: Consistency, page: i32) -> PreparedStatement {
    let mut p = session.prepare(q).await.unwrap();
    p.set_consistency(cl);
    p.set_page_size(page);
    p
}

/// Every row of `q` (selecting pk, ck, v), page by page, in the order they came.
async fn all_rows(
    session: &Session,
    q: &str,
    cl: Consistency,
    page: i32,
) -> Result<Vec<(i32, i32, String)>, scylla::errors::ExecutionError> {
    let prepared = prepare(session, q, cl, page).await;
    let mut rows = Vec::new();
    let mut state = PagingState::start();
    for n in 0.. {
        assert!(n < 1000, "{q}: paging did not end");
        let (result, next) = page_of(session, &prepared, (), &state).await?;
        let result = result.into_rows_result().unwrap();
        assert!(
            result.rows_num() <= page as usize,
            "a page holds at most its size"
        );
        for row in result.rows::<(i32, i32, String)>().unwrap() {
            rows.push(row.unwrap());
        }
        match next.into_paging_control_flow() {
            ControlFlow::Break(()) => break,
            ControlFlow::Continue(s) => state = s,
        }
    }
    Ok(rows)
}

async fn count(
    session: &Session,
    q: &str,
    cl: Consistency,
) -> Result<i64, scylla::errors::ExecutionError> {
    let prepared = prepare(session, q, cl, 100).await;
    let (result, _) = page_of(session, &prepared, (), &PagingState::start()).await?;
    Ok(result
        .into_rows_result()
        .unwrap()
        .single_row::<(i64,)>()
        .unwrap()
        .0)
}

fn start_three(dir: &std::path::Path) -> (Ports, Vec<ServeNode>) {
    let ports = Ports::free_on(3);
    let nodes = (1..=3)
        .map(|i| ServeNode::start(dir, i, ports, &["--hinted-handoff", "off"]).0)
        .collect();
    (ports, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_scans_see_the_writes_a_restarted_replica_missed() {
    let dir = tempfile::tempdir().unwrap();
    let (ports, mut nodes) = start_three(dir.path());
    let node2 = session_without_retries(ports.cql_of(2)).await;
    wait_for_peers(&node2, 2).await;
    create_simple_keyspace(&node2, "r3", 3).await;
    node2
        .query_unpaged(
            "CREATE TABLE r3.t (pk int, ck int, v text, PRIMARY KEY (pk, ck))",
            &[],
        )
        .await
        .unwrap();
    // Node 1 dies; node 2 writes 30 partitions of 2 rows at QUORUM: nodes 2 and 3 take them
    // (node 1 fails at once, or is known down and, with hints off, gets nothing later).
    nodes[0].kill9();
    let insert = prepare(
        &node2,
        "INSERT INTO r3.t (pk, ck, v) VALUES (?, ?, ?)",
        Consistency::Quorum,
        100,
    )
    .await;
    let mut want = BTreeSet::new();
    let started = Instant::now();
    for pk in 0..30 {
        for ck in 0..2 {
            let v = format!("{pk}-{ck}");
            while let Err(e) =
                page_of(&node2, &insert, (pk, ck, v.clone()), &PagingState::start()).await
            {
                assert!(started.elapsed() < LIVENESS_TIMEOUT, "({pk}, {ck}): {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            want.insert((pk, ck, v));
        }
    }
    // Node 1 is back without them (no hints).
    nodes[0].restart();
    let node1 = session_without_retries(ports.cql_of(1)).await;
    let count_q = "SELECT COUNT(*) FROM r3.t";
    let stale = count(&node1, count_q, Consistency::One).await.unwrap();
    assert_eq!(
        stale, 0,
        "node 1 holds none of the rows written while it was down"
    );
    let scan = "SELECT pk, ck, v FROM r3.t";
    assert!(all_rows(&node1, scan, Consistency::One, 7)
        .await
        .unwrap()
        .is_empty());
    // QUORUM through node 1 (once it sees a peer up again): every row, each page
    // compared with another replica's.
    let deadline = Instant::now() + LIVENESS_TIMEOUT;
    let counted = loop {
        match count(&node1, count_q, Consistency::Quorum).await {
            Ok(n) => break n,
            Err(e) => {
                assert!(Instant::now() < deadline, "COUNT(*) at QUORUM: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(counted, 60);
    // The reconciled pages repaired node 1's copy: ONE now reads every row there.
    assert_eq!(count(&node1, count_q, Consistency::One).await.unwrap(), 60);
    let rows = all_rows(&node1, scan, Consistency::Quorum, 7)
        .await
        .unwrap();
    let unique: BTreeSet<_> = rows.iter().cloned().collect();
    assert_eq!(unique.len(), rows.len(), "a row came twice");
    assert_eq!(unique, want);
    let rows = all_rows(&node1, scan, Consistency::All, 50).await.unwrap();
    assert_eq!(rows.into_iter().collect::<BTreeSet<_>>(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_across_nodes_answers_every_row_in_its_order_through_any_node() {
    let dir = tempfile::tempdir().unwrap();
    let (ports, _nodes) = start_three(dir.path());
    let addrs: Vec<SocketAddr> = (1..=3).map(|i| ports.cql_of(i)).collect();
    let mut pinned = Vec::new();
    for addr in &addrs {
        let session = session_without_retries(*addr).await;
        wait_for_peers(&session, 2).await;
        pinned.push(session);
    }
    create_simple_keyspace(&pinned[0], "r1", 1).await;
    pinned[0]
        .query_unpaged(
            "CREATE TABLE r1.t (pk int, ck int, v text, PRIMARY KEY (pk, ck))",
            &[],
        )
        .await
        .unwrap();
    let insert = prepare(
        &pinned[0],
        "INSERT INTO r1.t (pk, ck, v) VALUES (?, ?, ?)",
        Consistency::One,
        100,
    )
    .await;
    for pk in 0..12 {
        for ck in 0..3 {
            page_of(
                &pinned[0],
                &insert,
                (pk, ck, format!("{pk}-{ck}")),
                &PagingState::start(),
            )
            .await
            .unwrap_or_else(|e| panic!("({pk}, {ck}): {e}"));
        }
    }
    // Twelve partitions at RF 1 on three nodes of 8 tokens: every node holds only some.
    let order = [11, 0, 7, 3, 9, 1, 5];
    let list = order.map(|pk| pk.to_string()).join(", ");
    let q = format!("SELECT pk, ck, v FROM r1.t WHERE pk IN ({list})");
    let want: Vec<(i32, i32, String)> = order
        .iter()
        .flat_map(|&pk| (0..3).map(move |ck| (pk, ck, format!("{pk}-{ck}"))))
        .collect();
    // Their replicas: more than one node, so that no node holds every partition of the IN.
    let mut owners = BTreeSet::new();
    for pk in order {
        let rows = pinned[0]
            .query_unpaged("SELECT token(pk) FROM r1.t WHERE pk = ? LIMIT 1", (pk,))
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        let (token,): (i64,) = rows.first_row().unwrap();
        owners.extend(token_replicas(&pinned[0], "r1", token).await);
    }
    assert!(owners.len() > 1, "the IN's partitions live on {owners:?}");
    let rr = round_robin_session(&addrs).await;
    for (label, session) in [
        ("node 1", &pinned[0]),
        ("node 2", &pinned[1]),
        ("node 3", &pinned[2]),
        ("round robin", &rr),
    ] {
        for page in [2, 5, 100] {
            let rows = all_rows(session, &q, Consistency::One, page)
                .await
                .unwrap_or_else(|e| panic!("{label}, pages of {page}: {e}"));
            assert_eq!(rows, want, "{label}, pages of {page}");
        }
        let rows = all_rows(session, &format!("{q} LIMIT 8"), Consistency::One, 3)
            .await
            .unwrap_or_else(|e| panic!("{label} LIMIT: {e}"));
        assert_eq!(rows, want[..8], "{label} LIMIT 8");
        let n = count(
            session,
            &format!("SELECT COUNT(*) FROM r1.t WHERE pk IN ({list})"),
            Consistency::One,
        )
        .await
        .unwrap_or_else(|e| panic!("{label} COUNT(*): {e}"));
        assert_eq!(n, 21, "{label} COUNT(*)");
    }
}
