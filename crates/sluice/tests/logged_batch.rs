//! LOGGED batches across replicas: three `sluice serve` processes on 127.0.0.1-3 with hinted
//! handoff off and a keyspace of replication factor 1, so that each partition of a batch
//! lives on one node and only the transaction log can carry a batch to a node that missed it.
//!
//! The rule tested: a logged batch is refused with nothing written when a replica is known to
//! be down before it is logged (Unavailable), and once it is logged it is applied whole,
//! late on a node that was down (which applies it when it catches up with the log), whatever
//! its answer said (Write_failure or Write_timeout with write type BATCH). The node killed is
//! one that does not lead the metadata group, whose log carries the batches.

mod common;

use std::time::Duration;

use common::cluster::{
    create_simple_keyspace, eventually, query_unless_shed, session_without_retries, token_replicas,
    wait_for_peers, without_colours, Ports, ServeNode, LEADERSHIP_LINE,
};

use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError, WriteType};
use scylla::statement::{Consistency, Statement};

fn at(cl: Consistency, q: &str) -> Statement {
    let mut s = Statement::new(q);
    s.set_consistency(cl);
    s
}

fn db_error(e: &ExecutionError) -> Option<&DbError> {
    match e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, _)) => Some(db),
        _ => None,
    }
}

fn token_of(k: i32) -> i64 {
    sluice_ring::Token::of_key(&k.to_be_bytes()).0
}

/// `v` of row (pk, ck) of `lb.t` read at ONE through `session`.
async fn value(session: &Session, pk: i32, ck: i32) -> Result<Option<String>, ExecutionError> {
    let q = format!("SELECT v FROM lb.t WHERE pk = {pk} AND ck = {ck}");
    let rows = query_unless_shed(session, at(Consistency::One, &q), ())
        .await?
        .into_rows_result()
        .expect("rows");
    Ok(rows
        .maybe_first_row::<(Option<String>,)>()
        .expect("one text column")
        .and_then(|(v,)| v))
}

/// Whether `node`'s latest role line says that it leads the metadata group.
fn leads_metadata_group(node: &ServeNode) -> bool {
    node.output()
        .lines()
        .rfind(|l| l.contains(LEADERSHIP_LINE))
        .is_some_and(|l| without_colours(l).contains("state=Leader"))
}

/// A logged batch writing row (pk, ck) = `v` of each partition.
fn batch(pks: &[i32], ck: i32, v: &str) -> String {
    let mut q = String::from("BEGIN BATCH ");
    for pk in pks {
        q.push_str(&format!(
            "INSERT INTO lb.t (pk, ck, v) VALUES ({pk}, {ck}, '{v}'); "
        ));
    }
    q.push_str("APPLY BATCH");
    q
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_batch_is_applied_whole_or_refused_with_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(3);
    let mut nodes: Vec<ServeNode> = (1..=3)
        .map(|i| ServeNode::start(dir.path(), i, ports, &["--hinted-handoff", "off"]).0)
        .collect();
    let mut sessions = Vec::new();
    for i in 1..=3 {
        sessions.push(session_without_retries(ports.cql_of(i)).await);
    }
    create_simple_keyspace(&sessions[0], "lb", 1).await;
    sessions[0]
        .query_unpaged(
            "CREATE TABLE lb.t (pk int, ck int, v text, PRIMARY KEY (pk, ck))",
            &[],
        )
        .await
        .unwrap();
    // One partition on each node (RF 1), as the server places them.
    let mut on = [None; 3];
    for pk in 0..200 {
        let replicas = token_replicas(&sessions[0], "lb", token_of(pk)).await;
        let [std::net::IpAddr::V4(ip)] = replicas[..] else {
            panic!("pk {pk}: {replicas:?}")
        };
        let node = usize::from(ip.octets()[3]) - 1;
        on[node].get_or_insert(pk);
    }
    let on: Vec<i32> = on
        .iter()
        .map(|p| p.expect("a partition on every node"))
        .collect();
    eprintln!("partitions by node: {on:?}");
    // Every node knows the others before the first batch.
    for session in &sessions {
        wait_for_peers(session, 2).await;
    }

    // All nodes up: through node 1, each partition lands on its own node.
    query_unless_shed(
        &sessions[0],
        at(Consistency::One, &batch(&on, 1, "whole")),
        (),
    )
    .await
    .expect("a logged batch over three nodes");
    for (i, pk) in on.iter().enumerate() {
        assert_eq!(
            value(&sessions[i], *pk, 1).await.unwrap().as_deref(),
            Some("whole"),
            "node {} pk {pk}",
            i + 1
        );
    }

    // A node other than the coordinator that does not lead the metadata group is killed: the
    // log keeps its leader, so the batch sent at once, before the failure detector can know,
    // is logged and then misses the killed node's part.
    let victim = || {
        [2, 1]
            .into_iter()
            .find(|&i| !leads_metadata_group(&nodes[i]))
    };
    eventually(
        "node 2 or node 3 does not lead the metadata group",
        || async { victim().is_some() },
    )
    .await;
    let victim = victim().expect("a node that does not lead");
    let survivor = 3 - victim;
    let leading: Vec<usize> = (0..3)
        .filter(|&i| leads_metadata_group(&nodes[i]))
        .map(|i| i + 1)
        .collect();
    eprintln!(
        "killing node {}; by their logs, nodes {leading:?} lead the metadata group",
        victim + 1
    );
    nodes[victim].kill9();
    let early = query_unless_shed(
        &sessions[0],
        at(Consistency::One, &batch(&on, 2, "late")),
        (),
    )
    .await;
    let logged = match &early {
        Ok(_) => panic!("node {}'s part cannot have been acknowledged", victim + 1),
        Err(e) => match db_error(e) {
            Some(DbError::WriteFailure { write_type, .. })
            | Some(DbError::WriteTimeout { write_type, .. })
                if *write_type == WriteType::Batch =>
            {
                true
            }
            Some(DbError::Unavailable { .. }) => false,
            // BATCH_LOG would mean the log itself stalled, which losing a follower must not do.
            _ => panic!("unexpected answer: {e}"),
        },
    };
    eprintln!("the batch sent right after the kill: {early:?}");

    // Once node 1's detector knows: Unavailable, and nothing of the batch is written.
    eventually("the killed node seen down by node 1", || async {
        matches!(
            value(&sessions[0], on[victim], 1)
                .await
                .as_ref()
                .map_err(db_error),
            Err(Some(DbError::Unavailable { .. }))
        )
    })
    .await;
    let refused = query_unless_shed(
        &sessions[0],
        at(Consistency::One, &batch(&on, 3, "never")),
        (),
    )
    .await
    .expect_err("a replica is down");
    assert!(
        matches!(
            db_error(&refused),
            Some(DbError::Unavailable {
                consistency: Consistency::One,
                required: 1,
                alive: 0
            })
        ),
        "{refused}"
    );
    for i in [0, survivor] {
        assert_eq!(value(&sessions[i], on[i], 3).await.unwrap(), None);
        let early_part = value(&sessions[i], on[i], 2).await.unwrap();
        assert_eq!(early_part.is_some(), logged, "node {} pk {}", i + 1, on[i]);
    }

    // The killed node back: it holds the logged batch's part (from the log, hints being off)
    // and nothing of the refused one.
    nodes[victim].restart();
    let back = session_without_retries(ports.cql_of(victim as u8 + 1)).await;
    if logged {
        eventually("the restarted node applies the logged batch", || async {
            value(&back, on[victim], 2).await.ok().flatten().as_deref() == Some("late")
        })
        .await;
    } else {
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(value(&back, on[victim], 2).await.unwrap(), None);
    }
    assert_eq!(value(&back, on[victim], 3).await.unwrap(), None);
    assert_eq!(
        value(&back, on[victim], 1).await.unwrap().as_deref(),
        Some("whole")
    );
}
