//! A cluster of in-process metadata nodes on a [`MemoryNetwork`], for the integration tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_meta::memory::{MemoryNetwork, MemoryTransport};
use sluice_meta::{Apply, MetaConfig, MetaError, MetaLog, MetaNode};

/// An application that records every command it applies, in order, with its index.
#[derive(Default)]
pub struct Recorder {
    pub applied: Vec<(u64, Vec<u8>)>,
}

impl Apply for Recorder {
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8> {
        self.applied.push((index, command.to_vec()));
        (self.applied.len() as u64).to_be_bytes().to_vec()
    }

    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&self.applied).unwrap()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), MetaError> {
        self.applied = serde_json::from_slice(snapshot).map_err(|_| MetaError::Malformed)?;
        Ok(())
    }
}

pub type Node = MetaNode<Recorder, MemoryTransport>;

pub fn addr(id: u64) -> String {
    format!("127.0.0.{id}:7000")
}

/// Nodes 1..=n on one in-process network, each with a data directory of its own.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub network: MemoryNetwork,
    pub nodes: BTreeMap<u64, Arc<Node>>,
    pub snapshot_every: u64,
    /// Applied to each node's configuration after the test timings.
    pub configure: fn(&mut MetaConfig),
}

impl Cluster {
    /// Starts nodes `1..=n`, initializes the group with all of them and waits for a leader.
    pub async fn start(n: u64, seed: u64, snapshot_every: u64) -> Cluster {
        Cluster::start_with(n, seed, snapshot_every, |_| {}).await
    }

    /// [`Cluster::start`] with each node's configuration changed by `configure`.
    pub async fn start_with(
        n: u64,
        seed: u64,
        snapshot_every: u64,
        configure: fn(&mut MetaConfig),
    ) -> Cluster {
        let mut cluster = Cluster {
            dir: tempfile::tempdir().unwrap(),
            network: MemoryNetwork::new(seed),
            nodes: BTreeMap::new(),
            snapshot_every,
            configure,
        };
        for id in 1..=n {
            cluster.open(id).await;
        }
        let members: Vec<(u64, String)> = (1..=n).map(|id| (id, addr(id))).collect();
        cluster.nodes[&1].initialize(&members).await.unwrap();
        cluster.leader(Duration::from_secs(10)).await;
        cluster
    }

    pub fn config(&self, id: u64) -> MetaConfig {
        let mut config = Cluster::config_for(id, &self.data_dir(id), self.snapshot_every);
        (self.configure)(&mut config);
        config
    }

    /// The test timings for node `id` storing in `dir`.
    pub fn config_for(id: u64, dir: &std::path::Path, snapshot_every: u64) -> MetaConfig {
        let mut config = MetaConfig::new(id, &addr(id), dir);
        config.heartbeat = Duration::from_millis(50);
        config.election_min = Duration::from_millis(250);
        config.election_max = Duration::from_millis(500);
        config.rpc_timeout = Duration::from_millis(300);
        config.op_timeout = Duration::from_secs(5);
        config.snapshot_every = snapshot_every;
        config
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node{id}")).join("meta")
    }

    /// Opens node `id` from its directory (replaying its log) and connects it.
    pub async fn open(&mut self, id: u64) -> Arc<Node> {
        let node = Node::open(
            self.config(id),
            Recorder::default(),
            self.network.transport(id),
        )
        .await
        .unwrap();
        self.network.register(id, node.rpc_handler());
        let node = Arc::new(node);
        self.nodes.insert(id, Arc::clone(&node));
        node
    }

    /// Disconnects node `id` and stops it; its directory stays.
    pub async fn stop(&mut self, id: u64) {
        self.network.unregister(id);
        let node = self.nodes.remove(&id).unwrap();
        node.shutdown().await.unwrap();
    }

    pub fn node(&self, id: u64) -> &Arc<Node> {
        &self.nodes[&id]
    }

    /// Waits until every running node agrees on one leader that is running.
    pub async fn leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let leaders: Vec<Option<u64>> = self.nodes.values().map(|n| n.leader()).collect();
            if let Some(Some(leader)) = leaders.first() {
                if leaders.iter().all(|l| *l == Some(*leader)) && self.nodes.contains_key(leader) {
                    return *leader;
                }
            }
            assert!(Instant::now() < deadline, "no agreed leader: {leaders:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until every running node has applied at least `index`.
    pub async fn all_applied(&self, index: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let applied: Vec<u64> = self.nodes.values().map(|n| n.last_applied()).collect();
            if applied.iter().all(|a| *a >= index) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not applied {index}: {applied:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Each running node's applied history.
    pub fn histories(&self) -> BTreeMap<u64, Vec<(u64, Vec<u8>)>> {
        self.nodes
            .iter()
            .map(|(id, node)| (*id, node.with_state(|r| r.applied.clone())))
            .collect()
    }
}

/// Asserts that every history is a prefix of the longest one, and returns the longest.
pub fn assert_one_history(
    histories: impl IntoIterator<Item = Vec<(u64, Vec<u8>)>>,
) -> Vec<(u64, Vec<u8>)> {
    let histories: Vec<_> = histories.into_iter().collect();
    let longest = histories
        .iter()
        .max_by_key(|h| h.len())
        .cloned()
        .unwrap_or_default();
    for history in &histories {
        assert_eq!(
            history[..],
            longest[..history.len()],
            "a node's applied sequence is not a prefix of the longest"
        );
    }
    longest
}

/// The command bytes of a test proposal.
pub fn command(writer: u64, n: u64) -> Vec<u8> {
    format!("w{writer}-{n}").into_bytes()
}
