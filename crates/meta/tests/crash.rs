//! Durability under `kill -9`: a child process commits proposals on a one-node group and
//! prints each acknowledgement; the parent kills it mid-stream, reopens its directory and
//! checks that every acknowledged proposal was replayed at its index.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_meta::MetaLog;
use support::{addr, Cluster, Node, Recorder};

const CHILD_DIR: &str = "SLUICE_META_CRASH_CHILD";
const TEST_NAME: &str = "acknowledged_proposals_survive_kill_9";

/// The child: proposes from four tasks until killed (or for at most 30 s), printing
/// `ACK <index> <command>` once each proposal is acknowledged.
fn run_child(dir: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let network = sluice_meta::memory::MemoryNetwork::new(1);
        let config = Cluster::config_for(1, std::path::Path::new(dir), 50);
        let node = Node::open(config, Recorder::default(), network.transport(1))
            .await
            .unwrap();
        network.register(1, node.rpc_handler());
        node.initialize(&[(1, addr(1))]).await.unwrap();
        let node = Arc::new(node);
        let deadline = Instant::now() + Duration::from_secs(30);
        let tasks: Vec<_> = (0..4u64)
            .map(|writer| {
                let node = Arc::clone(&node);
                tokio::spawn(async move {
                    let mut n = 0;
                    while Instant::now() < deadline {
                        let command = format!("w{writer}-{n}");
                        n += 1;
                        let committed = node
                            .propose(node.next_request_id(), command.clone().into_bytes())
                            .await
                            .unwrap();
                        println!("ACK {} {command}", committed.index);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

#[test]
fn acknowledged_proposals_survive_kill_9() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        run_child(&dir);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("meta");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_DIR, &data)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut acked: Vec<(u64, Vec<u8>)> = Vec::new();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines {
        let line = line.unwrap();
        let Some(rest) = line.strip_prefix("ACK ") else {
            continue;
        };
        let (index, command) = rest.split_once(' ').unwrap();
        acked.push((index.parse().unwrap(), command.as_bytes().to_vec()));
        if acked.len() == 400 {
            // SIGKILL: no destructor, no flush, no shutdown.
            child.kill().unwrap();
            break;
        }
    }
    child.wait().unwrap();
    assert_eq!(acked.len(), 400, "the child stopped before it was killed");

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let network = sluice_meta::memory::MemoryNetwork::new(2);
        let config = Cluster::config_for(1, &data, 50);
        let node = Node::open(config, Recorder::default(), network.transport(1)).await.unwrap();
        network.register(1, node.rpc_handler());
        let replayed = node.with_state(|r| r.applied.len());
        // Once it is leader again it commits whatever its log holds beyond the replay.
        node.wait_caught_up(Duration::from_secs(10)).await.unwrap();
        let history = node.with_state(|r| r.applied.clone());
        for (index, command) in &acked {
            assert!(
                history.iter().any(|(i, c)| i == index && c == command),
                "acknowledged {} at {index} lost",
                String::from_utf8_lossy(command)
            );
        }
        eprintln!(
            "killed after {} acknowledgements; replayed {replayed} at open, {} after the read barrier",
            acked.len(),
            history.len()
        );
        node.shutdown().await.unwrap();
    });
}
