//! Prints the ownership balance of rings grown with the token allocator: for each node
//! count, every node's primary share and its replicated share at RF 3 (rack per node).
//!
//! `cargo run -p sluice-ring --example ownership -- [num_tokens] [seed] [rf-aware]`

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
    let rf_aware = args.next().as_deref() == Some("rf-aware");
    let rf3 = Replication::NetworkTopology {
        factors: vec![("datacenter1".into(), 3)],
    };
    let mut nodes: Vec<Node> = Vec::new();
    for n in 0..8usize {
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
        let meta = TokenMetadata::new(nodes.clone()).expect("valid ring");
        let primary = primary_ownership(&meta);
        let replicated = replicated_ownership(&meta, &rf3);
        let (pmin, pmax, pmean) = spread(&primary);
        let (rmin, rmax, rmean) = spread(&replicated);
        println!(
            "{} nodes x {num_tokens} tokens: primary min {:.4} max {:.4} (max/mean {:.3}); \
             RF3 replicated min {:.4} max {:.4} (max/mean {:.3})",
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
