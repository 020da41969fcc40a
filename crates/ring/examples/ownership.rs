//! Prints the ownership balance of rings grown with the token allocator: for each node
//! count, every node's primary share and its replicated share at RF 3 (rack per node).
//!
//! `cargo run -p sluice-ring --example ownership -- [num_tokens] [seed] [rf-aware|random]
//! [nodes]`
//! (`random`: the mean over 20 rings of random tokens, ScyllaDB's scheme, for comparison).

use sluice_ring::allocation::{allocate_tokens_for_replication, replicated_ownership};
use sluice_ring::{
    allocate_tokens, primary_ownership, Node, NodeState, Replication, TokenMetadata,
};
use uuid::Uuid;

fn spread(v: &[f64]) -> (f64, f64, f64) {
    let min = v.iter().copied().fold(f64::MAX, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    (min, max, mean)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let num_tokens: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(16);
    let seed: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let mode = args.next().unwrap_or_default();
    let max_nodes: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let rf_aware = mode == "rf-aware";
    if mode == "random" {
        random_baseline(num_tokens);
        return;
    }
    let rf3 = Replication::NetworkTopology {
        factors: vec![("datacenter1".into(), 3)],
    };
    let mut nodes: Vec<Node> = Vec::new();
    for n in 0..max_nodes {
        let started = std::time::Instant::now();
        let meta = TokenMetadata::new(nodes.clone()).expect("valid ring");
        let mut node = Node {
            host_id: Uuid::from_u128(n as u128 + 1),
            cql_address: ([127, 0, 0, n as u8 + 1], 9042).into(),
            internode_address: ([127, 0, 0, n as u8 + 1], 7000).into(),
            dc: "datacenter1".into(),
            rack: format!("rack{}", n + 1),
            tokens: Vec::new(),
            state: NodeState::Normal,
        };
        node.tokens = if rf_aware {
            allocate_tokens_for_replication(&meta, &node, &rf3, num_tokens, seed)
        } else {
            allocate_tokens(&meta, num_tokens, seed)
        }
        .expect("tokens");
        nodes.push(node);
        let took = started.elapsed();
        let meta = TokenMetadata::new(nodes.clone()).expect("valid ring");
        let primary = primary_ownership(&meta);
        let replicated = replicated_ownership(&meta, &rf3);
        let (pmin, pmax, pmean) = spread(&primary);
        let (rmin, rmax, rmean) = spread(&replicated);
        println!(
            "{} nodes x {num_tokens} tokens: primary min {:.4} max {:.4} (max/mean {:.3}); \
             RF3 replicated min {:.4} max {:.4} (max/mean {:.3}); allocated in {took:?}",
            n + 1,
            pmin,
            pmax,
            pmax / pmean,
            rmin,
            rmax,
            rmax / rmean
        );
    }
}

/// Mean max/mean shares over 20 rings of random tokens per node count.
fn random_baseline(num_tokens: usize) {
    use rand::{Rng, SeedableRng};
    let rf3 = Replication::NetworkTopology {
        factors: vec![("datacenter1".into(), 3)],
    };
    for nodes in [3usize, 4, 6] {
        let (mut primary, mut replicated) = (0.0, 0.0);
        for seed in 0..20u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let all: Vec<Node> = (0..nodes)
                .map(|n| Node {
                    host_id: Uuid::from_u128(n as u128 + 1),
                    cql_address: ([127, 0, 0, n as u8 + 1], 9042).into(),
                    internode_address: ([127, 0, 0, n as u8 + 1], 7000).into(),
                    dc: "datacenter1".into(),
                    rack: format!("rack{}", n + 1),
                    tokens: (0..num_tokens)
                        .map(|_| sluice_ring::Token(rng.random_range(i64::MIN + 1..=i64::MAX)))
                        .collect(),
                    state: NodeState::Normal,
                })
                .collect();
            let meta = TokenMetadata::new(all).expect("distinct random tokens");
            let (_, pmax, pmean) = spread(&primary_ownership(&meta));
            let (_, rmax, rmean) = spread(&replicated_ownership(&meta, &rf3));
            primary += pmax / pmean / 20.0;
            replicated += rmax / rmean / 20.0;
        }
        println!(
            "random {nodes} nodes x {num_tokens} tokens: mean over 20 rings of primary max/mean \
             {primary:.3}, RF3 replicated max/mean {replicated:.3}"
        );
    }
}
