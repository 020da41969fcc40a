//! Proposals per second and commit latency on three in-process metadata nodes with fsynced
//! logs: `cargo run --release -p sluice-meta --example propose_bench [DIR]`.
//!
//! Each level runs C concurrent proposers, each proposing 100-byte commands back to back
//! through the leader (or through a follower, which forwards them), and reports throughput
//! and latency percentiles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_meta::memory::{MemoryNetwork, MemoryTransport};
use sluice_meta::{Apply, MetaConfig, MetaError, MetaLog, MetaNode};

/// Counts applied commands; the benchmark measures the log, not the application.
#[derive(Default)]
struct Count(u64);

impl Apply for Count {
    fn apply(&mut self, _index: u64, _command: &[u8]) -> Vec<u8> {
        self.0 += 1;
        Vec::new()
    }

    fn snapshot(&self) -> Vec<u8> {
        self.0.to_be_bytes().to_vec()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), MetaError> {
        self.0 = u64::from_be_bytes(snapshot.try_into().map_err(|_| MetaError::Malformed)?);
        Ok(())
    }
}

type Node = MetaNode<Count, MemoryTransport>;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), MetaError> {
    let base = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::env::temp_dir().join(format!("sluice-meta-bench-{}", std::process::id()))
        });
    let network = MemoryNetwork::new(1);
    let mut nodes: Vec<Arc<Node>> = Vec::new();
    for id in 1..=3u64 {
        let mut config = MetaConfig::new(
            id,
            &format!("127.0.0.{id}:7000"),
            base.join(format!("node{id}")),
        );
        config.snapshot_every = 10_000;
        let node = Node::open(config, Count::default(), network.transport(id)).await?;
        network.register(id, node.rpc_handler());
        nodes.push(Arc::new(node));
    }
    let members: Vec<(u64, String)> = (1..=3)
        .map(|id| (id, format!("127.0.0.{id}:7000")))
        .collect();
    nodes[0].initialize(&members).await?;
    let leader = loop {
        if let Some(leader) = nodes[0].leader() {
            break leader;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let follower = Arc::clone(&nodes[(leader % 3) as usize]);
    let leader = Arc::clone(&nodes[(leader - 1) as usize]);
    println!("through    concurrency  proposals  seconds  proposals/s  p50_ms  p99_ms  max_ms");
    let levels = [
        ("leader", 1usize, 1_000usize),
        ("leader", 8, 500),
        ("leader", 32, 250),
        ("leader", 128, 100),
        ("follower", 1, 500),
        ("follower", 32, 250),
    ];
    for (through, concurrency, per_task) in levels {
        let target = if through == "leader" {
            &leader
        } else {
            &follower
        };
        let started = Instant::now();
        let tasks: Vec<_> = (0..concurrency)
            .map(|_| {
                let node = Arc::clone(target);
                tokio::spawn(async move {
                    let mut latencies = Vec::with_capacity(per_task);
                    for _ in 0..per_task {
                        let begin = Instant::now();
                        node.propose(node.next_request_id(), vec![7u8; 100]).await?;
                        latencies.push(begin.elapsed());
                    }
                    Ok::<_, MetaError>(latencies)
                })
            })
            .collect();
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await.expect("proposer task")?);
        }
        let elapsed = started.elapsed();
        latencies.sort();
        println!(
            "{:<9}  {:>11}  {:>9}  {:>7.2}  {:>11.0}  {:>6.2}  {:>6.2}  {:>6.2}",
            through,
            concurrency,
            latencies.len(),
            elapsed.as_secs_f64(),
            latencies.len() as f64 / elapsed.as_secs_f64(),
            percentile(&latencies, 0.50).as_secs_f64() * 1e3,
            percentile(&latencies, 0.99).as_secs_f64() * 1e3,
            latencies[latencies.len() - 1].as_secs_f64() * 1e3,
        );
    }
    for node in &nodes {
        node.shutdown().await?;
    }
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}
