//! A node's data follows its tokens, on `sluice serve` processes at 127.0.0.1-4: three
//! nodes hold rows of a keyspace with RF 1 and one with RF 2, each row written to the
//! replicas the ring names; a fourth node joins, streams the ranges it gains and only then
//! opens its CQL port, and afterwards every row is in the local data of every node the ring
//! names as its replica (each node read alone: there is no coordinator yet). Rows written
//! to the four-node ring move back when the fourth node is decommissioned. `sluice nodetool
//! status` is parsed at each step.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};

/// Nodes at the start; a fourth joins and leaves.
const NODES: u8 = 3;
/// Every IP a node of the test uses.
const ALL_IPS: u8 = 4;
/// Bound on one node's start (a debug build on a shared machine).
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn ip(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, index))
}

/// A port free on every node's IP (each node binds the same port on its own IP).
fn port_free_on_all_ips() -> u16 {
    for _ in 0..100 {
        let port = common::free_port();
        if (1..=ALL_IPS).all(|k| TcpListener::bind((ip(k), port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on 127.0.0.1-{ALL_IPS} in 100 tries")
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
    child: Child,
    log: PathBuf,
}

impl ServeNode {
    fn cql(index: u8, ports: Ports) -> SocketAddr {
        SocketAddr::new(ip(index), ports.cql)
    }

    /// Starts node `index` on `dir/node<index>` and returns once its CQL port accepts.
    fn start(dir: &Path, index: u8, ports: Ports) -> (ServeNode, Duration) {
        let log = dir.join(format!("node{index}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .args(["--listen", &ServeNode::cql(index, ports).to_string()])
            .args(["--shard-aware-port", &ports.shard_aware.to_string()])
            .args([
                "--internode-listen",
                &SocketAddr::new(ip(index), ports.internode).to_string(),
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
            .arg("--data-dir")
            .arg(dir.join(format!("node{index}")));
        if index > 1 {
            command.args([
                "--seeds",
                &SocketAddr::new(ip(1), ports.internode).to_string(),
            ]);
        }
        let started = Instant::now();
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start sluice serve");
        let mut node = ServeNode { index, child, log };
        let addr = ServeNode::cql(index, ports);
        loop {
            if let Ok(Some(status)) = node.child.try_wait() {
                panic!("node {index} exited ({status}): {}", node.output());
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return (node, started.elapsed());
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "node {index} did not open {addr} within {START_TIMEOUT:?}: {}",
                node.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then waits for a clean exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "node {}: {status}", self.index);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not stop",
                self.index
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServeNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A session whose every statement goes to node `addr`; the driver still waits for schema
/// agreement over every node it discovered.
async fn session_on(addr: SocketAddr) -> Session {
    let policy = SingleTargetLoadBalancingPolicy::new(NodeIdentifier::NodeAddress(addr), None);
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy)
        .build();
    SessionBuilder::new()
        .known_node(addr.to_string())
        .default_execution_profile_handle(profile.into_handle())
        .connection_timeout(Duration::from_secs(20))
        // Fail fast rather than wait the default 60 s if the versions never agree.
        .schema_agreement_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("connect")
}

/// Rows per keyspace and phase.
const ROWS: i32 = 300;
/// Bytes of each row's value, so that streaming moves more than keys.
const VALUE_BYTES: usize = 512;
/// Keyspaces: (name, replication factor).
const KEYSPACES: [(&str, u32); 2] = [("rf1", 1), ("rf2", 2)];

fn internode(index: u8, ports: Ports) -> SocketAddr {
    SocketAddr::new(ip(index), ports.internode)
}

fn token_of(k: i32) -> i64 {
    sluice_ring::Token::of_key(&k.to_be_bytes()).0
}

/// Runs `sluice nodetool` against node `index` and returns its output; panics on failure.
fn nodetool(index: u8, ports: Ports, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("nodetool")
        .args([
            "--host",
            &internode(index, ports).to_string(),
            "--timeout",
            "120",
        ])
        .args(args)
        .output()
        .expect("run sluice nodetool");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "nodetool {args:?}: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// (status code, address, token count) of each node line of `nodetool status`.
fn status_rows(index: u8, ports: Ports) -> Vec<(String, IpAddr, usize)> {
    let text = nodetool(index, ports, &["status"]);
    let mut rows: Vec<(String, IpAddr, usize)> = text
        .lines()
        .filter(|l| {
            let code = l.get(..2).unwrap_or("");
            ["UN", "UJ", "UL", "DN", "DJ", "DL"].contains(&code)
        })
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Code, address, load value and unit (or "?"), tokens, owns, host id, rack.
            let tokens_at = if f[2] == "?" { 3 } else { 4 };
            (
                f[0].to_owned(),
                f[1].parse().unwrap(),
                f[tokens_at].parse().unwrap(),
            )
        })
        .collect();
    rows.sort_by_key(|r| r.1);
    rows
}

/// Polls `nodetool status` on node 1 until it shows `nodes` nodes, all UN.
fn wait_all_normal(ports: Ports, nodes: u8) -> Vec<(String, IpAddr, usize)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = status_rows(1, ports);
        if rows.len() == usize::from(nodes) && rows.iter().all(|r| r.0 == "UN") {
            return rows;
        }
        assert!(Instant::now() < deadline, "status never settled: {rows:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

async fn replicas_of(lookup_session: &Session, ks: &str, token: i64) -> Vec<IpAddr> {
    let rows = lookup_session
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

/// Writes rows `keys` of `ks.t` to each of their replicas, as node 1's ring names them.
async fn write_rows(sessions: &[(IpAddr, Session)], ks: &str, keys: std::ops::Range<i32>) {
    let lookup = &sessions[0].1;
    for k in keys {
        let value = format!("{k:0>width$}", width = VALUE_BYTES);
        for replica in replicas_of(lookup, ks, token_of(k)).await {
            let (_, session) = sessions
                .iter()
                .find(|(ip, _)| *ip == replica)
                .expect("a replica with a session");
            let insert = format!("INSERT INTO {ks}.t (k, v) VALUES (?, ?)");
            // A debug build on a shared machine may shed a write as Overloaded: retry it.
            let mut attempts = 0;
            while let Err(error) = session.query_unpaged(insert.as_str(), (k, &value)).await {
                attempts += 1;
                assert!(
                    attempts < 20,
                    "INSERT of {k} failed {attempts} times: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The keys of `ks.t` in the local data of the node behind `session`.
async fn local_keys(session: &Session, ks: &str) -> std::collections::BTreeSet<i32> {
    let rows = session
        .query_unpaged(format!("SELECT k, v FROM {ks}.t"), &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    rows.rows::<(i32, String)>()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            assert_eq!(v.len(), VALUE_BYTES, "row {k} arrived whole");
            k
        })
        .collect()
}

/// Asserts that every key of `keys` is in the local data of each of its replicas (as node
/// 1's ring names them now); returns how many (key, replica) pairs were checked.
async fn assert_on_replicas(sessions: &[(IpAddr, Session)], ks: &str, keys: &[i32]) -> usize {
    let mut local = Vec::new();
    for (ip, session) in sessions {
        local.push((*ip, local_keys(session, ks).await));
    }
    let mut checked = 0;
    let mut missing = Vec::new();
    for &k in keys {
        for replica in replicas_of(&sessions[0].1, ks, token_of(k)).await {
            let (_, held) = local
                .iter()
                .find(|(ip, _)| *ip == replica)
                .expect("every replica has a session");
            if !held.contains(&k) {
                missing.push((k, replica));
            }
            checked += 1;
        }
    }
    assert!(
        missing.is_empty(),
        "{ks}: {} of {checked} (key, replica) pairs missing, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_node_streams_its_ranges_in_and_a_decommissioned_one_streams_them_out() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports {
        cql: port_free_on_all_ips(),
        shard_aware: port_free_on_all_ips(),
        internode: port_free_on_all_ips(),
    };
    let mut nodes = Vec::new();
    for index in 1..=NODES {
        nodes.push(ServeNode::start(dir.path(), index, ports).0);
    }
    let status = wait_all_normal(ports, NODES);
    assert!(status.iter().all(|r| r.2 == 8), "{status:?}");
    let mut sessions = Vec::new();
    for index in 1..=NODES {
        sessions.push((ip(index), session_on(ServeNode::cql(index, ports)).await));
    }
    for (ks, rf) in KEYSPACES {
        sessions[0]
            .1
            .query_unpaged(
                format!(
                    "CREATE KEYSPACE {ks} WITH replication = \
                     {{'class': 'SimpleStrategy', 'replication_factor': {rf}}}"
                ),
                &[],
            )
            .await
            .unwrap();
        sessions[0]
            .1
            .query_unpaged(
                format!("CREATE TABLE {ks}.t (k int PRIMARY KEY, v text)"),
                &[],
            )
            .await
            .unwrap();
    }
    sessions[0].1.await_schema_agreement().await.unwrap();
    let before: Vec<i32> = (0..ROWS).collect();
    for (ks, _) in KEYSPACES {
        write_rows(&sessions, ks, 0..ROWS).await;
        assert_on_replicas(&sessions, ks, &before).await;
    }

    // A fourth node joins; its CQL port opens only once it has streamed its ranges.
    let (fourth, took) = ServeNode::start(dir.path(), 4, ports);
    println!("node 4 joined and opened its CQL port in {took:?}");
    let log = fourth.output();
    assert!(
        log.contains("streamed the ranges this node gains"),
        "node 4 did not stream: {log}"
    );
    let status = wait_all_normal(ports, 4);
    assert_eq!(status[3].1, ip(4));
    assert_eq!(status[3].2, 8);
    sessions.push((ip(4), session_on(ServeNode::cql(4, ports)).await));
    for (ks, _) in KEYSPACES {
        let checked = assert_on_replicas(&sessions, ks, &before).await;
        let gained = local_keys(&sessions[3].1, ks).await.len();
        println!("{ks}: after the join, {checked} (key, replica) pairs in place; node 4 holds {gained} keys");
        assert!(gained > 0, "{ks}: node 4 gained no rows");
    }

    // Rows written to the four-node ring: those node 4 replicates are on it alone (RF 1).
    for (ks, _) in KEYSPACES {
        write_rows(&sessions, ks, ROWS..2 * ROWS).await;
    }
    let only_on_fourth = local_keys(&sessions[3].1, "rf1")
        .await
        .into_iter()
        .filter(|k| *k >= ROWS)
        .count();
    assert!(only_on_fourth > 0, "no new row landed on node 4");

    // Decommission: node 4 streams its ranges away, leaves and stops.
    let started = Instant::now();
    let answer = nodetool(4, ports, &["decommission"]);
    println!("decommission in {:?}: {answer}", started.elapsed());
    assert!(answer.contains("decommissioned"), "{answer}");
    let mut fourth = fourth;
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(status) = fourth.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "node 4 did not stop after leaving"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        exit.success(),
        "node 4 exited with {exit}: {}",
        fourth.output()
    );
    drop(fourth);
    sessions.pop();
    let status = wait_all_normal(ports, NODES);
    assert!(status.iter().all(|r| r.1 != ip(4)), "{status:?}");
    let all: Vec<i32> = (0..2 * ROWS).collect();
    for (ks, _) in KEYSPACES {
        let checked = assert_on_replicas(&sessions, ks, &all).await;
        println!("{ks}: after the decommission, {checked} (key, replica) pairs in place");
    }

    // Node 3 dies; node 1 sees it down, then removes it, and its RF 2 ranges are streamed
    // again from their other replicas (with two nodes left, both hold every row).
    let mut third = nodes.pop().unwrap();
    let host_id = status_line(1, ports, ip(3))[6].to_owned();
    third.child.kill().unwrap();
    third.child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status_line(1, ports, ip(3))[0] != "DN" {
        assert!(Instant::now() < deadline, "node 3 never shown down");
        std::thread::sleep(Duration::from_millis(200));
    }
    let answer = nodetool(1, ports, &["removenode", &host_id]);
    println!("removenode: {answer}");
    assert!(answer.contains("removed"), "{answer}");
    sessions.pop();
    let status = wait_all_normal(ports, 2);
    assert!(status.iter().all(|r| r.1 != ip(3)), "{status:?}");
    let checked = assert_on_replicas(&sessions, "rf2", &all).await;
    assert_eq!(checked, all.len() * 2);
    for (_, session) in &sessions {
        assert_eq!(local_keys(session, "rf2").await.len(), all.len());
    }

    // One node would be left for RF 2: refused, and both nodes stay.
    let refused = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("nodetool")
        .args(["--host", &internode(2, ports).to_string(), "decommission"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "decommission of node 2 was not refused"
    );
    assert!(stderr.contains("replication factor"), "{stderr}");
    assert_eq!(wait_all_normal(ports, 2).len(), 2);

    for node in nodes {
        node.stop();
    }
}

/// The fields of node `node_ip`'s line of `nodetool status` on node `index`: code, address,
/// load (value and unit, or `?` and an empty field), tokens, owns, host id, rack.
fn status_line(index: u8, ports: Ports, node_ip: IpAddr) -> Vec<String> {
    let text = nodetool(index, ports, &["status"]);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(node_ip.to_string().as_str()))
        .unwrap_or_else(|| panic!("no line for {node_ip}: {text}"));
    let mut fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    if fields[2] == "?" {
        // One field for an unknown load: pad so that the host id is always at 6.
        fields.insert(3, String::new());
    }
    fields
}
