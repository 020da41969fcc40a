//! Placement invariants on random rings.

mod common;

use common::{random_ring, Layout};
use proptest::prelude::*;
use sluice_ring::allocation::allocate_tokens_for_replication;
use sluice_ring::{
    allocate_tokens, natural_replicas, Node, NodeIndex, NodeState, ReplicaMap, Replication, Token,
    TokenMetadata,
};
use std::collections::HashSet;

fn layout() -> impl Strategy<Value = Layout> {
    (1usize..=7, 1usize..=3, 1usize..=4, 1usize..=16).prop_map(
        |(nodes_per_dc, dcs, racks, tokens)| Layout {
            nodes_per_dc,
            dcs,
            racks,
            tokens,
        },
    )
}

fn distinct(r: &[NodeIndex]) -> bool {
    r.iter().collect::<HashSet<_>>().len() == r.len()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn simple_strategy_gives_rf_distinct_nodes_primary_first(
        layout in layout(), seed: u64, rf in 1u32..=6, tokens in prop::collection::vec(any::<i64>(), 1..32)
    ) {
        let meta = random_ring(layout, seed);
        let r = Replication::Simple { factor: rf };
        let map = ReplicaMap::build(&meta, &r);
        let mut out = Vec::new();
        for t in tokens.into_iter().map(Token).chain(meta.tokens().iter().copied()) {
            natural_replicas(&meta, &r, t, &mut out);
            prop_assert_eq!(out.len(), (rf as usize).min(meta.owner_count()));
            prop_assert!(distinct(&out));
            prop_assert_eq!(Some(out[0]), meta.owner_of(t), "the primary owns the token");
            prop_assert_eq!(map.replicas(t), out.as_slice());
        }
    }

    #[test]
    fn nts_gives_each_dc_its_factor_on_distinct_racks_when_it_can(
        layout in layout(), seed: u64, rfs in prop::collection::vec(0u32..=5, 3),
        tokens in prop::collection::vec(any::<i64>(), 1..32)
    ) {
        let meta = random_ring(layout, seed);
        let factors: Vec<(String, u32)> = rfs.iter().enumerate()
            .filter(|(_, &rf)| rf > 0)
            .map(|(i, &rf)| (format!("dc{}", i + 1), rf))
            .collect();
        let r = Replication::NetworkTopology { factors };
        let map = ReplicaMap::build(&meta, &r);
        let mut out = Vec::new();
        for t in tokens.into_iter().map(Token).chain(meta.tokens().iter().copied()) {
            natural_replicas(&meta, &r, t, &mut out);
            prop_assert!(distinct(&out));
            prop_assert_eq!(map.replicas(t), out.as_slice());
            for dc in 0..meta.dc_count() as u16 {
                let rf = r.factor_in(meta.dc_name(dc)) as usize;
                let in_dc: Vec<NodeIndex> = out.iter().copied().filter(|&n| meta.dc_of(n) == dc).collect();
                prop_assert_eq!(in_dc.len(), rf.min(meta.dc_owner_count(dc)));
                if meta.dc_rack_count(dc) >= rf {
                    let racks: HashSet<u32> = in_dc.iter().map(|&n| meta.rack_of(n)).collect();
                    prop_assert_eq!(racks.len(), in_dc.len(), "one replica per rack");
                }
            }
            let owner = meta.owner_of(t).unwrap();
            if r.factor_in(meta.dc_name(meta.dc_of(owner))) > 0 {
                prop_assert_eq!(out[0], owner, "the primary owns the token");
            }
        }
    }

    #[test]
    fn allocated_tokens_are_new_and_valid(layout in layout(), seed: u64, n in 1usize..=64) {
        let meta = random_ring(layout, seed);
        let tokens = allocate_tokens(&meta, n, seed).unwrap();
        prop_assert_eq!(tokens.len(), n);
        let existing: HashSet<Token> = meta.tokens().iter().copied().collect();
        let fresh: HashSet<Token> = tokens.iter().copied().collect();
        prop_assert_eq!(fresh.len(), n);
        prop_assert!(tokens.iter().all(|t| *t != Token::MIN && !existing.contains(t)));
        prop_assert_eq!(allocate_tokens(&meta, n, seed).unwrap(), tokens, "deterministic");
    }
}

proptest! {
    // Each case runs the greedy search, a few hundred placements of the whole ring.
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn replication_aware_tokens_are_new_and_valid(
        layout in layout(), seed: u64, n in 1usize..=16, rf in 1u32..=3
    ) {
        let meta = random_ring(layout, seed);
        let joining = Node {
            host_id: uuid::Uuid::from_u128(u128::MAX),
            cql_address: ([127, 0, 9, 9], 9042).into(),
            internode_address: ([127, 0, 9, 9], 7000).into(),
            dc: "dc1".into(),
            rack: "rack-new".into(),
            tokens: Vec::new(),
            state: NodeState::Joining,
        };
        let r = Replication::NetworkTopology { factors: vec![("dc1".into(), rf)] };
        let tokens = allocate_tokens_for_replication(&meta, &joining, &r, n, seed).unwrap();
        prop_assert_eq!(tokens.len(), n);
        let existing: HashSet<Token> = meta.tokens().iter().copied().collect();
        prop_assert!(tokens.iter().all(|t| *t != Token::MIN && !existing.contains(t)));
        let mut nodes = meta.nodes().to_vec();
        nodes.push(Node { tokens: tokens.clone(), state: NodeState::Normal, ..joining.clone() });
        prop_assert!(TokenMetadata::new(nodes).is_ok(), "the joined ring is valid");
        prop_assert_eq!(
            allocate_tokens_for_replication(&meta, &joining, &r, n, seed).unwrap(),
            tokens,
            "deterministic"
        );
    }
}
