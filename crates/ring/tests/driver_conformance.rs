//! The drivers' replica computations, ported, against the server's placement.
//!
//! - Python `cassandra-driver` 3.29 (`cassandra/metadata.py`): `SimpleStrategy` and
//!   `NetworkTopologyStrategy.make_token_replica_map`, looked up as `TokenMap.get_replicas`
//!   does (`bisect_left` on the ring, wrapping).
//! - Rust `scylla` driver (`scylla/src/routing/locator/replication_info.rs`):
//!   `simple_strategy_replicas` and `nts_replicas_in_datacenter` (per-DC ring of unique
//!   nodes, `acceptable_repeats = RF - rack_count`).
//!
//! Drivers use a replica list in its order (Python sends to the first live replica of the
//! local DC; Rust picks within a DC), so the comparison is per data center and ordered:
//! the server's replicas in a DC, in the server's order, must equal the driver's.

mod common;

use common::{random_ring, Layout};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_ring::{natural_replicas, NodeIndex, Replication, Token, TokenMetadata};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// The Python driver's replica map of a keyspace: ring token -> hosts.
fn python_replica_map(meta: &TokenMetadata, r: &Replication) -> HashMap<Token, Vec<NodeIndex>> {
    let ring = meta.tokens();
    let owner = |t: Token| meta.owners()[ring.binary_search(&t).unwrap()];
    let mut replica_map: HashMap<Token, Vec<NodeIndex>> = HashMap::new();
    match r {
        Replication::Simple { factor } => {
            for i in 0..ring.len() {
                let mut hosts = Vec::new();
                let mut j = 0;
                while hosts.len() < *factor as usize && j < ring.len() {
                    let host = owner(ring[(i + j) % ring.len()]);
                    if !hosts.contains(&host) {
                        hosts.push(host);
                    }
                    j += 1;
                }
                replica_map.insert(ring[i], hosts);
            }
        }
        Replication::NetworkTopology { factors } => {
            let dc_rf_map: HashMap<&str, usize> = factors
                .iter()
                .filter(|(_, rf)| *rf > 0)
                .map(|(dc, rf)| (dc.as_str(), *rf as usize))
                .collect();
            // Python dicts keep insertion order: DCs in order of first appearance on the ring.
            let mut dc_order: Vec<&str> = Vec::new();
            let mut dc_to_token_offset: HashMap<&str, Vec<usize>> = HashMap::new();
            let mut dc_racks: HashMap<&str, HashSet<&str>> = HashMap::new();
            let mut hosts_per_dc: HashMap<&str, HashSet<NodeIndex>> = HashMap::new();
            for (i, &token) in ring.iter().enumerate() {
                let host = owner(token);
                let dc = meta.node(host).dc.as_str();
                if !dc_to_token_offset.contains_key(dc) {
                    dc_order.push(dc);
                }
                dc_to_token_offset.entry(dc).or_default().push(i);
                dc_racks
                    .entry(dc)
                    .or_default()
                    .insert(meta.node(host).rack.as_str());
                hosts_per_dc.entry(dc).or_default().insert(host);
            }
            let mut dc_to_current_index: HashMap<&str, usize> = HashMap::new();
            for i in 0..ring.len() {
                let mut replicas: Vec<NodeIndex> = Vec::new();
                for &dc in &dc_order {
                    let Some(&rf) = dc_rf_map.get(dc) else {
                        continue;
                    };
                    let token_offsets = &dc_to_token_offset[dc];
                    let mut index = *dc_to_current_index.get(dc).unwrap_or(&0);
                    let num_tokens = token_offsets.len();
                    while index < num_tokens && token_offsets[index] < i {
                        index += 1;
                    }
                    dc_to_current_index.insert(dc, index);

                    let mut replicas_remaining = rf;
                    let mut replicas_this_dc = 0;
                    let mut skipped_hosts: Vec<NodeIndex> = Vec::new();
                    let mut racks_placed: HashSet<&str> = HashSet::new();
                    let racks_this_dc = dc_racks[dc].len();
                    let hosts_this_dc = hosts_per_dc[dc].len();
                    for mut token_offset_index in index..index + num_tokens {
                        if token_offset_index >= token_offsets.len() {
                            token_offset_index -= token_offsets.len();
                        }
                        let token_offset = token_offsets[token_offset_index];
                        let host = owner(ring[token_offset]);
                        if replicas_remaining == 0 || replicas_this_dc == hosts_this_dc {
                            break;
                        }
                        if replicas.contains(&host) {
                            continue;
                        }
                        let rack = meta.node(host).rack.as_str();
                        if racks_placed.contains(rack) && racks_placed.len() < racks_this_dc {
                            skipped_hosts.push(host);
                            continue;
                        }
                        replicas.push(host);
                        replicas_this_dc += 1;
                        replicas_remaining -= 1;
                        racks_placed.insert(rack);
                        if racks_placed.len() == racks_this_dc {
                            for &h in &skipped_hosts {
                                if replicas_remaining == 0 {
                                    break;
                                }
                                replicas.push(h);
                                replicas_remaining -= 1;
                            }
                            skipped_hosts.clear();
                        }
                    }
                }
                replica_map.insert(ring[i], replicas);
            }
        }
        Replication::Local => {}
    }
    replica_map
}

/// Python's `TokenMap.get_replicas`.
fn python_lookup<'a>(
    meta: &TokenMetadata,
    map: &'a HashMap<Token, Vec<NodeIndex>>,
    token: Token,
) -> &'a [NodeIndex] {
    let ring = meta.tokens();
    let point = ring.partition_point(|&t| t < token);
    let key = if point == ring.len() {
        ring[0]
    } else {
        ring[point]
    };
    &map[&key]
}

/// The Rust driver's `TokenRing::ring_range(token).unique()` over `(token, node)` pairs.
fn rust_ring_range_unique(ring: &[(Token, NodeIndex)], token: Token) -> Vec<NodeIndex> {
    let start = ring.partition_point(|(t, _)| *t < token);
    let mut seen = BTreeSet::new();
    ring[start..]
        .iter()
        .chain(ring[..start].iter())
        .map(|(_, n)| *n)
        .filter(|n| seen.insert(*n))
        .collect()
}

/// The Rust driver's replicas: SimpleStrategy on the global ring, NTS per data center.
fn rust_replicas(
    meta: &TokenMetadata,
    r: &Replication,
    token: Token,
) -> BTreeMap<String, Vec<NodeIndex>> {
    let global: Vec<(Token, NodeIndex)> = meta
        .tokens()
        .iter()
        .copied()
        .zip(meta.owners().iter().copied())
        .collect();
    let mut out = BTreeMap::new();
    match r {
        Replication::Simple { factor } => {
            let unique = rust_ring_range_unique(&global, token);
            let take = (*factor as usize).min(unique.len());
            out.insert(String::new(), unique[..take].to_vec());
        }
        Replication::NetworkTopology { factors } => {
            for (dc, rf) in factors {
                let dc_ring: Vec<(Token, NodeIndex)> = global
                    .iter()
                    .copied()
                    .filter(|(_, n)| meta.node(*n).dc == *dc)
                    .collect();
                let unique = rust_ring_range_unique(&dc_ring, token);
                let rack_count = dc_ring
                    .iter()
                    .map(|(_, n)| meta.node(*n).rack.as_str())
                    .collect::<HashSet<_>>()
                    .len();
                let mut left = (*rf as usize).min(unique.len());
                let mut used_racks = BTreeSet::new();
                let mut acceptable_repeats = (*rf as usize).saturating_sub(rack_count);
                let mut replicas = Vec::new();
                for n in unique {
                    if left == 0 {
                        break;
                    }
                    if used_racks.insert(meta.node(n).rack.as_str()) {
                        left -= 1;
                        replicas.push(n);
                    } else if acceptable_repeats > 0 {
                        acceptable_repeats -= 1;
                        left -= 1;
                        replicas.push(n);
                    }
                }
                out.insert(dc.clone(), replicas);
            }
        }
        Replication::Local => {}
    }
    out
}

/// A replica list split per data center, order kept (one group for SimpleStrategy).
fn per_dc(
    meta: &TokenMetadata,
    r: &Replication,
    list: &[NodeIndex],
) -> BTreeMap<String, Vec<NodeIndex>> {
    let mut out = BTreeMap::new();
    match r {
        Replication::NetworkTopology { factors } => {
            for (dc, _) in factors {
                let in_dc = list
                    .iter()
                    .copied()
                    .filter(|&n| meta.node(n).dc == *dc)
                    .collect();
                out.insert(dc.clone(), in_dc);
            }
        }
        _ => {
            out.insert(String::new(), list.to_vec());
        }
    }
    out
}

/// Mismatch counts of the two drivers over `rings` random rings of `layout`.
#[derive(Debug, Default)]
struct Mismatches {
    lookups: usize,
    python: usize,
    /// Lookups where Python's replicas differ even as a set per DC (not only in order).
    python_set: usize,
    rust: usize,
}

fn as_sets(m: BTreeMap<String, Vec<NodeIndex>>) -> BTreeMap<String, BTreeSet<NodeIndex>> {
    m.into_iter()
        .map(|(dc, v)| (dc, v.into_iter().collect()))
        .collect()
}

fn compare(layout: Layout, r: &Replication, rings: u64) -> Mismatches {
    let mut m = Mismatches::default();
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut server = Vec::new();
    for seed in 0..rings {
        let meta = random_ring(layout, seed);
        let py_map = python_replica_map(&meta, r);
        let mut tokens: Vec<Token> = (0..64).map(|_| Token(rng.random())).collect();
        tokens.extend(
            meta.tokens()
                .iter()
                .flat_map(|t| [*t, Token(t.0.wrapping_add(1))]),
        );
        for t in tokens {
            natural_replicas(&meta, r, t, &mut server);
            let expected = per_dc(&meta, r, &server);
            m.lookups += 1;
            let python = per_dc(&meta, r, python_lookup(&meta, &py_map, t));
            let python_len: usize = python.values().map(Vec::len).sum();
            if python != expected {
                m.python += 1;
                if python_len != server.len() || as_sets(python) != as_sets(expected.clone()) {
                    m.python_set += 1;
                }
            }
            if rust_replicas(&meta, r, t) != expected {
                m.rust += 1;
            }
        }
    }
    println!(
        "{layout:?} {r:?}: {} lookups, python mismatches {} ({:.2}%; as sets {:.2}%), rust mismatches {} ({:.2}%)",
        m.lookups,
        m.python,
        100.0 * m.python as f64 / m.lookups as f64,
        100.0 * m.python_set as f64 / m.lookups as f64,
        m.rust,
        100.0 * m.rust as f64 / m.lookups as f64,
    );
    m
}

fn nts(factors: &[(&str, u32)]) -> Replication {
    Replication::NetworkTopology {
        factors: factors.iter().map(|(d, f)| (d.to_string(), *f)).collect(),
    }
}

const RINGS: u64 = 40;

#[test]
fn drivers_agree_with_the_server_when_racks_cover_the_replication_factor() {
    let cases = [
        // Rack per node, 3 nodes, RF 3: the recommended local layout.
        (
            Layout {
                nodes_per_dc: 3,
                dcs: 1,
                racks: 3,
                tokens: 16,
            },
            nts(&[("dc1", 3)]),
        ),
        (
            Layout {
                nodes_per_dc: 6,
                dcs: 1,
                racks: 3,
                tokens: 16,
            },
            nts(&[("dc1", 3)]),
        ),
        (
            Layout {
                nodes_per_dc: 5,
                dcs: 1,
                racks: 5,
                tokens: 8,
            },
            nts(&[("dc1", 3)]),
        ),
        (
            Layout {
                nodes_per_dc: 4,
                dcs: 2,
                racks: 4,
                tokens: 16,
            },
            nts(&[("dc1", 3), ("dc2", 2)]),
        ),
        (
            Layout {
                nodes_per_dc: 6,
                dcs: 1,
                racks: 3,
                tokens: 16,
            },
            Replication::Simple { factor: 3 },
        ),
        (
            Layout {
                nodes_per_dc: 3,
                dcs: 2,
                racks: 1,
                tokens: 16,
            },
            Replication::Simple { factor: 2 },
        ),
    ];
    for (layout, r) in cases {
        let m = compare(layout, &r, RINGS);
        assert_eq!((m.python, m.rust), (0, 0), "{layout:?} {r:?}");
    }
}

#[test]
fn drivers_agree_with_the_server_on_one_rack() {
    for nodes in [3, 4, 6] {
        let layout = Layout {
            nodes_per_dc: nodes,
            dcs: 1,
            racks: 1,
            tokens: 16,
        };
        let m = compare(layout, &nts(&[("dc1", 3)]), RINGS);
        assert_eq!((m.python, m.rust), (0, 0), "{layout:?}");
    }
}

#[test]
fn rust_always_agrees_and_python_differs_only_with_more_replicas_than_racks() {
    // Python's "skipped hosts" variant orders (and can duplicate) same-rack hosts when a DC
    // has fewer racks than its factor but more than one; Rust's walk is Cassandra's.
    let cases = [
        (
            Layout {
                nodes_per_dc: 7,
                dcs: 1,
                racks: 3,
                tokens: 16,
            },
            nts(&[("dc1", 5)]),
        ),
        (
            Layout {
                nodes_per_dc: 4,
                dcs: 1,
                racks: 2,
                tokens: 16,
            },
            nts(&[("dc1", 3)]),
        ),
        (
            Layout {
                nodes_per_dc: 6,
                dcs: 2,
                racks: 2,
                tokens: 8,
            },
            nts(&[("dc1", 3), ("dc2", 3)]),
        ),
    ];
    for (layout, r) in cases {
        let m = compare(layout, &r, RINGS);
        assert_eq!(m.rust, 0, "{layout:?} {r:?}");
        assert!(
            m.python > 0,
            "the known Python difference shows: {layout:?} {r:?}"
        );
    }
}
