//! The raw client against three real `sluice` nodes on 127.0.0.1-3 (RF 1, one shard each):
//! token-aware, every request goes to the node that the server's own
//! `system_views.token_replicas` names as its partition's replica, and each node's EXECUTE
//! counter agrees; round-robin, the nodes take turns. Every write and read succeeds.
//!
//! The binary is `$SLUICE_BIN`, else `sluice` beside this test's target directory (build it
//! first with `cargo build -p sluice`, as scripts/test.sh does).

use sluice_bench::driver::{Connection, ConsistencyLevel, DriverOptions, KEYSPACE};
use sluice_bench::raw::{NodeChoice, RawOptions, RawTarget, ReplicaRing};
use sluice_bench::target::{populate, Op, OpKind, Reply, Target};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NODES: u8 = 3;
const PARTITIONS: i64 = 300;

#[path = "../../sluice/tests/common/ports.rs"]
mod ports;
mod support;
use ports::free_port;
use support::sluice_bin;

/// A running node, killed when dropped.
struct Node {
    child: Child,
    cql: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Node {
    /// Starts node `i` on 127.0.0.`i` with ports of its own, joining through `seed` if given.
    fn start(dir: &Path, i: u8, internode: SocketAddr, seed: Option<SocketAddr>) -> Node {
        let ip = format!("127.0.0.{i}");
        let cql: SocketAddr = format!("{ip}:{}", free_port()).parse().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = dir.join(format!("node{i}.log"));
        let mut cmd = Command::new(sluice_bin());
        cmd.arg("serve")
            .arg("--listen")
            .arg(cql.to_string())
            .arg("--shard-aware-port")
            .arg("off")
            .arg("--internode-listen")
            .arg(internode.to_string())
            .arg("--data-dir")
            .arg(dir.join(format!("node{i}")))
            .arg("--shards")
            .arg("1")
            .arg("--num-tokens")
            .arg("16")
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            // Correctness, not overload: a debug build sheds a closed loop of 128 otherwise.
            .arg("--admission")
            .arg("off")
            .arg("--log")
            .arg("warn");
        if let Some(s) = seed {
            cmd.arg("--seeds").arg(s.to_string());
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start sluice");
        let mut node = Node {
            child,
            cql,
            metrics,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let accepts =
            |a: &SocketAddr| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok();
        while !(accepts(&cql) && accepts(&metrics)) {
            if let Ok(Some(st)) = node.child.try_wait() {
                panic!("node {i} exited ({st}): {}", node.log());
            }
            assert!(
                Instant::now() < deadline,
                "node {i} did not listen within 60 s: {}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        node
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The sum of `name`'s samples carrying `label`.
    fn metric(&self, name: &str, label: &str) -> u64 {
        let text = support::metrics_text(self.metrics);
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    fn executes(&self) -> u64 {
        self.metric("sluice_requests_total", "opcode=\"execute\"")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes then reads every partition through `target`; all must succeed.
async fn write_and_read(target: &Arc<RawTarget>) {
    assert_eq!(populate(target, 0..PARTITIONS, 1).await, 0, "writes failed");
    for pk in 0..PARTITIONS {
        let r = target
            .execute(Op {
                kind: OpKind::Read,
                pk,
                ck: 0,
            })
            .await;
        assert_eq!(r, Reply::Ok, "read of {pk}");
    }
}

async fn exercise() {
    let dir = tempfile::tempdir().expect("temp dir");
    let internode: Vec<SocketAddr> = (1..=NODES)
        .map(|i| format!("127.0.0.{i}:{}", free_port()).parse().unwrap())
        .collect();
    let mut nodes = Vec::new();
    for i in 1..=NODES {
        let seed = (i > 1).then_some(internode[0]);
        nodes.push(Node::start(
            dir.path(),
            i,
            internode[usize::from(i - 1)],
            seed,
        ));
    }
    let addrs: Vec<String> = nodes.iter().map(|n| n.cql.to_string()).collect();
    let opts = DriverOptions::new(addrs.clone(), 1, Duration::from_secs(10));
    let mut conn = Connection::open(&opts).await;
    for _ in 0..2 {
        if conn.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        conn = Connection::open(&opts).await;
    }
    let conn = conn.unwrap_or_else(|e| panic!("driver session: {e:#}"));
    conn.create_table("kv", false).await.expect("table");
    // The driver learns the joined nodes' tokens from system.peers: wait until it has all.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = conn.session.get_cluster_state();
        let owners: std::collections::BTreeSet<_> = state
            .replica_locator()
            .ring()
            .iter()
            .map(|(_, n)| n.host_id)
            .collect();
        if owners.len() == usize::from(NODES) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the driver saw {} ring nodes",
            owners.len()
        );
        conn.session.refresh_metadata().await.expect("refresh");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Token-aware at RF 1: each partition has one replica, and every request goes there.
    let ring = ReplicaRing::from_session(&conn.session, 1, &addrs)
        .await
        .expect("ring");
    let raw = |choice| RawOptions {
        connections: 1,
        table: "kv".into(),
        using_timeout: None,
        batch_rows: 1,
        consistency: ConsistencyLevel::One,
        choice,
    };
    let (target, _) = RawTarget::connect_with(&addrs, raw(NodeChoice::Replicas(ring)))
        .await
        .expect("raw client");
    assert!(
        target.describe().contains("3 nodes, token-aware"),
        "{}",
        target.describe()
    );
    assert_eq!(target.connections().len(), usize::from(NODES));
    let before: Vec<u64> = nodes.iter().map(Node::executes).collect();
    let target = Arc::new(target);
    write_and_read(&target).await;
    // Read now: the driver's queries below are EXECUTEs too (it prepares bound queries).
    let got: Vec<u64> = nodes
        .iter()
        .zip(&before)
        .map(|(n, b)| n.executes() - b)
        .collect();

    let ips: Vec<IpAddr> = nodes.iter().map(|n| n.cql.ip()).collect();
    let mut want = vec![0u64; nodes.len()];
    for pk in 0..PARTITIONS {
        let token = sluice_types::murmur3_token(&pk.to_be_bytes());
        let rows = conn
            .session
            .query_unpaged(
                "SELECT replicas FROM system_views.token_replicas \
                 WHERE keyspace_name = ? AND token_value = ?",
                (KEYSPACE, token),
            )
            .await
            .expect("token_replicas")
            .into_rows_result()
            .expect("rows");
        let (replicas,): (Vec<IpAddr>,) = rows.single_row().expect("one row");
        assert_eq!(replicas.len(), 1, "RF 1: {replicas:?}");
        let at = ips
            .iter()
            .position(|ip| *ip == replicas[0])
            .expect("a node");
        want[at] += 2; // one write, one read
    }
    assert_eq!(target.routed_per_node(), want, "requests per node");
    assert!(want.iter().all(|n| *n > 0), "every node owns partitions");
    assert_eq!(got, want, "EXECUTEs each node received");
    drop(target);

    // Round-robin: the nodes take turns, replica or not.
    let (target, _) = RawTarget::connect_with(&addrs, raw(NodeChoice::RoundRobin))
        .await
        .expect("raw client");
    assert!(
        target.describe().contains("3 nodes in turn"),
        "{}",
        target.describe()
    );
    let target = Arc::new(target);
    write_and_read(&target).await;
    let per_node = target.routed_per_node();
    let total = 2 * PARTITIONS as u64;
    assert_eq!(per_node.iter().sum::<u64>(), total);
    assert!(
        per_node.iter().all(|n| n.abs_diff(total / 3) <= 1),
        "{per_node:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_client_sends_each_request_to_its_replica_on_three_nodes() {
    tokio::time::timeout(Duration::from_secs(240), exercise())
        .await
        .expect("finished within 240 s");
}
