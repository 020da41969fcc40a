//! Schema through the metadata group on three `sluice serve` processes (127.0.0.1-3, the
//! second and third joining through the first): DDL on one node is usable on every node, the
//! three `schema_version`s agree, the Rust driver's schema-agreement wait ends in under a
//! second, concurrent DDL from two nodes converges, and a node restarted after a change it
//! missed has that change before its CQL port opens; each row of `system.peers` shows that
//! peer's own schema version (a stopped node's stays at the one it had).

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::cluster::{
    query_unless_shed, session_on, session_on_without_agreement_wait, Ports, ServeNode,
};
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use uuid::Uuid;

const NODES: u8 = 3;
/// The bound on a driver's schema-agreement wait.
const AGREEMENT_BOUND: Duration = Duration::from_secs(1);
/// DDL's deadline, so that a DDL without a quorum fails within the test's bounds.
const OTHER_TIMEOUT: &[&str] = &["--other-timeout", "3s"];

async fn schema_version(session: &Session) -> Uuid {
    let rows = query_unless_shed(
        session,
        "SELECT schema_version FROM system.local WHERE key = 'local'",
        (),
    )
    .await
    .unwrap()
    .into_rows_result()
    .unwrap();
    let (version,): (Uuid,) = rows.single_row().unwrap();
    version
}

async fn table_id(session: &Session, table: &str) -> Option<Uuid> {
    let rows = query_unless_shed(
        session,
        "SELECT id FROM system_schema.tables WHERE keyspace_name = 'ks' AND table_name = ?",
        (table,),
    )
    .await
    .unwrap()
    .into_rows_result()
    .unwrap();
    rows.maybe_first_row::<(Uuid,)>().unwrap().map(|(id,)| id)
}

/// Runs `statement` on `session` and returns how long it took; the driver's automatic
/// schema-agreement wait is part of it.
async fn timed(session: &Session, statement: &str) -> Duration {
    let started = Instant::now();
    session
        .query_unpaged(statement, &[])
        .await
        .unwrap_or_else(|e| panic!("{statement}: {e}"));
    started.elapsed()
}

/// Asserts that the three nodes report one schema version, and returns it.
async fn one_version(sessions: &[Session]) -> Uuid {
    let mut versions = Vec::new();
    for session in sessions {
        versions.push(schema_version(session).await);
    }
    assert!(
        versions.iter().all(|v| *v == versions[0]),
        "schema versions differ: {versions:?}"
    );
    versions[0]
}

/// Creates `ks.burst0` .. `ks.burst4` if they do not exist, one after another.
async fn create_burst(session: &Session) {
    for i in 0..5 {
        session
            .query_unpaged(
                format!("CREATE TABLE IF NOT EXISTS ks.burst{i} (pk int PRIMARY KEY, v int)"),
                &[],
            )
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_goes_through_the_group_and_every_node_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(NODES);
    let mut nodes = Vec::new();
    for index in 1..=NODES {
        nodes.push(ServeNode::start(dir.path(), index, ports, OTHER_TIMEOUT).0);
    }
    let addrs: Vec<SocketAddr> = (1..=NODES).map(|k| ports.cql_of(k)).collect();
    let mut sessions = Vec::new();
    for addr in &addrs {
        sessions.push(session_on(*addr).await);
    }
    let before = one_version(&sessions).await;

    // DDL on node 1; the driver waits for agreement over all three nodes after each.
    let took = timed(
        &sessions[0],
        "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}",
    )
    .await;
    println!("CREATE KEYSPACE with the driver's agreement wait: {took:?}");
    let took = timed(
        &sessions[0],
        "CREATE TABLE ks.t (pk int PRIMARY KEY, v text)",
    )
    .await;
    println!("CREATE TABLE with the driver's agreement wait: {took:?}");
    assert!(took < Duration::from_secs(5), "CREATE TABLE took {took:?}");
    let started = Instant::now();
    sessions[0].await_schema_agreement().await.unwrap();
    let agreement = started.elapsed();
    println!("await_schema_agreement after CREATE TABLE: {agreement:?}");
    assert!(agreement < AGREEMENT_BOUND, "agreement took {agreement:?}");
    let after = one_version(&sessions).await;
    assert_ne!(before, after);

    // Without the driver's wait: how long after node 1 answers do all three nodes report
    // the new version (the followers apply once they learn the commit)?
    let bare = SessionBuilder::new()
        .known_node(addrs[0].to_string())
        .auto_await_schema_agreement(false)
        .build()
        .await
        .unwrap();
    let took = timed(&bare, "ALTER TABLE ks.t WITH comment = 'one'").await;
    let answered = Instant::now();
    let expected = schema_version(&sessions[0]).await;
    loop {
        let mut agreed = true;
        for session in &sessions[1..] {
            agreed &= schema_version(session).await == expected;
        }
        if agreed {
            break;
        }
        assert!(
            answered.elapsed() < AGREEMENT_BOUND,
            "nodes 2 and 3 did not follow"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    println!(
        "ALTER TABLE answered in {took:?}; nodes 2 and 3 reported its version {:?} later",
        answered.elapsed()
    );
    drop(bare);

    // The table is usable from every node, with one id.
    let id = table_id(&sessions[0], "t").await.expect("node 1 has ks.t");
    for (k, session) in sessions.iter().enumerate() {
        assert_eq!(table_id(session, "t").await, Some(id), "node {}", k + 1);
        session
            .query_unpaged("INSERT INTO ks.t (pk, v) VALUES (?, 'x')", (k as i32,))
            .await
            .unwrap();
        let rows = session
            .query_unpaged("SELECT v FROM ks.t WHERE pk = ?", (k as i32,))
            .await
            .unwrap()
            .into_rows_result()
            .unwrap();
        assert_eq!(rows.rows_num(), 1, "node {}", k + 1);
    }

    // Concurrent DDL from nodes 2 and 3: the same CREATE TABLE IF NOT EXISTS, and two
    // different tables. One table of each name, one version everywhere.
    let (s2, s3) = (&sessions[1], &sessions[2]);
    let same = "CREATE TABLE IF NOT EXISTS ks.same (pk int PRIMARY KEY, v int)";
    let (a, b) = tokio::join!(s2.query_unpaged(same, &[]), s3.query_unpaged(same, &[]));
    a.unwrap();
    b.unwrap();
    let (a, b) = tokio::join!(
        s2.query_unpaged("CREATE TABLE ks.from2 (pk int PRIMARY KEY)", &[]),
        s3.query_unpaged("CREATE TABLE ks.from3 (pk int PRIMARY KEY)", &[])
    );
    a.unwrap();
    b.unwrap();
    let started = Instant::now();
    sessions[1].await_schema_agreement().await.unwrap();
    let agreement = started.elapsed();
    println!("await_schema_agreement after concurrent DDL: {agreement:?}");
    assert!(agreement < AGREEMENT_BOUND, "agreement took {agreement:?}");
    one_version(&sessions).await;
    for table in ["same", "from2", "from3"] {
        let id = table_id(&sessions[0], table).await;
        assert!(id.is_some(), "ks.{table} is missing");
        for session in &sessions[1..] {
            assert_eq!(table_id(session, table).await, id, "ks.{table}");
        }
    }

    // A burst: all three nodes create the same five tables at once, in the same order; each
    // name ends up with one id on every node.
    let started = Instant::now();
    tokio::join!(
        create_burst(&sessions[0]),
        create_burst(&sessions[1]),
        create_burst(&sessions[2])
    );
    println!(
        "15 concurrent CREATE TABLE IF NOT EXISTS of 5 tables: {:?}",
        started.elapsed()
    );
    one_version(&sessions).await;
    for i in 0..5 {
        let table = format!("burst{i}");
        let id = table_id(&sessions[0], &table).await;
        assert!(id.is_some(), "ks.{table} is missing");
        for session in &sessions[1..] {
            assert_eq!(table_id(session, &table).await, id, "ks.{table}");
        }
    }

    // Node 3 stops; a table is created and one altered while it is down. Restarted, it has
    // both before its CQL port accepts: the first statements on it find them.
    drop(sessions.pop());
    nodes.pop().unwrap().stop();
    sessions[0]
        .query_unpaged("CREATE TABLE ks.late (pk int PRIMARY KEY, v text)", &[])
        .await
        .unwrap();
    sessions[1]
        .query_unpaged("ALTER TABLE ks.t ADD w int", &[])
        .await
        .unwrap();
    let (node3, start_time) = ServeNode::start(dir.path(), 3, ports, OTHER_TIMEOUT);
    println!("node 3 restarted and opened its CQL port in {start_time:?}");
    nodes.push(node3);
    let s3 = session_on(addrs[2]).await;
    s3.query_unpaged("INSERT INTO ks.late (pk, v) VALUES (1, 'late')", &[])
        .await
        .unwrap();
    s3.query_unpaged("INSERT INTO ks.t (pk, v, w) VALUES (9, 'y', 9)", &[])
        .await
        .unwrap();
    sessions.push(s3);
    one_version(&sessions).await;
    assert_eq!(
        table_id(&sessions[2], "late").await,
        table_id(&sessions[0], "late").await
    );

    // DROP from node 3 reaches the others.
    timed(&sessions[2], "DROP TABLE ks.late").await;
    for session in &sessions {
        assert_eq!(table_id(session, "late").await, None);
    }
    let version = one_version(&sessions).await;

    // Nodes 2 and 3 stop: the group has no quorum, and a DDL through node 1 answers a
    // Server_error naming the metadata group at its deadline (3 s), changing nothing.
    let s1 = sessions.remove(0);
    drop(sessions);
    let node1 = nodes.remove(0);
    for node in nodes {
        node.stop();
    }
    let started = Instant::now();
    let error = s1
        .query_unpaged("CREATE TABLE ks.lonely (pk int PRIMARY KEY)", &[])
        .await
        .expect_err("a DDL without a quorum");
    let took = started.elapsed();
    println!("DDL without a quorum answered in {took:?}: {error}");
    let text = error.to_string();
    assert!(text.contains("metadata group"), "{text}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "answered after {took:?}"
    );
    assert_eq!(table_id(&s1, "lonely").await, None);
    assert_eq!(schema_version(&s1).await, version);
    drop(s1);
    node1.stop();
}

/// A data directory whose schema is in its local store but not in its metadata group (as
/// before schema went through the group; here the group's log is removed): the node proposes
/// its local schema as the group's first, keeps its tables and data, and DDL then goes
/// through the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_schema_becomes_the_groups_first() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(NODES);
    let addr = ports.cql_of(1);
    let (node, _) = ServeNode::start(dir.path(), 1, ports, OTHER_TIMEOUT);
    let session = session_on(addr).await;
    query_unless_shed(
        &session,
        "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
        (),
    )
    .await
    .unwrap();
    for table in ["a", "b"] {
        query_unless_shed(
            &session,
            format!("CREATE TABLE ks.{table} (pk int PRIMARY KEY, v text)"),
            (),
        )
        .await
        .unwrap();
    }
    query_unless_shed(&session, "INSERT INTO ks.a (pk, v) VALUES (1, 'kept')", ())
        .await
        .unwrap();
    let version = schema_version(&session).await;
    let id = table_id(&session, "a").await;
    drop(session);
    node.stop();

    std::fs::remove_dir_all(dir.path().join("node1").join("meta")).unwrap();
    let (node, _) = ServeNode::start(dir.path(), 1, ports, OTHER_TIMEOUT);
    assert!(
        node.output().contains("proposed the local schema"),
        "{}",
        node.output()
    );
    let session = session_on(addr).await;
    assert_eq!(schema_version(&session).await, version);
    assert_eq!(table_id(&session, "a").await, id);
    let rows = query_unless_shed(&session, "SELECT v FROM ks.a WHERE pk = 1", ())
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (v,): (String,) = rows.single_row().unwrap();
    assert_eq!(v, "kept");
    // DDL goes on through the new group, and survives another restart.
    query_unless_shed(&session, "DROP TABLE ks.b", ())
        .await
        .unwrap();
    drop(session);
    node.stop();
    let (node, _) = ServeNode::start(dir.path(), 1, ports, OTHER_TIMEOUT);
    // The log is appended across starts: the schema was proposed once, not again.
    assert_eq!(
        node.output().matches("proposed the local schema").count(),
        1,
        "{}",
        node.output()
    );
    let session = session_on(addr).await;
    assert_eq!(table_id(&session, "b").await, None);
    assert_eq!(table_id(&session, "a").await, id);
    drop(session);
    node.stop();
}

/// `system.peers` of `session`'s node: (peer address, schema version) by address.
async fn peer_versions(session: &Session) -> Vec<(std::net::IpAddr, Uuid)> {
    let rows = session
        .query_unpaged("SELECT peer, schema_version FROM system.peers", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let mut out: Vec<(std::net::IpAddr, Uuid)> = rows
        .rows::<(std::net::IpAddr, Uuid)>()
        .unwrap()
        .map(Result::unwrap)
        .collect();
    out.sort();
    out
}

/// Polls `check` every 50 ms until it holds, or panics after `within`.
async fn within<F, Fut>(what: &str, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_show_each_peers_own_schema_version() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(NODES);
    let mut nodes: Vec<ServeNode> = (1..=NODES)
        .map(|i| ServeNode::start(dir.path(), i, ports, OTHER_TIMEOUT).0)
        .collect();
    let mut sessions = Vec::new();
    for i in 1..=NODES {
        sessions.push(session_on_without_agreement_wait(ports.cql_of(i)).await);
    }
    sessions[0]
        .query_unpaged(
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 3}",
            &[],
        )
        .await
        .unwrap();
    // Every node's peers show the one version, which every node reports for itself.
    let first = within(
        "one version everywhere",
        Duration::from_secs(10),
        || async {
            let mut all = Vec::new();
            for s in &sessions {
                all.push(schema_version(s).await);
                all.extend(peer_versions(s).await.into_iter().map(|(_, v)| v));
            }
            all.len() == 9 && all.iter().all(|v| *v == all[0])
        },
    )
    .await;
    let before = schema_version(&sessions[0]).await;
    println!("peers agreed {first:?} after the keyspace");
    // Node 3 stops; a change through node 1 does not reach it.
    nodes[2].kill9();
    sessions.pop();
    sessions[0]
        .query_unpaged("CREATE TABLE ks.after (pk int PRIMARY KEY)", &[])
        .await
        .unwrap();
    let after = schema_version(&sessions[0]).await;
    assert_ne!(after, before);
    // Nodes 1 and 2 show each other at the new version, and node 3 at the one it last had:
    // each row is that peer's own version, not the asking node's.
    let node3 = ports.cql_of(3).ip();
    let took = within(
        "peers' versions follow the change",
        Duration::from_secs(5),
        || async {
            let mut ok = true;
            for s in &sessions {
                for (peer, version) in peer_versions(s).await {
                    let want = if peer == node3 { before } else { after };
                    ok &= version == want;
                }
            }
            ok
        },
    )
    .await;
    println!("peers showed the new version {took:?} after the change");
    assert!(took < AGREEMENT_BOUND, "{took:?}");
    // Node 3 back: it catches up and its peers show it so.
    nodes[2].restart();
    within(
        "node 3's version catches up",
        Duration::from_secs(20),
        || async {
            peer_versions(&sessions[0])
                .await
                .iter()
                .all(|(_, v)| *v == after)
        },
    )
    .await;
}
