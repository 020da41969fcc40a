//! `sluice cluster --nodes 3` on 127.0.0.1-3: the nodes get distinct tokens from the
//! topology group (their `system.local`), each places the tokens of the nodes it knows on
//! those nodes (`system_views.token_replicas`, for keyspaces created through node 1 alone),
//! SIGTERM to the parent stops every node, and a restart on the same directories (all nodes at
//! once) keeps every node's tokens.

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};

const NODES: u8 = 3;
const NUM_TOKENS: usize = 16;
/// Bound on the whole cluster's start (three starts and two joins on a debug build).
const START_TIMEOUT: Duration = Duration::from_secs(120);

fn ip(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, index))
}

/// A port free on every node's IP (each node binds the same port on its own IP).
fn port_free_on_all_ips() -> u16 {
    for _ in 0..100 {
        let port = common::free_port();
        if (1..=NODES).all(|k| TcpListener::bind((ip(k), port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on 127.0.0.1-{NODES} in 100 tries")
}

/// The `sluice cluster` process; SIGKILL on drop, which takes its nodes with it.
struct LocalCluster {
    child: Child,
    out: std::path::PathBuf,
}

/// The ports every node uses on its own IP.
#[derive(Clone, Copy)]
struct Ports {
    cql: u16,
    shard_aware: u16,
    internode: u16,
}

impl LocalCluster {
    /// Runs `sluice cluster` on `dir` and waits until it says how to connect.
    async fn start(dir: &std::path::Path, ports: Ports, out_name: &str) -> LocalCluster {
        let out = dir.join(out_name);
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["cluster", "--nodes", &NODES.to_string(), "--dir"])
            .arg(dir)
            .args(["--cql-port", &ports.cql.to_string()])
            .args(["--shard-aware-port", &ports.shard_aware.to_string()])
            .args(["--internode-port", &ports.internode.to_string()])
            .args([
                "--metrics-port",
                "off",
                "--num-tokens",
                &NUM_TOKENS.to_string(),
            ])
            .arg("--serve-arg=--durability=periodic")
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice cluster");
        let mut cluster = LocalCluster { child, out };

        let deadline = Instant::now() + START_TIMEOUT;
        while !std::fs::read_to_string(&cluster.out)
            .unwrap_or_default()
            .contains("connect with")
        {
            if let Ok(Some(status)) = cluster.child.try_wait() {
                panic!("sluice cluster exited ({status}): {}", cluster.output());
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not start within {START_TIMEOUT:?}: {}",
                cluster.output()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        cluster
    }

    /// SIGTERM to `sluice cluster`: it exits 0 and no node accepts any more.
    async fn stop(&mut self, addrs: &[SocketAddr]) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let stop_deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < stop_deadline,
                "sluice cluster did not stop within 60 s of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(status.success(), "{status}: {}", self.output());
        for addr in addrs {
            assert!(
                TcpStream::connect_timeout(addr, Duration::from_millis(500)).is_err(),
                "{addr} still accepts after the cluster stopped"
            );
        }
    }

    /// What `sluice cluster` printed, then every node's log.
    fn output(&self) -> String {
        let mut text = std::fs::read_to_string(&self.out).unwrap_or_default();
        if let Ok(dir) = std::fs::read_dir(self.out.parent().unwrap()) {
            for entry in dir.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let mut log = String::new();
                    if let Ok(mut f) = std::fs::File::open(&path) {
                        let _ = f.read_to_string(&mut log);
                    }
                    text += &format!("\n--- {}\n{log}", path.display());
                }
            }
        }
        text
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn connect_to_one(addr: SocketAddr) -> Session {
    // Every statement goes to this node, whatever hosts the driver discovers.
    let policy = SingleTargetLoadBalancingPolicy::new(NodeIdentifier::NodeAddress(addr), None);
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy)
        .build();
    SessionBuilder::new()
        .known_node(addr.to_string())
        .default_execution_profile_handle(profile.into_handle())
        .connection_timeout(Duration::from_secs(20))
        // The driver waits for the nodes' schema versions to agree after DDL; fail fast
        // rather than after its default 60 s if they never do.
        .schema_agreement_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("connect")
}

async fn local_tokens(session: &Session) -> Vec<i64> {
    let rows = session
        .query_unpaged("SELECT tokens FROM system.local", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (tokens,): (Vec<String>,) = rows.single_row().unwrap();
    tokens.iter().map(|t| t.parse().unwrap()).collect()
}

async fn replicas(session: &Session, ks: &str, token: i64) -> Vec<IpAddr> {
    let rows = session
        .query_unpaged(
            "SELECT replicas FROM system_views.token_replicas \
             WHERE keyspace_name = ? AND token_value = ?",
            (ks, token),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (replicas,): (Vec<IpAddr>,) = rows.single_row().unwrap();
    replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_local_nodes_share_one_ring() {
    let dir = tempfile::tempdir().unwrap();
    let cql_port = port_free_on_all_ips();
    let shard_aware_port = port_free_on_all_ips();
    let internode_port = port_free_on_all_ips();
    let ports = Ports {
        cql: cql_port,
        shard_aware: shard_aware_port,
        internode: internode_port,
    };
    let mut cluster = LocalCluster::start(dir.path(), ports, "cluster.out").await;

    let addrs: Vec<SocketAddr> = (1..=NODES)
        .map(|k| SocketAddr::new(ip(k), cql_port))
        .collect();
    let mut sessions = Vec::new();
    for addr in &addrs {
        sessions.push(connect_to_one(*addr).await);
    }
    let mut tokens_of = Vec::new();
    for session in &sessions {
        let tokens = local_tokens(session).await;
        assert_eq!(tokens.len(), NUM_TOKENS, "{}", cluster.output());
        tokens_of.push(tokens);
    }
    let all: BTreeSet<i64> = tokens_of.iter().flatten().copied().collect();
    assert_eq!(
        all.len(),
        usize::from(NODES) * NUM_TOKENS,
        "the nodes' tokens are distinct"
    );

    // The keyspaces are created through node 1 alone; the metadata group takes them to the
    // other nodes.
    for (ks, rf) in [("ring_one", 1), ("ring_three", 3)] {
        sessions[0]
            .query_unpaged(
                format!(
                    "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = \
                     {{'class': 'SimpleStrategy', 'replication_factor': {rf}}}"
                ),
                &[],
            )
            .await
            .unwrap();
    }
    // Every node follows the topology group's ring: each sees the whole ring.
    let everyone: BTreeSet<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    let mut compared = 0;
    for session in &sessions {
        for (owner, tokens) in tokens_of.iter().enumerate() {
            let owner_ip = addrs[owner].ip();
            for token in tokens {
                // With one replica, a node's own token is placed on that node alone.
                assert_eq!(replicas(session, "ring_one", *token).await, vec![owner_ip]);
                // With three, every node holds it, the owner first.
                let three = replicas(session, "ring_three", *token).await;
                assert_eq!(three.first(), Some(&owner_ip));
                assert_eq!(three.iter().copied().collect::<BTreeSet<_>>(), everyone);
                compared += 1;
            }
        }
    }
    assert_eq!(
        compared,
        NUM_TOKENS * usize::from(NODES) * usize::from(NODES)
    );
    for session in sessions {
        drop(session);
    }

    cluster.stop(&addrs).await;

    // A restart on the same directories: the group is replayed and every node keeps its tokens.
    let mut cluster = LocalCluster::start(dir.path(), ports, "restart.out").await;
    for (addr, before) in addrs.iter().zip(&tokens_of) {
        let session = connect_to_one(*addr).await;
        assert_eq!(&local_tokens(&session).await, before, "{addr}");
    }
    cluster.stop(&addrs).await;
}
