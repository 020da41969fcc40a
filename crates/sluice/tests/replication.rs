//! Three `sluice serve` processes on 127.0.0.1-3 with a keyspace of replication factor 3:
//! a QUORUM write through one node is read at QUORUM through the others and at ONE from each
//! alone; with one node killed (-9), QUORUM still succeeds and ALL answers Unavailable with
//! the driver-parsed counts; the restarted node, which missed writes, returns them once a
//! QUORUM read through it has repaired its copy.

mod common;
use common::cluster::{eventually, LIVENESS_TIMEOUT};

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{session_without_retries, wait_for_peers, Ports, ServeNode};

use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::statement::{Consistency, Statement};

const TABLE_ID: &str = "0b6f3b1e-4c1a-4f7e-9d55-26c0a1d2e3f4";

fn at(cl: Consistency, q: &str) -> Statement {
    let mut s = Statement::new(q);
    s.set_consistency(cl);
    s
}

async fn write(session: &Session, cl: Consistency, q: &str) -> Result<(), ExecutionError> {
    session.query_unpaged(at(cl, q), &[]).await.map(|_| ())
}

/// The value of `rep.t` row (pk, 1), read at `cl`.
async fn value(
    session: &Session,
    cl: Consistency,
    pk: i32,
) -> Result<Option<String>, ExecutionError> {
    let q = format!("SELECT v FROM rep.t WHERE pk = {pk} AND ck = 1");
    let rows = session
        .query_unpaged(at(cl, &q), &[])
        .await?
        .into_rows_result()
        .expect("rows");
    Ok(rows
        .maybe_first_row::<(Option<String>,)>()
        .expect("one text column")
        .and_then(|(v,)| v))
}

fn db_error(e: &ExecutionError) -> Option<&DbError> {
    match e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, _)) => Some(db),
        _ => None,
    }
}

async fn create_schema(session: &Session) {
    for q in [
        "CREATE KEYSPACE IF NOT EXISTS rep WITH replication = \
         {'class': 'SimpleStrategy', 'replication_factor': 3}"
            .to_string(),
        format!(
            "CREATE TABLE IF NOT EXISTS rep.t (pk int, ck int, v text, PRIMARY KEY (pk, ck)) \
             WITH id = {TABLE_ID}"
        ),
    ] {
        session.query_unpaged(q, &[]).await.unwrap();
    }
}

/// Runs `q` at ALL through `session` every 200 ms until it answers Unavailable (the
/// coordinator's failure detector saw a replica go), and returns that error.
async fn until_unavailable(session: &Session, q: &str) -> ExecutionError {
    let deadline = Instant::now() + LIVENESS_TIMEOUT;
    loop {
        if let Err(e) = session.query_unpaged(at(Consistency::All, q), &[]).await {
            if matches!(db_error(&e), Some(DbError::Unavailable { .. })) {
                return e;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{q} at ALL was not Unavailable within {LIVENESS_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Kills node 3 (SIGKILL), drops its session, and waits until the failure detector of each
/// of the first `watchers` nodes sees it gone (ALL answers Unavailable there); returns the
/// first node's Unavailable.
async fn kill_node_3(
    nodes: &mut [ServeNode],
    sessions: &mut Vec<Session>,
    watchers: usize,
) -> ExecutionError {
    assert!(watchers >= 1);
    nodes[2].kill9();
    drop(sessions.pop());
    let mut first = None;
    for session in &sessions[..watchers] {
        let e =
            until_unavailable(session, "INSERT INTO rep.t (pk, ck, v) VALUES (9, 1, 'x')").await;
        first.get_or_insert(e);
    }
    first.expect("one watcher at least")
}

/// Three nodes with the schema, each seeing the whole ring, and a session to each.
async fn three_nodes(dir: &Path, extra: &'static [&'static str]) -> (Vec<ServeNode>, Vec<Session>) {
    let ports = Ports::free_on(3);
    let nodes: Vec<ServeNode> = (1..=3)
        .map(|i| ServeNode::start(dir, i, ports, extra).0)
        .collect();
    let mut sessions = Vec::new();
    for node in &nodes {
        let session = session_without_retries(node.cql()).await;
        create_schema(&session).await;
        sessions.push(session);
    }
    for session in &sessions {
        wait_for_peers(session, 2).await;
    }
    (nodes, sessions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_survives_a_killed_replica_and_read_repair_heals_it() {
    let dir = tempfile::tempdir().unwrap();
    // No hints: the restarted node is healed by read repair alone.
    let (mut nodes, mut sessions) = three_nodes(dir.path(), &["--hinted-handoff", "off"]).await;

    // A QUORUM write through node 1 is read at QUORUM through nodes 2 and 3...
    write(
        &sessions[0],
        Consistency::Quorum,
        "INSERT INTO rep.t (pk, ck, v) VALUES (1, 1, 'a')",
    )
    .await
    .unwrap();
    for session in &sessions[1..] {
        assert_eq!(
            value(session, Consistency::Quorum, 1)
                .await
                .unwrap()
                .as_deref(),
            Some("a")
        );
    }
    // ...and at ONE from each node alone: every live replica got it.
    for (i, session) in sessions.iter().enumerate() {
        assert_eq!(
            value(session, Consistency::One, 1)
                .await
                .unwrap()
                .as_deref(),
            Some("a"),
            "node {}",
            i + 1
        );
    }

    // kill -9 of node 3.
    // Once node 1's failure detector says so, ALL is Unavailable with the right counts.
    let last = kill_node_3(&mut nodes, &mut sessions, 1).await;
    match db_error(&last) {
        Some(DbError::Unavailable {
            consistency,
            required,
            alive,
        }) => {
            assert_eq!(*consistency, Consistency::All);
            assert_eq!((*required, *alive), (3, 2));
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // QUORUM writes and reads still succeed, through either remaining node.
    write(
        &sessions[0],
        Consistency::Quorum,
        "UPDATE rep.t SET v = 'a2' WHERE pk = 1 AND ck = 1",
    )
    .await
    .unwrap();
    write(
        &sessions[1],
        Consistency::Quorum,
        "INSERT INTO rep.t (pk, ck, v) VALUES (2, 1, 'b')",
    )
    .await
    .unwrap();
    assert_eq!(
        value(&sessions[1], Consistency::Quorum, 1)
            .await
            .unwrap()
            .as_deref(),
        Some("a2")
    );
    assert_eq!(
        value(&sessions[0], Consistency::Quorum, 2)
            .await
            .unwrap()
            .as_deref(),
        Some("b")
    );
    // Node 2's own failure detector takes it down too: its ALL reads are Unavailable.
    let e = until_unavailable(&sessions[1], "SELECT v FROM rep.t WHERE pk = 2 AND ck = 1").await;
    assert!(
        matches!(
            db_error(&e),
            Some(DbError::Unavailable {
                required: 3,
                alive: 2,
                ..
            })
        ),
        "{e:?}"
    );

    // Node 3 comes back: it missed both writes.
    nodes[2].restart();
    let node3 = session_without_retries(nodes[2].cql()).await;
    eventually("node 3 sees node 1 up", || async {
        write(
            &node3,
            Consistency::All,
            "INSERT INTO rep.t (pk, ck, v) VALUES (8, 1, 'y')",
        )
        .await
        .is_ok()
    })
    .await;
    assert_eq!(
        value(&node3, Consistency::One, 1).await.unwrap().as_deref(),
        Some("a")
    );
    assert_eq!(value(&node3, Consistency::One, 2).await.unwrap(), None);
    // A QUORUM read through node 3 compares it with another replica and repairs it first.
    assert_eq!(
        value(&node3, Consistency::Quorum, 1)
            .await
            .unwrap()
            .as_deref(),
        Some("a2")
    );
    assert_eq!(
        value(&node3, Consistency::Quorum, 2)
            .await
            .unwrap()
            .as_deref(),
        Some("b")
    );
    // Its own copy now has the data: a read at ONE, on node 3 alone, returns it.
    assert_eq!(
        value(&node3, Consistency::One, 1).await.unwrap().as_deref(),
        Some("a2")
    );
    assert_eq!(
        value(&node3, Consistency::One, 2).await.unwrap().as_deref(),
        Some("b")
    );
    // And node 1 sees node 3 again: ALL succeeds through it.
    eventually("node 1 sees node 3 up", || async {
        write(
            &sessions[0],
            Consistency::All,
            "INSERT INTO rep.t (pk, ck, v) VALUES (7, 1, 'z')",
        )
        .await
        .is_ok()
    })
    .await;
}

/// Hints: writes a killed replica missed reach it once it is back, with no read touching them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_replay_what_a_killed_replica_missed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, mut sessions) = three_nodes(dir.path(), &[]).await;
    kill_node_3(&mut nodes, &mut sessions, 2).await;
    write(
        &sessions[0],
        Consistency::Quorum,
        "INSERT INTO rep.t (pk, ck, v) VALUES (5, 1, 'h1')",
    )
    .await
    .unwrap();
    write(
        &sessions[1],
        Consistency::Quorum,
        "INSERT INTO rep.t (pk, ck, v) VALUES (6, 1, 'h2')",
    )
    .await
    .unwrap();
    nodes[2].restart();
    let node3 = session_without_retries(nodes[2].cql()).await;
    eventually("node 3 got both writes from hints", || async {
        value(&node3, Consistency::One, 5)
            .await
            .ok()
            .flatten()
            .as_deref()
            == Some("h1")
            && value(&node3, Consistency::One, 6)
                .await
                .ok()
                .flatten()
                .as_deref()
                == Some("h2")
    })
    .await;
    let log = nodes[0].output() + &nodes[1].output();
    assert!(log.contains("hints replayed"), "{log}");
}

/// Hints on disk: node 3 down, QUORUM writes through node 1, node 1 restarted (a clean stop,
/// or kill -9 once its hint batch had time to be written), node 3 started: node 3 alone has
/// every row at ONE, with no read above ONE anywhere (no read repair).
async fn hints_survive_a_coordinator_restart(kill_coordinator: bool) {
    const ROWS: std::ops::Range<i32> = 100..150;
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, mut sessions) = three_nodes(dir.path(), &[]).await;
    // Node 1 sees node 3 down before the writes, so that it keeps hints for it.
    kill_node_3(&mut nodes, &mut sessions, 1).await;
    for pk in ROWS {
        write(
            &sessions[0],
            Consistency::Quorum,
            &format!("INSERT INTO rep.t (pk, ck, v) VALUES ({pk}, 1, 'hint{pk}')"),
        )
        .await
        .unwrap();
    }
    drop(sessions);
    if kill_coordinator {
        // Ten times the hint batch interval: the batch is written; nothing else flushes it.
        tokio::time::sleep(Duration::from_secs(1)).await;
        nodes[0].kill9();
    } else {
        nodes[0].shutdown();
    }
    let before_restart = nodes[0].output().len();
    nodes[0].restart();
    nodes[2].restart();
    let node3 = session_without_retries(nodes[2].cql()).await;
    eventually("node 3 holds every row from the replayed hints", || async {
        let mut held = 0;
        for pk in ROWS {
            let v = value(&node3, Consistency::One, pk).await.ok().flatten();
            if v.as_deref() == Some(format!("hint{pk}").as_str()) {
                held += 1;
            }
        }
        held == ROWS.len()
    })
    .await;
    let log = nodes[0].output()[before_restart..].to_owned();
    assert!(log.contains("hints found on disk"), "{log}");
    assert!(log.contains("hints replayed"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_survive_a_clean_restart_of_the_coordinator() {
    hints_survive_a_coordinator_restart(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_survive_a_kill_of_the_coordinator_after_their_batch() {
    hints_survive_a_coordinator_restart(true).await;
}

/// How many of rows (pk, 1) for `pks` the node behind `session` holds, each read at ONE (on
/// a replica, a local read).
async fn held_at_one(session: &Session, pks: std::ops::Range<i32>) -> usize {
    let mut held = 0;
    for pk in pks {
        if value(session, Consistency::One, pk)
            .await
            .unwrap()
            .is_some()
        {
            held += 1;
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncate_empties_the_table_on_every_node_and_is_refused_with_a_node_down() {
    const ROWS: i32 = 40;
    let dir = tempfile::tempdir().unwrap();
    let (mut nodes, mut sessions) = three_nodes(dir.path(), &[]).await;
    for pk in 0..ROWS {
        write(
            &sessions[0],
            Consistency::All,
            &format!("INSERT INTO rep.t (pk, ck, v) VALUES ({pk}, 1, 'v')"),
        )
        .await
        .unwrap();
    }
    for (i, session) in sessions.iter().enumerate() {
        assert_eq!(
            held_at_one(session, 0..ROWS).await,
            ROWS as usize,
            "node {}",
            i + 1
        );
    }
    // TRUNCATE through node 2 answers once every node truncated: no node holds a row.
    sessions[1]
        .query_unpaged("TRUNCATE rep.t", &[])
        .await
        .unwrap();
    for (i, session) in sessions.iter().enumerate() {
        assert_eq!(held_at_one(session, 0..ROWS).await, 0, "node {}", i + 1);
    }

    // With node 3 down (as node 1's failure detector sees it), TRUNCATE is refused with
    // Cassandra's Truncate_error and nothing is truncated.
    write(
        &sessions[0],
        Consistency::Quorum,
        "INSERT INTO rep.t (pk, ck, v) VALUES (1, 1, 'w')",
    )
    .await
    .unwrap();
    kill_node_3(&mut nodes, &mut sessions, 1).await;
    let e = sessions[0]
        .query_unpaged("TRUNCATE rep.t", &[])
        .await
        .unwrap_err();
    match &e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::TruncateError,
            message,
        )) => assert_eq!(
            message,
            "Error during truncate: Cannot achieve consistency level ALL"
        ),
        other => panic!("expected a Truncate_error, got {other:?}"),
    }
    assert_eq!(held_at_one(&sessions[0], 1..2).await, 1);
}
