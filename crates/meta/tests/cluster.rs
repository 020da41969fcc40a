//! Three to four in-process metadata nodes with fsynced logs: election, ordering, failover,
//! restart and replay, partitions, membership changes and duplicate proposals.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_meta::{AppliedEvent, MetaError, MetaLog};
use support::{addr, assert_one_history, command, Cluster};

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_proposals_apply_in_one_order_everywhere() {
    let cluster = Cluster::start(3, 1, 5_000).await;
    let mut events = cluster.node(2).subscribe();
    let mut tasks = Vec::new();
    for writer in 0..8u64 {
        // Writers propose through every node, so followers forward to the leader.
        let node = Arc::clone(cluster.node(writer % 3 + 1));
        tasks.push(tokio::spawn(async move {
            let mut indexes = Vec::new();
            for n in 0..125 {
                let committed = node
                    .propose(node.next_request_id(), command(writer, n))
                    .await
                    .unwrap();
                indexes.push(committed.index);
                // The proposer has applied its own write when propose returns.
                assert!(node.last_applied() >= committed.index);
            }
            indexes
        }));
    }
    let mut indexes = Vec::new();
    for task in tasks {
        indexes.extend(task.await.unwrap());
    }
    assert_eq!(indexes.len(), 1_000);
    assert_eq!(
        indexes.iter().collect::<HashSet<_>>().len(),
        1_000,
        "one index per proposal"
    );
    let last = *indexes.iter().max().unwrap();
    cluster.all_applied(last, WAIT).await;

    let histories = cluster.histories();
    let history = assert_one_history(histories.values().cloned());
    for h in histories.values() {
        assert_eq!(h.len(), 1_000, "every node applied every proposal");
    }
    let commands: HashSet<Vec<u8>> = history.iter().map(|(_, c)| c.clone()).collect();
    assert_eq!(commands.len(), 1_000);
    // Each writer's proposals were sequential, so they apply in its order.
    for writer in 0..8 {
        let mine: Vec<&Vec<u8>> = history
            .iter()
            .map(|(_, c)| c)
            .filter(|c| c.starts_with(format!("w{writer}-").as_bytes()))
            .collect();
        let expected: Vec<Vec<u8>> = (0..125).map(|n| command(writer, n)).collect();
        assert_eq!(mine, expected.iter().collect::<Vec<_>>());
    }
    // A subscriber sees the same commands in the same order.
    let mut seen = Vec::new();
    while seen.len() < 1_000 {
        match events.recv().await.unwrap() {
            AppliedEvent::Command { index, command } => seen.push((index, command.to_vec())),
            AppliedEvent::Restored { .. } => panic!("no snapshot was installed"),
        }
    }
    assert_eq!(seen, history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_over_and_the_old_one_catches_up() {
    let mut cluster = Cluster::start(3, 2, 5_000).await;
    let old = cluster.leader(WAIT).await;
    for n in 0..50 {
        let node = cluster.node(old);
        node.propose(node.next_request_id(), command(0, n))
            .await
            .unwrap();
    }
    cluster.stop(old).await;
    let started = Instant::now();
    let new = cluster.leader(WAIT).await;
    assert_ne!(new, old);
    let follower = *cluster.nodes.keys().find(|id| **id != new).unwrap();
    for n in 0..50 {
        let node = cluster.node(follower);
        node.propose(node.next_request_id(), command(1, n))
            .await
            .unwrap();
    }
    eprintln!("failover and 50 proposals: {:?}", started.elapsed());

    cluster.open(old).await;
    let index = cluster.node(old).wait_caught_up(WAIT).await.unwrap();
    cluster.all_applied(index, WAIT).await;
    let histories = cluster.histories();
    let history = assert_one_history(histories.values().cloned());
    assert_eq!(history.len(), 100);
    for h in histories.values() {
        assert_eq!(h.len(), 100);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_forwarded_to_a_leader_that_goes_silent_commits_through_the_next_one() {
    // One forward attempt may wait 4 x rpc_timeout (8 s), longer than the whole operation
    // (op_timeout, 5 s): only a retry on the new leader can commit in time.
    let cluster = Cluster::start_with(3, 12, 5_000, |config| {
        config.rpc_timeout = Duration::from_secs(2);
    })
    .await;
    let old = cluster.leader(WAIT).await;
    let follower = *cluster.nodes.keys().find(|id| **id != old).unwrap();
    let node = Arc::clone(cluster.node(follower));
    node.propose(node.next_request_id(), b"before".to_vec())
        .await
        .unwrap();
    // The leader's process stops: every message to and from it, replies included, is held.
    cluster.network.pause(old);
    let started = Instant::now();
    let committed = node
        .propose(node.next_request_id(), b"after".to_vec())
        .await
        .expect("committed through the new leader");
    let took = started.elapsed();
    eprintln!("a proposal through a follower of a silent leader committed in {took:?}");
    assert_ne!(node.leader(), Some(old));
    assert!(took < Duration::from_secs(4), "{took:?}");

    // The old leader returns and catches up; the held forward, delivered late, applies nothing
    // more: the proposal is in every history once.
    cluster.network.resume(old);
    let index = cluster.node(old).wait_caught_up(WAIT).await.unwrap();
    cluster.all_applied(index.max(committed.index), WAIT).await;
    let history = assert_one_history(cluster.histories().into_values());
    let commands: Vec<&[u8]> = history.iter().map(|(_, c)| c.as_slice()).collect();
    assert_eq!(commands, vec![&b"before"[..], &b"after"[..]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_replays_its_log_and_snapshot_before_serving() {
    // A snapshot every 64 entries, so the restart restores one and replays the log after it.
    let mut cluster = Cluster::start(3, 3, 64).await;
    for n in 0..200 {
        let node = cluster.node(1);
        node.propose(node.next_request_id(), command(0, n))
            .await
            .unwrap();
    }
    cluster
        .all_applied(cluster.node(1).last_applied(), WAIT)
        .await;
    let leader = cluster.leader(WAIT).await;
    let victim = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    let before = cluster.node(victim).with_state(|r| r.applied.clone());
    let applied_before = cluster.node(victim).last_applied();
    assert_eq!(before.len(), 200);
    assert!(
        cluster.node(victim).snapshot_index() >= 64,
        "a snapshot was stored"
    );
    assert!(
        cluster.node(victim).purged_index() > 0,
        "the log before it was purged"
    );
    cluster.stop(victim).await;

    // Cut off from the others, the reopened node can only have its own disk.
    cluster.network.partition(&[&[victim]]);
    let reopened = cluster.open(victim).await;
    assert_eq!(
        reopened.last_applied(),
        applied_before,
        "replayed to the committed index"
    );
    assert_eq!(reopened.with_state(|r| r.applied.clone()), before);
    assert_eq!(
        tokio::time::timeout(WAIT, reopened.wait_caught_up(Duration::from_millis(400)))
            .await
            .unwrap(),
        Err(MetaError::Timeout),
        "a cut-off node cannot pass the read barrier"
    );

    cluster.network.heal();
    for n in 0..20 {
        let node = cluster.node(victim);
        node.propose(node.next_request_id(), command(1, n))
            .await
            .unwrap();
    }
    let index = reopened.wait_caught_up(WAIT).await.unwrap();
    cluster.all_applied(index, WAIT).await;
    let histories = cluster.histories();
    let history = assert_one_history(histories.values().cloned());
    assert_eq!(history.len(), 220);
    assert!(histories.values().all(|h| h.len() == 220));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_cannot_commit_while_the_majority_can() {
    let cluster = Cluster::start(3, 4, 5_000).await;
    let old = cluster.leader(WAIT).await;
    let majority: Vec<u64> = cluster
        .nodes
        .keys()
        .copied()
        .filter(|id| *id != old)
        .collect();
    cluster
        .node(old)
        .propose(cluster.node(old).next_request_id(), b"before".to_vec())
        .await
        .unwrap();
    let applied_before = cluster.node(old).last_applied();

    cluster.network.partition(&[&[old], &majority]);
    // The old leader, alone, still takes the proposal but cannot commit it.
    let lost = command(9, 9);
    let alone = Arc::clone(cluster.node(old));
    let lost_attempt = {
        let lost = lost.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_millis(1_500),
                alone.propose(alone.next_request_id(), lost),
            )
            .await
        })
    };
    // The majority elects a leader of its own and commits.
    let node = Arc::clone(cluster.node(majority[0]));
    let committed = node
        .propose(node.next_request_id(), b"majority".to_vec())
        .await
        .unwrap();
    assert!(committed.index > applied_before);
    assert!(
        lost_attempt.await.unwrap().is_err(),
        "the minority committed"
    );
    assert_eq!(
        cluster.node(old).last_applied(),
        applied_before,
        "the minority applied nothing"
    );
    assert_eq!(
        cluster
            .node(old)
            .wait_caught_up(Duration::from_millis(300))
            .await,
        Err(MetaError::Timeout)
    );

    cluster.network.heal();
    let index = cluster.node(old).wait_caught_up(WAIT).await.unwrap();
    cluster.all_applied(index, WAIT).await;
    let history = assert_one_history(cluster.histories().into_values());
    let commands: Vec<&[u8]> = history.iter().map(|(_, c)| c.as_slice()).collect();
    assert_eq!(
        commands,
        vec![&b"before"[..], &b"majority"[..]],
        "the minority's entry was discarded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_node_joins_as_learner_is_promoted_then_removed() {
    let mut cluster = Cluster::start(3, 5, 5_000).await;
    for n in 0..30 {
        let node = cluster.node(2);
        node.propose(node.next_request_id(), command(0, n))
            .await
            .unwrap();
    }
    let fourth = cluster.open(4).await;
    assert!(fourth.members().voters.is_empty(), "not a member yet");

    // Membership changes can be asked of any node; they run on the leader.
    cluster.node(3).add_learner(4, addr(4)).await.unwrap();
    let members = cluster.node(1).members();
    assert_eq!(members.learners, vec![(4, addr(4))]);
    assert_eq!(members.voters.len(), 3);
    cluster
        .all_applied(cluster.node(1).last_applied(), WAIT)
        .await;
    assert_eq!(
        fourth.with_state(|r| r.applied.len()),
        30,
        "the learner has the log"
    );

    cluster.node(2).promote(4).await.unwrap();
    let members = cluster.node(1).members();
    assert_eq!(
        members.voters.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert!(members.learners.is_empty());
    assert!(!members.joint, "the joint configuration was left");
    // With four voters, a quorum is three: stop one and the other three still commit.
    let leader = cluster.leader(WAIT).await;
    let other = *cluster
        .nodes
        .keys()
        .find(|id| **id != leader && **id != 4)
        .unwrap();
    cluster.stop(other).await;
    fourth
        .propose(fourth.next_request_id(), b"four voters".to_vec())
        .await
        .unwrap();
    cluster.open(other).await;

    cluster.node(1).remove(4).await.unwrap();
    let members = cluster.node(1).members();
    assert_eq!(
        members.voters.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(members.learners.is_empty());
    cluster.stop(4).await;
    let node = cluster.node(other);
    node.propose(node.next_request_id(), b"three again".to_vec())
        .await
        .unwrap();
    let index = node.last_applied();
    cluster.all_applied(index, WAIT).await;
    let history = assert_one_history(cluster.histories().into_values());
    assert_eq!(history.len(), 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_proposal_applies_once() {
    let cluster = Cluster::start(3, 6, 5_000).await;
    let request = cluster.node(1).next_request_id();
    let first = cluster
        .node(1)
        .propose(request, b"once".to_vec())
        .await
        .unwrap();
    // The same request id from another node (a retry after a lost reply) answers the first.
    let retry = cluster
        .node(2)
        .propose(request, b"once".to_vec())
        .await
        .unwrap();
    assert_eq!(retry, first);
    // Concurrent duplicates of a new request: all get one answer.
    let request = cluster.node(3).next_request_id();
    let tasks: Vec<_> = (1..=3)
        .map(|id| {
            let node = Arc::clone(cluster.node(id));
            tokio::spawn(async move { node.propose(request, b"twice?".to_vec()).await.unwrap() })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    let other = cluster
        .node(3)
        .propose(cluster.node(3).next_request_id(), b"other".to_vec())
        .await
        .unwrap();
    cluster.all_applied(other.index, WAIT).await;
    let history = assert_one_history(cluster.histories().into_values());
    let commands: Vec<&[u8]> = history.iter().map(|(_, c)| c.as_slice()).collect();
    assert_eq!(commands, vec![&b"once"[..], &b"twice?"[..], &b"other"[..]]);
    assert_eq!(first.response, 1u64.to_be_bytes());
    assert_eq!(answers[0].response, 2u64.to_be_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_the_purged_log_is_sent_a_snapshot() {
    // A snapshot every 32 entries keeps only 8 entries of log behind it.
    let mut cluster = Cluster::start(3, 7, 32).await;
    let leader = cluster.leader(WAIT).await;
    let behind = *cluster.nodes.keys().find(|id| **id != leader).unwrap();
    cluster.stop(behind).await;
    for n in 0..200 {
        let node = cluster.node(leader);
        node.propose(node.next_request_id(), command(0, n))
            .await
            .unwrap();
    }
    assert!(
        cluster.node(leader).purged_index() > 100,
        "the leader purged its log"
    );

    cluster.network.partition(&[&[behind]]);
    let reopened = cluster.open(behind).await;
    let mut events = reopened.subscribe();
    assert!(reopened.last_applied() < 100);
    cluster.network.heal();
    let index = reopened.wait_caught_up(WAIT).await.unwrap();
    assert!(index >= 200);
    match tokio::time::timeout(WAIT, events.recv())
        .await
        .unwrap()
        .unwrap()
    {
        AppliedEvent::Restored { index } => assert!(index > 100, "restored up to {index}"),
        other => panic!("expected a snapshot install first, got {other:?}"),
    }
    cluster.all_applied(index, WAIT).await;
    let histories = cluster.histories();
    assert_one_history(histories.values().cloned());
    assert!(histories.values().all(|h| h.len() == 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_and_oversized_commands_are_rejected() {
    use sluice_meta::{RpcKind, TransportError};
    let cluster = Cluster::start(3, 8, 5_000).await;
    let handler = cluster.node(2).rpc_handler();
    for kind in [
        RpcKind::AppendEntries,
        RpcKind::Vote,
        RpcKind::InstallSnapshot,
        RpcKind::Forward,
    ] {
        for body in [
            &b""[..],
            b"{",
            b"[1,2,3]",
            b"{\"vote\":7}",
            &[0xff, 0xfe, 0x00],
        ] {
            assert!(matches!(
                handler.handle(kind, body).await,
                Err(TransportError::Rejected(_))
            ));
        }
        assert_eq!(RpcKind::from_u8(kind.to_u8()), Some(kind));
    }
    assert_eq!(RpcKind::from_u8(0), None);
    let node = cluster.node(1);
    let too_large = vec![0u8; node_config_limit() + 1];
    assert_eq!(
        node.propose(node.next_request_id(), too_large).await,
        Err(MetaError::TooLarge)
    );
    // The group still works.
    node.propose(node.next_request_id(), b"still here".to_vec())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_bound_that_does_not_fit_one_append_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Cluster::config_for(1, dir.path(), 5_000);
    // Hex doubles a command: half the append bound cannot fit with the message around it.
    config.max_command_bytes = config.max_append_bytes / 2;
    let network = sluice_meta::memory::MemoryNetwork::new(1);
    let opened =
        support::Node::open(config.clone(), Default::default(), network.transport(1)).await;
    assert_eq!(opened.err(), Some(MetaError::Misconfigured));
    // An append bound too small for a useful snapshot chunk is refused too.
    config.max_command_bytes = 16;
    config.max_append_bytes = 8 * 1024;
    let opened =
        support::Node::open(config.clone(), Default::default(), network.transport(1)).await;
    assert_eq!(opened.err(), Some(MetaError::Misconfigured));
    // A consistent pair opens.
    config.max_append_bytes = 256 * 1024;
    config.max_command_bytes = 100 * 1024;
    let node = support::Node::open(config, Default::default(), network.transport(1))
        .await
        .unwrap();
    node.shutdown().await.unwrap();
}

fn node_config_limit() -> usize {
    sluice_meta::MetaConfig::new(0, "", "/nonexistent").max_command_bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_on_demand_and_a_stopped_node_refuses_work() {
    let cluster = Cluster::start(3, 9, 5_000).await;
    let leader = cluster.leader(WAIT).await;
    let follower = Arc::clone(cluster.nodes.values().find(|n| n.id() != leader).unwrap());
    for n in 0..10 {
        follower
            .propose(follower.next_request_id(), command(0, n))
            .await
            .unwrap();
    }
    let at = follower.snapshot_now(WAIT).await.unwrap();
    assert!(at >= 10 && follower.snapshot_index() >= at);

    follower.shutdown().await.unwrap();
    assert_eq!(
        follower
            .propose(follower.next_request_id(), b"after".to_vec())
            .await,
        Err(MetaError::Stopped)
    );
    assert_eq!(follower.read_barrier().await, Err(MetaError::Stopped));
    let node = cluster.node(leader);
    let committed = node
        .propose(node.next_request_id(), b"others".to_vec())
        .await
        .unwrap();
    let history = node.with_state(|r| r.applied.clone());
    assert_eq!(history.last(), Some(&(committed.index, b"others".to_vec())));
    assert!(!history.iter().any(|(_, c)| c == b"after"));
}
