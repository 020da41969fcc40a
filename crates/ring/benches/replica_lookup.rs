//! The request path's replica lookup: one binary search in a keyspace's replica map.

use criterion::{criterion_group, criterion_main, Criterion};
use sluice_ring::{
    allocate_tokens, Node, NodeState, ReplicaMap, Replication, Token, TokenMetadata,
};
use std::hint::black_box;
use uuid::Uuid;

/// A ring grown one node at a time with the allocator, rack per node.
fn ring(nodes: usize, num_tokens: usize) -> TokenMetadata {
    let mut all: Vec<Node> = Vec::new();
    for n in 0..nodes {
        let meta = TokenMetadata::new(all.clone()).expect("valid ring");
        let tokens = allocate_tokens(&meta, num_tokens, 42).expect("tokens");
        all.push(Node {
            host_id: Uuid::from_u128(n as u128 + 1),
            cql_address: ([127, 0, 0, n as u8 + 1], 9042).into(),
            internode_address: ([127, 0, 0, n as u8 + 1], 7000).into(),
            dc: "datacenter1".into(),
            rack: format!("rack{}", n + 1),
            tokens,
            state: NodeState::Normal,
        });
    }
    TokenMetadata::new(all).expect("valid ring")
}

fn lookup(c: &mut Criterion) {
    let keys: Vec<Token> = (0..4096u64)
        .map(|k| Token::of_key(&k.to_be_bytes()))
        .collect();
    let nts = Replication::NetworkTopology {
        factors: vec![("datacenter1".into(), 3)],
    };
    for (nodes, tokens) in [(3, 16), (6, 16), (64, 16)] {
        let meta = ring(nodes, tokens);
        let map = ReplicaMap::build(&meta, &nts);
        let mut i = 0;
        c.bench_function(&format!("replicas/{nodes}x{tokens}/nts_rf3"), |b| {
            b.iter(|| {
                i = (i + 1) & 4095;
                black_box(map.replicas(black_box(keys[i])).len())
            })
        });
        c.bench_function(&format!("build/{nodes}x{tokens}/nts_rf3"), |b| {
            b.iter(|| black_box(ReplicaMap::build(black_box(&meta), &nts).range_count()))
        });
    }
}

criterion_group!(benches, lookup);
criterion_main!(benches);
