//! Replica placement, exactly Cassandra's (`SimpleStrategy`, and
//! `NetworkTopologyStrategy.calculateNaturalReplicas`), and the per-keyspace replica map
//! that makes a request's lookup one binary search.

use crate::metadata::TokenMetadata;
use crate::node::NodeIndex;
use crate::replication::Replication;
use crate::token::Token;

/// Appends the natural replicas of `token` to `out` (cleared first), primary first: the
/// owner of the first ring token >= `token` comes first whenever its DC takes replicas.
///
/// - SimpleStrategy: the first `factor` distinct nodes walking the ring from there.
/// - NetworkTopologyStrategy: one walk of the global ring; per DC, `rf_left = min(RF_dc,
///   nodes_dc)` and `acceptable_rack_repeats = RF_dc - racks_dc`; a node in a (dc, rack)
///   not yet seen is taken, a node in a seen rack only while repeats are left; the walk
///   ends when every DC is done.
/// - LocalStrategy: nothing; the caller serves such data from the local node.
///
/// An empty ring gives no replicas.
pub fn natural_replicas(
    meta: &TokenMetadata,
    replication: &Replication,
    token: Token,
    out: &mut Vec<NodeIndex>,
) {
    out.clear();
    if meta.is_empty() {
        return;
    }
    let start = meta.first_token_index(token);
    match replication {
        Replication::Local => {}
        Replication::Simple { factor } => simple(meta, *factor as usize, start, out),
        Replication::NetworkTopology { factors } => {
            let mut dcs: Vec<Option<DcFill>> = vec![None; meta.dc_count()];
            let mut dcs_to_fill = 0;
            for (name, rf) in factors {
                let Some(dc) = meta.dc_named(name) else {
                    continue;
                };
                let nodes = meta.dc_owner_count(dc);
                if *rf == 0 || nodes == 0 {
                    continue;
                }
                let rf = *rf as i64;
                dcs[usize::from(dc)] = Some(DcFill {
                    rf_left: rf.min(nodes as i64),
                    acceptable_rack_repeats: rf - meta.dc_rack_count(dc) as i64,
                });
                dcs_to_fill += 1;
            }
            network_topology(meta, &mut dcs, dcs_to_fill, start, out);
        }
    }
}

/// Appends to `out` (cleared first) the pending replicas of `token`: the nodes that replicate
/// it in `settled` (the ring once the moving nodes settle, [`TokenMetadata::settled`]) and
/// are not among `natural`, its natural replicas in the current ring. Writes go to both, so
/// that a node has every write of a range from the moment it starts taking the range over.
pub fn pending_replicas(
    settled: &TokenMetadata,
    replication: &Replication,
    token: Token,
    natural: &[NodeIndex],
    out: &mut Vec<NodeIndex>,
) {
    natural_replicas(settled, replication, token, out);
    out.retain(|n| !natural.contains(n));
}

fn simple(meta: &TokenMetadata, factor: usize, start: usize, out: &mut Vec<NodeIndex>) {
    let owners = meta.owners();
    let want = factor.min(meta.owner_count());
    for i in 0..owners.len() {
        if out.len() >= want {
            break;
        }
        let owner = owners[(start + i) % owners.len()];
        if !out.contains(&owner) {
            out.push(owner);
        }
    }
}

/// One data center's progress in the NTS walk (Cassandra's `DatacenterEndpoints`).
#[derive(Debug, Clone, Copy)]
struct DcFill {
    rf_left: i64,
    acceptable_rack_repeats: i64,
}

fn network_topology(
    meta: &TokenMetadata,
    dcs: &mut [Option<DcFill>],
    mut dcs_to_fill: usize,
    start: usize,
    out: &mut Vec<NodeIndex>,
) {
    let owners = meta.owners();
    let mut seen_racks: Vec<u32> = Vec::new();
    for i in 0..owners.len() {
        if dcs_to_fill == 0 {
            break;
        }
        let node = owners[(start + i) % owners.len()];
        let Some(fill) = dcs[usize::from(meta.dc_of(node))].as_mut() else {
            continue;
        };
        if fill.rf_left <= 0 || out.contains(&node) {
            continue;
        }
        let rack = meta.rack_of(node);
        if !seen_racks.contains(&rack) {
            seen_racks.push(rack);
        } else if fill.acceptable_rack_repeats > 0 {
            fill.acceptable_rack_repeats -= 1;
        } else {
            // rf_left distinct racks remain: no more repeats of a seen rack.
            continue;
        }
        out.push(node);
        fill.rf_left -= 1;
        if fill.rf_left <= 0 {
            dcs_to_fill -= 1;
        }
    }
}

/// A keyspace's replicas for every range of the ring, precomputed when the ring or the
/// keyspace changes, so that a request's lookup is one binary search and copies nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaMap {
    /// The ring's sorted tokens; range i is `(tokens[i - 1], tokens[i]]`, wrapping.
    tokens: Box<[Token]>,
    /// Range i's replicas are `replicas[starts[i]..starts[i + 1]]`.
    starts: Box<[u32]>,
    replicas: Box<[NodeIndex]>,
}

impl ReplicaMap {
    /// Computes the replicas of every range of `meta` under `replication`. A LocalStrategy
    /// keyspace or an empty ring gives an empty map.
    pub fn build(meta: &TokenMetadata, replication: &Replication) -> ReplicaMap {
        if matches!(replication, Replication::Local) || meta.is_empty() {
            return ReplicaMap {
                tokens: Box::new([]),
                starts: Box::new([0]),
                replicas: Box::new([]),
            };
        }
        let mut starts = Vec::with_capacity(meta.tokens().len() + 1);
        let mut replicas = Vec::new();
        let mut one = Vec::new();
        starts.push(0);
        for &t in meta.tokens() {
            natural_replicas(meta, replication, t, &mut one);
            replicas.extend_from_slice(&one);
            starts.push(replicas.len() as u32);
        }
        ReplicaMap {
            tokens: meta.tokens().into(),
            starts: starts.into(),
            replicas: replicas.into(),
        }
    }

    /// The replicas of `token`, primary first; empty for an empty map.
    #[inline]
    pub fn replicas(&self, token: Token) -> &[NodeIndex] {
        if self.tokens.is_empty() {
            return &[];
        }
        let mut i = self.tokens.partition_point(|&x| x < token);
        if i == self.tokens.len() {
            i = 0;
        }
        let (from, to) = (self.starts[i] as usize, self.starts[i + 1] as usize);
        debug_assert!(from <= to && to <= self.replicas.len());
        &self.replicas[from..to]
    }

    /// The number of ranges (the ring's token count).
    pub fn range_count(&self) -> usize {
        self.tokens.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::tests::node;

    fn replicas(meta: &TokenMetadata, r: &Replication, t: i64) -> Vec<u16> {
        let mut out = Vec::new();
        natural_replicas(meta, r, Token(t), &mut out);
        let map = ReplicaMap::build(meta, r);
        assert_eq!(map.replicas(Token(t)), out.as_slice(), "map = walk");
        out.into_iter().map(|n| n.0).collect()
    }

    #[test]
    fn simple_strategy_takes_distinct_nodes_walking_the_ring() {
        // Ring: 0:n0 10:n1 20:n0 30:n2 40:n3
        let m = TokenMetadata::new(vec![
            node(1, "dc1", "r1", &[0, 20]),
            node(2, "dc1", "r1", &[10]),
            node(3, "dc1", "r1", &[30]),
            node(4, "dc1", "r1", &[40]),
        ])
        .unwrap();
        let rf = |f| Replication::Simple { factor: f };
        assert_eq!(replicas(&m, &rf(3), 5), vec![1, 0, 2]);
        assert_eq!(replicas(&m, &rf(3), 41), vec![0, 1, 2], "wraps");
        assert_eq!(
            replicas(&m, &rf(9), 15),
            vec![0, 2, 3, 1],
            "capped at the nodes"
        );
        assert_eq!(replicas(&m, &rf(0), 15), Vec::<u16>::new());
    }

    #[test]
    fn nts_prefers_new_racks_then_repeats_as_cassandra_does() {
        // One DC, racks a, a, b; RF 3 => repeats allowed = 3 - 2 = 1.
        // Ring: 0:n0(a) 10:n1(a) 20:n2(b)
        let m = TokenMetadata::new(vec![
            node(1, "dc1", "a", &[0]),
            node(2, "dc1", "a", &[10]),
            node(3, "dc1", "b", &[20]),
        ])
        .unwrap();
        let nts = |rf| Replication::NetworkTopology {
            factors: vec![("dc1".into(), rf)],
        };
        // RF 3: n0 (new rack a), n1 (repeat of a, 1 allowed), n2 (new rack b).
        assert_eq!(replicas(&m, &nts(3), 0), vec![0, 1, 2]);
        // RF 2: repeats allowed = 0, so n1 is skipped for n2.
        assert_eq!(replicas(&m, &nts(2), 0), vec![0, 2]);
        assert_eq!(replicas(&m, &nts(2), 5), vec![1, 2]);
    }

    #[test]
    fn nts_walks_the_global_ring_for_every_dc_at_once() {
        // Ring: 0:a1 10:b1 20:a2 30:b2 40:a3
        let m = TokenMetadata::new(vec![
            node(1, "a", "r1", &[0]),
            node(2, "b", "r1", &[10]),
            node(3, "a", "r2", &[20]),
            node(4, "b", "r2", &[30]),
            node(5, "a", "r3", &[40]),
        ])
        .unwrap();
        let r = Replication::NetworkTopology {
            factors: vec![("a".into(), 2), ("b".into(), 1), ("c".into(), 3)],
        };
        assert_eq!(replicas(&m, &r, 15), vec![2, 3, 4]);
        assert_eq!(replicas(&m, &r, 1), vec![1, 2, 4]);
    }

    #[test]
    fn local_strategy_and_empty_rings_place_nothing() {
        let m = TokenMetadata::new(vec![node(1, "d", "r", &[0])]).unwrap();
        assert_eq!(replicas(&m, &Replication::Local, 3), Vec::<u16>::new());
        let empty = TokenMetadata::new(Vec::new()).unwrap();
        let r = Replication::Simple { factor: 3 };
        assert_eq!(replicas(&empty, &r, 3), Vec::<u16>::new());
    }
}

#[cfg(test)]
mod pending_tests {
    use super::*;
    use crate::metadata::tests::node;
    use crate::node::NodeState;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn with_state(mut n: crate::Node, state: NodeState) -> crate::Node {
        n.state = state;
        n
    }

    fn pending(meta: &TokenMetadata, r: &Replication, t: i64) -> (Vec<u16>, Vec<u16>) {
        let mut natural = Vec::new();
        natural_replicas(meta, r, Token(t), &mut natural);
        let mut out = Vec::new();
        if let Some(settled) = meta.settled() {
            pending_replicas(&settled, r, Token(t), &natural, &mut out);
        }
        (
            natural.iter().map(|n| n.0).collect(),
            out.iter().map(|n| n.0).collect(),
        )
    }

    #[test]
    fn a_joining_node_is_pending_where_it_will_replicate_and_a_leaving_one_hands_over() {
        // Ring: 0:n0 10:n1 20:n2, and n3 joining at 5.
        let rf = Replication::Simple { factor: 2 };
        let m = TokenMetadata::new(vec![
            node(1, "dc1", "r1", &[0]),
            node(2, "dc1", "r1", &[10]),
            node(3, "dc1", "r1", &[20]),
            with_state(node(4, "dc1", "r1", &[5]), NodeState::Joining),
        ])
        .unwrap();
        assert!(m.has_moves());
        // (0, 5] goes to n3 then n1: n3 is pending; n0's old copy stays natural until then.
        assert_eq!(pending(&m, &rf, 3), (vec![1, 2], vec![3]));
        // (-inf.., 0] was n0, n1: now n0, n3.
        assert_eq!(pending(&m, &rf, 0), (vec![0, 1], vec![3]));
        // (10, 20] keeps n2, n0.
        assert_eq!(pending(&m, &rf, 15), (vec![2, 0], vec![]));

        // n1 leaving: its ranges go to the next nodes of the walk.
        let m = TokenMetadata::new(vec![
            node(1, "dc1", "r1", &[0]),
            with_state(node(2, "dc1", "r1", &[10]), NodeState::Leaving),
            node(3, "dc1", "r1", &[20]),
        ])
        .unwrap();
        assert_eq!(pending(&m, &rf, 5), (vec![1, 2], vec![0]));
        assert_eq!(pending(&m, &rf, 15), (vec![2, 0], vec![]));

        let still = TokenMetadata::new(vec![node(1, "dc1", "r1", &[0])]).unwrap();
        assert!(!still.has_moves());
        assert!(still.settled().is_none());
    }

    /// A node of a generated ring: (dc, rack, state, token count).
    fn arb_node() -> impl Strategy<Value = (u8, u8, u8, usize)> {
        (0u8..2, 0u8..3, 0u8..4, 1usize..4)
    }

    proptest! {
        /// Natural replicas now that stay, plus the pending ones, are exactly the natural
        /// replicas of the settled ring; pending replicas are never natural already, and
        /// never a node on its way out.
        #[test]
        fn pending_and_remaining_natural_replicas_are_the_settled_ring_natural_ones(
            specs in proptest::collection::vec(arb_node(), 2..8),
            seed in any::<u64>(),
            factor in 1u32..5,
            dc_factors in (0u32..4, 0u32..4),
            probes in proptest::collection::vec(any::<i64>(), 1..20),
        ) {
            use rand::{Rng, SeedableRng};
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut used = BTreeSet::new();
            let mut nodes = Vec::new();
            for (i, &(dc, rack, state, count)) in specs.iter().enumerate() {
                let mut tokens = Vec::new();
                while tokens.len() < count {
                    let t: i64 = rng.random_range(i64::MIN + 1..=i64::MAX);
                    if used.insert(t) {
                        tokens.push(t);
                    }
                }
                let state = match state {
                    0 => NodeState::Joining,
                    1 => NodeState::Leaving,
                    _ => NodeState::Normal,
                };
                let n = node(i as u8 + 1, &format!("dc{dc}"), &format!("r{rack}"), &tokens);
                nodes.push(with_state(n, state));
            }
            // Keep one normal node so that something owns ranges both now and settled.
            nodes[0].state = NodeState::Normal;
            let meta = TokenMetadata::new(nodes).unwrap();
            let Some(settled) = meta.settled() else {
                prop_assert!(!meta.has_moves());
                return Ok(());
            };
            let strategies = [
                Replication::Simple { factor },
                Replication::NetworkTopology {
                    factors: vec![("dc0".into(), dc_factors.0), ("dc1".into(), dc_factors.1)],
                },
            ];
            let (mut natural, mut after, mut pend) = (Vec::new(), Vec::new(), Vec::new());
            for r in &strategies {
                for &p in probes.iter().chain(meta.tokens().iter().map(|t| &t.0)) {
                    let t = Token(p);
                    natural_replicas(&meta, r, t, &mut natural);
                    natural_replicas(&settled, r, t, &mut after);
                    pending_replicas(&settled, r, t, &natural, &mut pend);
                    let after_set: BTreeSet<_> = after.iter().copied().collect();
                    let mut union: BTreeSet<_> = pend.iter().copied().collect();
                    prop_assert_eq!(union.len(), pend.len(), "pending has no duplicates");
                    union.extend(natural.iter().copied().filter(|n| after_set.contains(n)));
                    prop_assert_eq!(&union, &after_set);
                    for n in &pend {
                        prop_assert!(!natural.contains(n));
                        prop_assert!(matches!(
                            meta.node(*n).state,
                            NodeState::Joining | NodeState::Normal
                        ));
                    }
                }
            }
        }
    }
}
