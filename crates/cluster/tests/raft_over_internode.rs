//! Three metadata nodes on 127.0.0.1, 127.0.0.2 and 127.0.0.3, each with its own messenger,
//! talking Raft over real TCP: election, concurrent proposals, failover of the leader, and a
//! restart from the data directory on the same address.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_cluster::verbs::VERB_RAFT;
use sluice_cluster::{serve_raft, PeerDirectory, RaftTransport};
use sluice_internode::{CallError, ConnectionClass, Messenger, MessengerConfig};
use sluice_meta::{Apply, MetaConfig, MetaError, MetaLog, MetaNode};
use tokio::task::JoinHandle;

const CLUSTER: &str = "raft-over-internode";
/// The bound of each step that waits for the cluster.
const STEP: Duration = Duration::from_secs(15);

/// Bound on a stopped follower catching up 400 entries: its appends and their fsyncs share the
/// machine with the other tests of this file, and the test is about catching up, not its speed.
const CATCH_UP: Duration = Duration::from_secs(60);
/// A new leader must be agreed within this after the old one stops (election timeouts are
/// 250-500 ms here).
const FAILOVER_BOUND: Duration = Duration::from_secs(5);

/// Records every command it applies, in order, with its index.
#[derive(Default)]
struct Recorder {
    applied: Vec<(u64, Vec<u8>)>,
    /// Snapshots restored, at open or sent by the leader.
    restores: usize,
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
        self.restores += 1;
        Ok(())
    }
}

type Meta = MetaNode<Recorder, RaftTransport>;

/// One running node: its messenger, metadata node and Raft service.
struct Node {
    messenger: Arc<Messenger>,
    meta: Arc<Meta>,
    service: JoinHandle<()>,
}

/// Runs `step`, failing the test if it takes longer than `limit`.
async fn bounded<F: Future>(what: &str, limit: Duration, step: F) -> F::Output {
    match tokio::time::timeout(limit, step).await {
        Ok(output) => output,
        Err(_) => panic!("{what} took longer than {limit:?}"),
    }
}

/// Applied entries between snapshots, unless a test asks for snapshots.
const RARE_SNAPSHOTS: u64 = 5_000;

fn meta_config(id: u64, addr: SocketAddr, dir: &Path, snapshot_every: u64) -> MetaConfig {
    let mut config = MetaConfig::new(id, &addr.to_string(), dir);
    config.heartbeat = Duration::from_millis(50);
    config.election_min = Duration::from_millis(250);
    config.election_max = Duration::from_millis(500);
    config.rpc_timeout = Duration::from_millis(300);
    config.op_timeout = Duration::from_secs(5);
    config.snapshot_every = snapshot_every;
    config
}

/// Starts node `id` listening on `listen` (port 0 picks one) with its log in `dir`.
async fn start_node(
    id: u64,
    listen: SocketAddr,
    dir: &Path,
    directory: Arc<PeerDirectory>,
) -> Node {
    start_node_with(id, listen, dir, directory, RARE_SNAPSHOTS).await
}

/// [`start_node`], with a snapshot every `snapshot_every` applied entries.
async fn start_node_with(
    id: u64,
    listen: SocketAddr,
    dir: &Path,
    directory: Arc<PeerDirectory>,
    snapshot_every: u64,
) -> Node {
    let messenger = Arc::new(
        Messenger::bind(MessengerConfig::new(CLUSTER, u128::from(id), listen))
            .await
            .unwrap(),
    );
    let addr = messenger.local_addr();
    directory.insert(id, addr);
    let transport = RaftTransport::new(Arc::clone(&messenger), directory);
    let meta = Meta::open(
        meta_config(id, addr, dir, snapshot_every),
        Recorder::default(),
        transport,
    )
    .await
    .unwrap();
    let control = messenger.take_inbound(ConnectionClass::Control).unwrap();
    let service = serve_raft(control, meta.rpc_handler());
    Node {
        messenger,
        meta: Arc::new(meta),
        service,
    }
}

/// Stops the node's messenger (its peers see it go), then its metadata node; its data
/// directory stays.
async fn stop_node(node: Node) {
    node.messenger.shutdown().await;
    node.meta.shutdown().await.unwrap();
    bounded("the Raft service ending", STEP, node.service)
        .await
        .unwrap();
}

/// Waits until every node in `nodes` names the same leader, one of them.
async fn agreed_leader(nodes: &BTreeMap<u64, Node>) -> u64 {
    loop {
        let leaders: Vec<Option<u64>> = nodes.values().map(|n| n.meta.leader()).collect();
        if let Some(Some(leader)) = leaders.first() {
            if leaders.iter().all(|l| *l == Some(*leader)) && nodes.contains_key(leader) {
                return *leader;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every node in `nodes` has applied `index`.
async fn all_applied(nodes: &BTreeMap<u64, Node>, index: u64) {
    while nodes.values().any(|n| n.meta.last_applied() < index) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn command(writer: u64, n: u64) -> Vec<u8> {
    format!("w{writer}-{n}").into_bytes()
}

/// Proposes `per_writer` commands from each of `writers` tasks, writer `w` through node
/// `ids[w % len]`, and returns every committed index.
async fn propose_concurrently(
    nodes: &BTreeMap<u64, Node>,
    writers: std::ops::Range<u64>,
    per_writer: u64,
) -> Vec<u64> {
    let ids: Vec<u64> = nodes.keys().copied().collect();
    let mut tasks = Vec::new();
    for writer in writers {
        let meta = Arc::clone(&nodes[&ids[writer as usize % ids.len()]].meta);
        tasks.push(tokio::spawn(async move {
            let mut indexes = Vec::new();
            for n in 0..per_writer {
                let committed = meta
                    .propose(meta.next_request_id(), command(writer, n))
                    .await
                    .unwrap();
                indexes.push(committed.index);
            }
            indexes
        }));
    }
    let mut indexes = Vec::new();
    for task in tasks {
        indexes.extend(task.await.unwrap());
    }
    indexes
}

/// Asserts that every node applied exactly the same sequence and returns it.
fn one_history(nodes: &BTreeMap<u64, Node>) -> Vec<(u64, Vec<u8>)> {
    let histories: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = nodes
        .iter()
        .map(|(id, n)| (*id, n.meta.with_state(|r| r.applied.clone())))
        .collect();
    let first = histories.values().next().unwrap().clone();
    for (id, history) in &histories {
        assert_eq!(*history, first, "node {id} applied another sequence");
    }
    first
}

fn data_dir(root: &Path, id: u64) -> PathBuf {
    root.join(format!("node{id}")).join("meta")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_fail_over_and_catch_up_over_tcp() {
    let root = tempfile::tempdir().unwrap();
    let mut directories = BTreeMap::new();
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        // Each node has its own directory, as separate processes would.
        let directory = Arc::new(PeerDirectory::new());
        let listen: SocketAddr = format!("127.0.0.{id}:0").parse().unwrap();
        let node = start_node(
            id,
            listen,
            &data_dir(root.path(), id),
            Arc::clone(&directory),
        )
        .await;
        directories.insert(id, directory);
        nodes.insert(id, node);
    }
    let addrs: BTreeMap<u64, SocketAddr> = nodes
        .iter()
        .map(|(id, n)| (*id, n.messenger.local_addr()))
        .collect();
    for directory in directories.values() {
        for (id, addr) in &addrs {
            directory.insert(*id, *addr);
        }
    }
    let members: Vec<(u64, String)> = addrs.iter().map(|(id, a)| (*id, a.to_string())).collect();

    let started = Instant::now();
    nodes[&1].meta.initialize(&members).await.unwrap();
    let first_leader = bounded("the first election", STEP, agreed_leader(&nodes)).await;
    eprintln!(
        "first leader {first_leader} agreed after {:?}",
        started.elapsed()
    );

    // 200 proposals from 8 tasks, through every node: followers forward to the leader.
    let started = Instant::now();
    let indexes = bounded(
        "200 concurrent proposals",
        STEP,
        propose_concurrently(&nodes, 0..8, 25),
    )
    .await;
    let elapsed = started.elapsed();
    eprintln!(
        "200 proposals from 8 tasks: {elapsed:?}, {:.0}/s",
        200.0 / elapsed.as_secs_f64()
    );
    assert_eq!(
        indexes.iter().collect::<HashSet<_>>().len(),
        200,
        "one index per proposal"
    );
    let last = *indexes.iter().max().unwrap();
    bounded("every node applying 200", STEP, all_applied(&nodes, last)).await;
    let history = one_history(&nodes);
    assert_eq!(history.len(), 200);
    for writer in 0..8 {
        // Each writer's proposals were sequential, so they apply in its order.
        let mine: Vec<Vec<u8>> = history
            .iter()
            .map(|(_, c)| c.clone())
            .filter(|c| c.starts_with(format!("w{writer}-").as_bytes()))
            .collect();
        assert_eq!(
            mine,
            (0..25).map(|n| command(writer, n)).collect::<Vec<_>>()
        );
    }

    // Stop the leader: the other two elect a new one and keep committing.
    let old = first_leader;
    let old_applied = nodes[&old].meta.last_applied();
    stop_node(nodes.remove(&old).unwrap()).await;
    let stopped = Instant::now();
    let new = bounded(
        "the election after the leader stopped",
        FAILOVER_BOUND,
        agreed_leader(&nodes),
    )
    .await;
    let failover = stopped.elapsed();
    assert_ne!(new, old);
    let indexes = bounded(
        "100 proposals on two nodes",
        STEP,
        propose_concurrently(&nodes, 8..12, 25),
    )
    .await;
    let after_failover = stopped.elapsed();
    eprintln!("new leader {new} after {failover:?}; 100 more proposals committed {after_failover:?} after the stop");
    let last = *indexes.iter().max().unwrap();
    bounded("two nodes applying 300", STEP, all_applied(&nodes, last)).await;
    assert_eq!(one_history(&nodes).len(), 300);

    // Restart the old leader from its directory on the same address: it replays its own log,
    // then catches up with what it missed.
    let reopened = Instant::now();
    let node = start_node(
        old,
        addrs[&old],
        &data_dir(root.path(), old),
        Arc::clone(&directories[&old]),
    )
    .await;
    assert_eq!(node.messenger.local_addr(), addrs[&old]);
    assert!(
        node.meta.last_applied() >= old_applied,
        "replayed {} of the {old_applied} it had applied",
        node.meta.last_applied()
    );
    let caught_up = bounded("catching up", STEP, node.meta.wait_caught_up(STEP))
        .await
        .unwrap();
    eprintln!(
        "node {old} reopened and caught up to {caught_up} in {:?}",
        reopened.elapsed()
    );
    assert!(caught_up >= last);
    nodes.insert(old, node);
    bounded("three nodes applying 300", STEP, all_applied(&nodes, last)).await;
    assert_eq!(one_history(&nodes).len(), 300);

    // The restarted node proposes too, so its path to the leader works again.
    let meta = Arc::clone(&nodes[&old].meta);
    let committed = bounded(
        "a proposal from the restarted node",
        STEP,
        meta.propose(meta.next_request_id(), b"after".to_vec()),
    )
    .await
    .unwrap();
    bounded(
        "three nodes applying 301",
        STEP,
        all_applied(&nodes, committed.index),
    )
    .await;
    assert_eq!(one_history(&nodes).len(), 301);

    for node in std::mem::take(&mut nodes).into_values() {
        stop_node(node).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_raft_messages_are_refused_and_the_node_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let directory = Arc::new(PeerDirectory::new());
    let node = start_node(
        1,
        "127.0.0.1:0".parse().unwrap(),
        &data_dir(root.path(), 1),
        directory,
    )
    .await;
    let addr = node.messenger.local_addr();
    node.meta
        .initialize(&[(1, addr.to_string())])
        .await
        .unwrap();

    let stranger = Messenger::bind(MessengerConfig::new(
        CLUSTER,
        99,
        "127.0.0.2:0".parse().unwrap(),
    ))
    .await
    .unwrap();
    let call = |verb: u16, body: &'static [u8]| {
        stranger.call(
            addr,
            ConnectionClass::Control,
            verb,
            Bytes::from_static(body),
            Instant::now() + Duration::from_secs(2),
        )
    };
    // No kind byte, an unknown kind, and a known kind with a body that is not its message.
    assert_eq!(call(VERB_RAFT, b"").await, Err(CallError::Failed));
    assert_eq!(call(VERB_RAFT, b"{}\x09").await, Err(CallError::Failed));
    assert_eq!(
        call(VERB_RAFT, b"not json\x02").await,
        Err(CallError::Failed)
    );
    assert_eq!(
        call(VERB_RAFT + 1000, b"").await,
        Err(CallError::UnknownVerb)
    );

    let committed = bounded(
        "a proposal after malformed messages",
        STEP,
        node.meta
            .propose(node.meta.next_request_id(), b"ok".to_vec()),
    )
    .await
    .unwrap();
    assert_eq!(committed.response, 1u64.to_be_bytes());
    stranger.shutdown().await;
    stop_node(node).await;
}

/// Starts nodes 1..=3 on 127.0.0.1-3 with `snapshot_every`, initialized, with an agreed leader.
async fn start_three(
    root: &Path,
    snapshot_every: u64,
) -> (
    BTreeMap<u64, Node>,
    BTreeMap<u64, SocketAddr>,
    Arc<PeerDirectory>,
) {
    let directory = Arc::new(PeerDirectory::new());
    let mut nodes = BTreeMap::new();
    for id in 1..=3u64 {
        let listen: SocketAddr = format!("127.0.0.{id}:0").parse().unwrap();
        nodes.insert(
            id,
            start_node_with(
                id,
                listen,
                &data_dir(root, id),
                Arc::clone(&directory),
                snapshot_every,
            )
            .await,
        );
    }
    let addrs: BTreeMap<u64, SocketAddr> = nodes
        .iter()
        .map(|(id, n)| (*id, n.messenger.local_addr()))
        .collect();
    let members: Vec<(u64, String)> = addrs.iter().map(|(id, a)| (*id, a.to_string())).collect();
    nodes[&1].meta.initialize(&members).await.unwrap();
    bounded("the first election", STEP, agreed_leader(&nodes)).await;
    (nodes, addrs, directory)
}

/// Stops a follower, commits 400 commands of `command_bytes` without it, restarts it on its
/// address and returns how long it took to apply them all and how many snapshots it restored.
async fn follower_catches_up_400_commands(
    command_bytes: usize,
    snapshot_every: u64,
) -> (Duration, usize) {
    let root = tempfile::tempdir().unwrap();
    let (mut nodes, addrs, directory) = start_three(root.path(), snapshot_every).await;
    let leader = agreed_leader(&nodes).await;
    let follower = *nodes.keys().find(|id| **id != leader).unwrap();
    stop_node(nodes.remove(&follower).unwrap()).await;
    let meta = Arc::clone(&nodes[&leader].meta);
    let mut last = 0;
    for n in 0..400u64 {
        let mut command = command(0, n);
        command.resize(command_bytes, b'x');
        last = bounded(
            "a proposal",
            STEP,
            meta.propose(meta.next_request_id(), command),
        )
        .await
        .unwrap()
        .index;
    }
    let node = start_node_with(
        follower,
        addrs[&follower],
        &data_dir(root.path(), follower),
        directory,
        snapshot_every,
    )
    .await;
    nodes.insert(follower, node);
    let started = Instant::now();
    bounded(
        "the follower applying 400 commands",
        CATCH_UP,
        all_applied(&nodes, last),
    )
    .await;
    let elapsed = started.elapsed();
    assert_eq!(one_history(&nodes).len(), 400);
    let restores = nodes[&follower].meta.with_state(|r| r.restores);
    for node in std::mem::take(&mut nodes).into_values() {
        stop_node(node).await;
    }
    (elapsed, restores)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_400_entries_behind_catches_up_in_full_appends() {
    // 300 entries of 512 bytes (hex-encoded in the message) make one append of about 330 KB,
    // which fits the Control queue and commits within openraft's append deadline.
    let (elapsed, restores) = follower_catches_up_400_commands(512, RARE_SNAPSHOTS).await;
    assert_eq!(restores, 0, "caught up from the log");
    eprintln!("caught up 400 x 512 B in {elapsed:?}");
}

/// 300 entries of 4 KiB encode to about 2.5 MB, more than the Control queue holds and more than
/// the heartbeat deadline allows: the metadata client answers openraft `PayloadTooLarge` with
/// fewer entries, so the follower catches up in appends of at most `max_append_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_400_entries_behind_catches_up_with_4_kib_commands() {
    let (elapsed, restores) = follower_catches_up_400_commands(4096, RARE_SNAPSHOTS).await;
    assert_eq!(restores, 0, "caught up from the log");
    eprintln!("caught up 400 x 4 KiB in {elapsed:?}");
}

/// With a snapshot every 64 entries the leader has purged the log the stopped follower needs,
/// so it is sent a snapshot of about 1.6 MB (400 commands of 1 KiB as JSON numbers) in chunks
/// that each fit `max_append_bytes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_behind_the_purged_log_installs_a_chunked_snapshot_over_tcp() {
    let (elapsed, restores) = follower_catches_up_400_commands(1024, 64).await;
    assert!(restores >= 1, "caught up by snapshot");
    eprintln!("caught up 400 x 1 KiB by snapshot in {elapsed:?}");
}
