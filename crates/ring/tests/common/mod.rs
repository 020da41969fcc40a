//! Random rings for the property and conformance tests.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_ring::{Node, NodeState, Token, TokenMetadata};
use std::collections::HashSet;
use uuid::Uuid;

/// The shape of a random ring.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Nodes per data center.
    pub nodes_per_dc: usize,
    /// Data centers, named dc1, dc2...
    pub dcs: usize,
    /// Racks per data center; node i of a DC goes to rack i % racks.
    pub racks: usize,
    /// Tokens per node.
    pub tokens: usize,
}

/// A ring of random tokens in `layout`, drawn from `seed`.
pub fn random_ring(layout: Layout, seed: u64) -> TokenMetadata {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut used = HashSet::new();
    let mut nodes = Vec::new();
    for dc in 0..layout.dcs {
        for i in 0..layout.nodes_per_dc {
            let n = nodes.len();
            let mut tokens = Vec::with_capacity(layout.tokens);
            while tokens.len() < layout.tokens {
                let t: i64 = rng.random();
                if t != i64::MIN && used.insert(t) {
                    tokens.push(Token(t));
                }
            }
            nodes.push(Node {
                host_id: Uuid::from_u128(n as u128 + 1),
                cql_address: ([127, 0, (n >> 8) as u8, n as u8 + 1], 9042).into(),
                internode_address: ([127, 0, (n >> 8) as u8, n as u8 + 1], 7000).into(),
                dc: format!("dc{}", dc + 1),
                rack: format!("rack{}", i % layout.racks + 1),
                tokens,
                state: NodeState::Normal,
            });
        }
    }
    TokenMetadata::new(nodes).expect("distinct random tokens make a ring")
}
