//! A seeded schedule of kills, restarts, partitions, pauses, delays and drops under concurrent
//! proposals. Every node's applied sequence must be a prefix of one history, and every
//! acknowledged proposal must be in it once, at the index it was acknowledged with.
//!
//! `SLUICE_META_SEED` and `SLUICE_META_STEPS` replay or lengthen a schedule.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_meta::MetaLog;
use support::{assert_one_history, command, Cluster, Node};

type Live = Arc<Mutex<BTreeMap<u64, Arc<Node>>>>;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pick(live: &Live, rng: &mut StdRng) -> Option<Arc<Node>> {
    let live = live.lock().unwrap();
    if live.is_empty() {
        return None;
    }
    let n = rng.random_range(0..live.len());
    live.values().nth(n).cloned()
}

/// Proposes until `stop`, retrying a failed proposal with the same request id on other nodes.
/// Returns the acknowledged (command, index) pairs and the commands never acknowledged.
async fn proposer(
    writer: u64,
    seed: u64,
    live: Live,
    stop: Arc<AtomicBool>,
) -> (Vec<(Vec<u8>, u64)>, Vec<Vec<u8>>) {
    let mut rng = StdRng::seed_from_u64(seed ^ (writer << 32));
    let mut acked = Vec::new();
    let mut unacked = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let Some(first) = pick(&live, &mut rng) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let request = first.next_request_id();
        let cmd = command(writer, n);
        n += 1;
        let mut node = first;
        let mut done = false;
        for _attempt in 0..4 {
            let attempt = tokio::time::timeout(
                Duration::from_millis(1_500),
                node.propose(request, cmd.clone()),
            );
            if let Ok(Ok(committed)) = attempt.await {
                acked.push((cmd.clone(), committed.index));
                done = true;
                break;
            }
            match pick(&live, &mut rng) {
                Some(other) => node = other,
                None => break,
            }
        }
        if !done {
            unacked.push(cmd);
        }
    }
    (acked, unacked)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_fault_schedule_keeps_one_history_with_every_acknowledged_proposal() {
    let seed = env_or("SLUICE_META_SEED", 20261126);
    let steps = env_or("SLUICE_META_STEPS", 30);
    eprintln!("fault schedule: seed {seed}, {steps} steps");
    let mut rng = StdRng::seed_from_u64(seed);
    // Frequent snapshots, so restarts restore them and laggards are sent them.
    let mut cluster = Cluster::start(3, seed, 40).await;
    let live: Live = Arc::new(Mutex::new(cluster.nodes.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|writer| tokio::spawn(proposer(writer, seed, Arc::clone(&live), Arc::clone(&stop))))
        .collect();

    let mut longest: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut down: Vec<u64> = Vec::new();
    let mut paused: Vec<u64> = Vec::new();
    for step in 0..steps {
        let action = rng.random_range(0..7);
        let target = rng.random_range(1..=3u64);
        let what = match action {
            0 if down.is_empty() => {
                live.lock().unwrap().remove(&target);
                cluster.stop(target).await;
                down.push(target);
                format!("kill {target}")
            }
            1 if !down.is_empty() => {
                let id = down.remove(0);
                let node = cluster.open(id).await;
                live.lock().unwrap().insert(id, node);
                format!("restart {id}")
            }
            2 => {
                let others: Vec<u64> = (1..=3).filter(|id| *id != target).collect();
                cluster.network.partition(&[&[target], &others]);
                format!("partition {target} from {others:?}")
            }
            3 => {
                cluster.network.heal();
                "heal".to_owned()
            }
            4 if paused.is_empty() => {
                cluster.network.pause(target);
                paused.push(target);
                format!("pause {target}")
            }
            5 => {
                for id in paused.drain(..) {
                    cluster.network.resume(id);
                }
                "resume".to_owned()
            }
            _ => {
                let delay = Duration::from_millis(rng.random_range(0..15));
                let drops = rng.random_range(0..20_000);
                cluster.network.set_delay(delay);
                cluster.network.set_drop_rate(drops);
                format!("delay up to {delay:?}, drop {drops} per million")
            }
        };
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..400))).await;
        let histories = cluster.histories();
        let applied: Vec<usize> = histories.values().map(Vec::len).collect();
        let leaders: Vec<Option<u64>> = cluster.nodes.values().map(|n| n.leader()).collect();
        eprintln!("step {step}: {what}; applied {applied:?}, leaders {leaders:?}");
        longest = assert_one_history(histories.into_values().chain([longest]));
    }

    // Heal everything and let the writers stop.
    stop.store(true, Ordering::Relaxed);
    cluster.network.heal();
    cluster.network.set_delay(Duration::ZERO);
    cluster.network.set_drop_rate(0);
    for id in paused.drain(..) {
        cluster.network.resume(id);
    }
    for id in down.drain(..) {
        let node = cluster.open(id).await;
        live.lock().unwrap().insert(id, node);
    }
    let mut acked = Vec::new();
    let mut unacked = Vec::new();
    for writer in writers {
        let (a, u) = tokio::time::timeout(Duration::from_secs(30), writer)
            .await
            .unwrap()
            .unwrap();
        acked.extend(a);
        unacked.extend(u);
    }
    cluster.leader(Duration::from_secs(10)).await;
    // Once healed, the group is live again: every node gets proposals through.
    for (id, node) in &cluster.nodes {
        for n in 0..10 {
            let cmd = command(100 + id, n);
            let committed = node
                .propose(node.next_request_id(), cmd.clone())
                .await
                .unwrap();
            acked.push((cmd, committed.index));
        }
    }
    let mut caught_up = 0;
    for node in cluster.nodes.values() {
        caught_up = caught_up.max(node.wait_caught_up(Duration::from_secs(10)).await.unwrap());
    }
    cluster
        .all_applied(caught_up, Duration::from_secs(10))
        .await;

    let histories = cluster.histories();
    let history = assert_one_history(histories.values().cloned().chain([longest]));
    assert!(
        histories.values().all(|h| *h == history),
        "every node converged"
    );
    let mut positions: HashMap<&[u8], Vec<u64>> = HashMap::new();
    for (index, cmd) in &history {
        positions.entry(cmd.as_slice()).or_default().push(*index);
    }
    assert!(
        positions.values().all(|p| p.len() == 1),
        "a proposal applied twice"
    );
    for (cmd, index) in &acked {
        assert_eq!(
            positions.get(cmd.as_slice()),
            Some(&vec![*index]),
            "acknowledged {} missing or moved",
            String::from_utf8_lossy(cmd)
        );
    }
    let unacked_applied = unacked
        .iter()
        .filter(|c| positions.contains_key(c.as_slice()))
        .count();
    eprintln!(
        "acknowledged {}, unacknowledged {} ({} of them applied anyway), history {}",
        acked.len(),
        unacked.len(),
        unacked_applied,
        history.len()
    );
}
