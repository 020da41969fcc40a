//! Three `sluice serve` processes on 127.0.0.1-3 with a keyspace of replication factor 3:
//! a QUORUM write through one node is read at QUORUM through the others and at ONE from each
//! alone; with one node killed (-9), QUORUM still succeeds and ALL answers Unavailable with
//! the driver-parsed counts; the restarted node, which missed writes, returns them once a
//! QUORUM read through it has repaired its copy.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};
use scylla::policies::retry::FallthroughRetryPolicy;
use scylla::statement::{Consistency, Statement};

/// Bound on one node's start (a debug build, a join through the seed).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on the failure detector noticing a kill or a restart.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(20);
const TABLE_ID: &str = "0b6f3b1e-4c1a-4f7e-9d55-26c0a1d2e3f4";

fn ip(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, index))
}

/// A port free on 127.0.0.1-3 (each node binds the same port on its own IP).
fn port_free_on_all_ips() -> u16 {
    for _ in 0..100 {
        let port = common::free_port();
        if (1..=3).all(|k| TcpListener::bind((ip(k), port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on 127.0.0.1-3 in 100 tries")
}

#[derive(Clone, Copy)]
struct Ports {
    cql: u16,
    shard_aware: u16,
    internode: u16,
}

/// One `sluice serve` process; SIGKILL on drop.
struct ServeNode {
    index: u8,
    child: Option<Child>,
    data: PathBuf,
    log: PathBuf,
    ports: Ports,
    extra: &'static [&'static str],
}

impl ServeNode {
    fn spawn(dir: &Path, index: u8, ports: Ports, extra: &'static [&'static str]) -> ServeNode {
        let mut node = ServeNode {
            index,
            child: None,
            data: dir.join(format!("node{index}")),
            log: dir.join(format!("node{index}.log")),
            ports,
            extra,
        };
        node.start();
        node
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let own_ip = ip(self.index);
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .args([
                "--listen",
                &SocketAddr::new(own_ip, self.ports.cql).to_string(),
            ])
            .args(["--shard-aware-port", &self.ports.shard_aware.to_string()])
            .args([
                "--internode-listen",
                &SocketAddr::new(own_ip, self.ports.internode).to_string(),
            ])
            .args([
                "--metrics-listen",
                "off",
                "--shards",
                "1",
                "--num-tokens",
                "8",
            ])
            .args(["--durability", "periodic"])
            .args(self.extra)
            .arg("--data-dir")
            .arg(&self.data);
        if self.index > 1 {
            command
                .arg("--seeds")
                .arg(SocketAddr::new(ip(1), self.ports.internode).to_string());
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start sluice serve");
        self.child = Some(child);
        let addr = self.cql();
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("node {} exited ({status}): {}", self.index, self.output());
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not serve within {START_TIMEOUT:?}: {}",
                self.index,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cql(&self) -> SocketAddr {
        SocketAddr::new(ip(self.index), self.ports.cql)
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServeNode {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A session whose every statement goes to `addr` and is never retried elsewhere.
async fn connect_to_one(addr: SocketAddr) -> Session {
    let policy = SingleTargetLoadBalancingPolicy::new(NodeIdentifier::NodeAddress(addr), None);
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy)
        .retry_policy(std::sync::Arc::new(FallthroughRetryPolicy::new()))
        .request_timeout(Some(Duration::from_secs(10)))
        .build();
    SessionBuilder::new()
        .known_node(addr.to_string())
        .default_execution_profile_handle(profile.into_handle())
        .connection_timeout(Duration::from_secs(20))
        // No wait for schema agreement: each node runs the DDL itself (IF NOT EXISTS), so each
        // has the table before the writes.
        .auto_await_schema_agreement(false)
        .build()
        .await
        .expect("connect")
}

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

/// Polls `check` every 200 ms until it holds or `LIVENESS_TIMEOUT` passes.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + LIVENESS_TIMEOUT;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what} within {LIVENESS_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
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

/// Three nodes with the schema, each seeing the whole ring, and a session to each.
async fn three_nodes(dir: &Path, extra: &'static [&'static str]) -> (Vec<ServeNode>, Vec<Session>) {
    let ports = Ports {
        cql: port_free_on_all_ips(),
        shard_aware: port_free_on_all_ips(),
        internode: port_free_on_all_ips(),
    };
    let nodes: Vec<ServeNode> = (1..=3)
        .map(|i| ServeNode::spawn(dir, i, ports, extra))
        .collect();
    let mut sessions = Vec::new();
    for node in &nodes {
        let session = connect_to_one(node.cql()).await;
        create_schema(&session).await;
        sessions.push(session);
    }
    for session in &sessions {
        eventually("every node sees its two peers", || async {
            session
                .query_unpaged("SELECT peer FROM system.peers", &[])
                .await
                .ok()
                .and_then(|r| r.into_rows_result().ok())
                .is_some_and(|r| r.rows_num() == 2)
        })
        .await;
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
    nodes[2].kill9();
    let node3_session = sessions.pop().unwrap();
    drop(node3_session);
    // Once node 1's failure detector says so, ALL is Unavailable with the right counts.
    let last = until_unavailable(
        &sessions[0],
        "INSERT INTO rep.t (pk, ck, v) VALUES (9, 1, 'x')",
    )
    .await;
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
    nodes[2].start();
    let node3 = connect_to_one(nodes[2].cql()).await;
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
    nodes[2].kill9();
    drop(sessions.pop());
    until_unavailable(
        &sessions[0],
        "INSERT INTO rep.t (pk, ck, v) VALUES (9, 1, 'x')",
    )
    .await;
    until_unavailable(
        &sessions[1],
        "INSERT INTO rep.t (pk, ck, v) VALUES (9, 1, 'x')",
    )
    .await;
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
    nodes[2].start();
    let node3 = connect_to_one(nodes[2].cql()).await;
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
