//! Cluster membership over real TCP: three `ClusterNode`s on 127.0.0.1, 127.0.0.2 and
//! 127.0.0.3, the first starting a new cluster and the other two joining through it; a
//! restart from the data directory; a join whose only seed is unreachable; a node past the
//! group's voters joining as a learner; a malformed join request.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_cluster::verbs::VERB_JOIN;
use sluice_cluster::{ClusterConfig, ClusterNode, StartError};
use sluice_internode::{ConnectionClass, Messenger, MessengerConfig};
use sluice_meta::MetaLog;
use sluice_ring::{NodeState, TokenMetadata};
use tokio::sync::watch;
use uuid::Uuid;

const CLUSTER: &str = "membership";
/// The bound of each step that waits for the cluster.
const STEP: Duration = Duration::from_secs(30);

/// Runs `step`, failing the test if it takes longer than `limit`.
async fn bounded<F: Future>(what: &str, limit: Duration, step: F) -> F::Output {
    match tokio::time::timeout(limit, step).await {
        Ok(output) => output,
        Err(_) => panic!("{what} took longer than {limit:?}"),
    }
}

fn host(n: u8) -> Uuid {
    Uuid::from_u128(0x5_0000 + u128::from(n))
}

/// Node `n` on 127.0.0.n, on a free internode port unless `internode` names one.
fn config(n: u8, dir: &Path, internode: Option<SocketAddr>, seeds: &[SocketAddr]) -> ClusterConfig {
    let listen = internode.unwrap_or_else(|| ([127, 0, 0, n], 0).into());
    let mut config = ClusterConfig::new(
        CLUSTER,
        host(n),
        ([127, 0, 0, n], 9042).into(),
        listen,
        dir.join(format!("node{n}")),
    );
    config.seeds = seeds.to_vec();
    config.join_timeout = STEP;
    config.join_attempt_timeout = Duration::from_secs(15);
    config
}

/// True once `ring` has exactly `count` nodes, all Normal with `tokens` tokens each.
fn settled(ring: &TokenMetadata, count: usize, tokens: usize) -> bool {
    ring.nodes().len() == count
        && ring
            .nodes()
            .iter()
            .all(|n| n.state == NodeState::Normal && n.tokens.len() == tokens)
}

/// Waits until `ring` satisfies `settled`.
async fn wait_settled(mut ring: watch::Receiver<Arc<TokenMetadata>>, count: usize) {
    loop {
        if settled(&ring.borrow_and_update(), count, 16) {
            return;
        }
        ring.changed()
            .await
            .expect("the node stopped publishing its ring");
    }
}

/// The (host id, tokens, state) of every node, sorted by host id.
fn summary(ring: &TokenMetadata) -> Vec<(Uuid, Vec<i64>, NodeState)> {
    let mut nodes: Vec<_> = ring
        .nodes()
        .iter()
        .map(|n| (n.host_id, n.tokens.iter().map(|t| t.0).collect(), n.state))
        .collect();
    nodes.sort_by_key(|n| n.0);
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_join_converge_and_a_restarted_node_keeps_its_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let first = bounded(
        "starting the first node",
        STEP,
        ClusterNode::start(config(1, dir.path(), None, &[])),
    )
    .await
    .expect("the first node starts a new cluster");
    let seed = first.internode_addr();
    assert_eq!(first.tokens().len(), 16);

    // The two others join at the same time through the first.
    let (second, third) = bounded("two joins", STEP, async {
        tokio::join!(
            ClusterNode::start(config(2, dir.path(), None, &[seed])),
            ClusterNode::start(config(3, dir.path(), None, &[seed])),
        )
    })
    .await;
    let second = second.expect("the second node joins");
    let third = third.expect("the third node joins");
    let nodes = [&first, &second, &third];
    for node in nodes {
        bounded("convergence", STEP, wait_settled(node.ring(), 3)).await;
    }
    println!("three nodes Normal after {:?}", started.elapsed());

    let expected = summary(&first.ring().borrow());
    for node in nodes {
        assert_eq!(summary(&node.ring().borrow()), expected, "rings differ");
        let own = expected
            .iter()
            .find(|n| n.0 == node.host_id())
            .expect("every node is in the ring");
        let tokens: Vec<i64> = node.tokens().iter().map(|t| t.0).collect();
        assert_eq!(tokens, own.1, "a node's tokens are the ring's");
    }
    let all: BTreeSet<i64> = expected.iter().flat_map(|n| n.1.clone()).collect();
    assert_eq!(all.len(), 48, "no two nodes share a token");
    assert_eq!(first.ring().borrow().tokens().len(), 48);
    let members = first.meta().members();
    assert_eq!(members.voters.len(), 3, "three voters: {members:?}");
    assert!(members.learners.is_empty());
    // Two joins and two state changes after the first node's own two.
    assert!(first.topology().version() >= 6);

    // The third node restarts from its data directory on the same address.
    let third_addr = third.internode_addr();
    let third_tokens = third.tokens().to_vec();
    bounded("stopping the third node", STEP, third.stop())
        .await
        .unwrap();
    drop(third);
    let restarted = bounded(
        "restarting the third node",
        STEP,
        ClusterNode::start(config(3, dir.path(), Some(third_addr), &[seed])),
    )
    .await
    .expect("the third node restarts");
    assert_eq!(restarted.tokens(), &third_tokens[..], "tokens kept");
    assert_eq!(restarted.internode_addr(), third_addr);
    bounded(
        "convergence after the restart",
        STEP,
        wait_settled(restarted.ring(), 3),
    )
    .await;
    assert_eq!(summary(&restarted.ring().borrow()), expected);

    // The restarted node follows the group: a change made elsewhere reaches it.
    let version = restarted.topology().version();
    let mut ring = restarted.ring();
    let change = sluice_cluster::TopologyCommand::SetState {
        host_id: host(2),
        state: sluice_cluster::topology::WireState::Leaving,
    };
    let meta = second.meta();
    bounded(
        "a change after the restart",
        STEP,
        meta.propose(meta.next_request_id(), change.encode()),
    )
    .await
    .unwrap();
    bounded("the restarted node sees it", STEP, async {
        loop {
            let leaving = ring
                .borrow_and_update()
                .nodes()
                .iter()
                .any(|n| n.host_id == host(2) && n.state == NodeState::Leaving);
            if leaving {
                return;
            }
            ring.changed().await.unwrap();
        }
    })
    .await;
    assert!(restarted.topology().version() > version);

    for node in [&first, &second, &restarted] {
        bounded("stopping", STEP, node.stop()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_seed_is_unreachable_fails_within_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    // A port that nothing listens on: bound, then closed.
    let dead_seed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut config = config(2, dir.path(), None, &[dead_seed]);
    let bound = Duration::from_secs(3);
    config.join_timeout = bound;
    let started = Instant::now();
    let result = bounded(
        "a join through a dead seed",
        bound * 3,
        ClusterNode::start(config),
    )
    .await;
    let elapsed = started.elapsed();
    match result {
        Err(StartError::NoSeedAnswered { attempts, last }) => {
            assert!(attempts >= 2, "it retried: {attempts} attempts");
            assert_eq!(last, "peer down");
            let message = StartError::NoSeedAnswered { attempts, last }.to_string();
            assert!(message.contains("no seed admitted this node"), "{message}");
        }
        Err(other) => panic!("expected NoSeedAnswered, got {other}"),
        Ok(_) => panic!("a node joined through a seed that does not exist"),
    }
    assert!(elapsed >= bound, "gave up early: {elapsed:?}");
    assert!(
        elapsed < bound + Duration::from_secs(2),
        "overran its bound: {elapsed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_voters_a_node_joins_as_a_learner_and_garbage_joins_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut first_config = config(1, dir.path(), None, &[]);
    first_config.max_voters = 1;
    let first = bounded("the first node", STEP, ClusterNode::start(first_config))
        .await
        .expect("the first node starts a new cluster");
    let seed = first.internode_addr();

    // A join request that is not one is refused with an answer, and the seed keeps serving.
    let stranger = Messenger::bind(MessengerConfig::new(
        CLUSTER,
        99,
        ([127, 0, 0, 9], 0).into(),
    ))
    .await
    .unwrap();
    let reply = stranger
        .call(
            seed,
            ConnectionClass::Control,
            VERB_JOIN,
            Bytes::from_static(b"\x01{\"not\":\"a join\"}"),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .expect("a malformed join is answered, not dropped");
    assert_eq!(&reply[..], b"\x01{\"Refused\":\"Malformed\"}");
    stranger.shutdown().await;

    let second = bounded(
        "the second node",
        STEP,
        ClusterNode::start(config(2, dir.path(), None, &[seed])),
    )
    .await
    .expect("the second node joins");
    for node in [&first, &second] {
        bounded("convergence", STEP, wait_settled(node.ring(), 2)).await;
    }
    let members = first.meta().members();
    assert_eq!(members.voters.len(), 1, "{members:?}");
    assert_eq!(
        members.learners.iter().map(|l| l.0).collect::<Vec<_>>(),
        vec![sluice_cluster::raft_node_id(host(2))],
        "the second node is a learner"
    );
    assert_eq!(
        summary(&first.ring().borrow()),
        summary(&second.ring().borrow())
    );
    let second_addr = second.internode_addr();
    for node in [&first, &second] {
        bounded("stopping", STEP, node.stop()).await.unwrap();
    }

    // Restarted from its data directory on another port, the node refuses to start rather than
    // leave the others calling its old address.
    let moved = config(2, dir.path(), None, &[seed]);
    let result = bounded("a restart on another port", STEP, ClusterNode::start(moved)).await;
    match result {
        Err(error) => assert_eq!(error, StartError::AddressChanged, "{error}"),
        Ok(node) => panic!(
            "started on {} though the ring has it at {second_addr}",
            node.internode_addr()
        ),
    }
}
