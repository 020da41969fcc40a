//! A node's data follows its tokens, on `sluice serve` processes at 127.0.0.1-4: three
//! nodes hold rows of a keyspace with RF 1 and one with RF 2, each row written to the
//! replicas the ring names; a fourth node joins, streams the ranges it gains and only then
//! opens its CQL port, and afterwards every row is in the local data of every node the ring
//! names as its replica (each node read alone: there is no coordinator yet). Rows written
//! to the four-node ring move back when the fourth node is decommissioned. `sluice nodetool
//! status` is parsed at each step.

mod common;

use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::{
    create_simple_keyspace, ip, nodetool, session_on, token_replicas, Ports, ServeNode,
};
use scylla::client::session::Session;

/// Nodes at the start; a fourth joins and leaves.
const NODES: u8 = 3;
/// Every IP a node of the test uses.
const ALL_IPS: u8 = 4;

/// Rows per keyspace and phase.
const ROWS: i32 = 300;
/// Bytes of each row's value, so that streaming moves more than keys.
const VALUE_BYTES: usize = 512;
/// Keyspaces: (name, replication factor).
const KEYSPACES: [(&str, u32); 2] = [("rf1", 1), ("rf2", 2)];

fn token_of(k: i32) -> i64 {
    sluice_ring::Token::of_key(&k.to_be_bytes()).0
}

/// (status code, address, token count) of each node line of `nodetool status`.
fn status_rows(index: u8, ports: Ports) -> Vec<(String, IpAddr, usize)> {
    let text = nodetool(index, ports, 120, &["status"]);
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

/// Writes rows `keys` of `ks.t` to each of their replicas, as node 1's ring names them.
async fn write_rows(sessions: &[(IpAddr, Session)], ks: &str, keys: std::ops::Range<i32>) {
    let lookup = &sessions[0].1;
    for k in keys {
        let value = format!("{k:0>width$}", width = VALUE_BYTES);
        for replica in token_replicas(lookup, ks, token_of(k)).await {
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
        for replica in token_replicas(&sessions[0].1, ks, token_of(k)).await {
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
    let ports = Ports::free_on(ALL_IPS);
    let mut nodes = Vec::new();
    for index in 1..=NODES {
        nodes.push(ServeNode::start(dir.path(), index, ports, &[]).0);
    }
    let status = wait_all_normal(ports, NODES);
    assert!(status.iter().all(|r| r.2 == 8), "{status:?}");
    let mut sessions = Vec::new();
    for index in 1..=NODES {
        sessions.push((ip(index), session_on(ports.cql_of(index)).await));
    }
    for (ks, rf) in KEYSPACES {
        create_simple_keyspace(&sessions[0].1, ks, rf).await;
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
    let (fourth, took) = ServeNode::start(dir.path(), 4, ports, &[]);
    println!("node 4 joined and opened its CQL port in {took:?}");
    let log = fourth.output();
    assert!(
        log.contains("streamed the ranges this node gains"),
        "node 4 did not stream: {log}"
    );
    let status = wait_all_normal(ports, 4);
    assert_eq!(status[3].1, ip(4));
    assert_eq!(status[3].2, 8);
    sessions.push((ip(4), session_on(ports.cql_of(4)).await));
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
    let answer = nodetool(4, ports, 120, &["decommission"]);
    println!("decommission in {:?}: {answer}", started.elapsed());
    assert!(answer.contains("decommissioned"), "{answer}");
    let mut fourth = fourth;
    let exit = fourth.wait_exit(Duration::from_secs(30));
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
    third.kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while status_line(1, ports, ip(3))[0] != "DN" {
        assert!(Instant::now() < deadline, "node 3 never shown down");
        std::thread::sleep(Duration::from_millis(200));
    }
    let answer = nodetool(1, ports, 120, &["removenode", &host_id]);
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
        .args(["--host", &ports.internode_of(2).to_string(), "decommission"])
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
    let text = nodetool(index, ports, 120, &["status"]);
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
