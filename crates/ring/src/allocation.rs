//! Token allocation for a joining node, and ownership figures.
//!
//! Two deterministic allocators:
//! - [`allocate_tokens`] balances primary ranges: a new node takes `1 / (N + 1)` of the
//!   ring in `num_tokens` slices, each donor giving in proportion to how far it owns above
//!   that share, cut from its widest ranges. Primary shares end equal, but replicated
//!   shares (what a node stores) spread up to 30% above the mean at RF 3.
//! - [`allocate_tokens_for_replication`] is the one a joining node should use: the idea
//!   of Cassandra's RF-aware allocator, simplified to a greedy search that keeps both the
//!   replicated and the primary shares close to fair.
//!
//! The first node of a ring spaces its tokens evenly from an offset drawn from the seed;
//! once the ring exists, nothing is random. Figures: docs/decisions/
//! 2026-11-26-token-ring-and-placement.md.

use crate::metadata::TokenMetadata;
use crate::node::{Node, NodeIndex, NodeState};
use crate::placement::ReplicaMap;
use crate::replication::Replication;
use crate::token::Token;
use std::fmt;

/// Most tokens one node may have.
pub const MAX_TOKENS_PER_NODE: usize = 1024;

/// Why tokens could not be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocationError {
    /// `num_tokens` is 0 or above [`MAX_TOKENS_PER_NODE`].
    TokenCount,
    /// No range is wide enough to cut another token from.
    RingTooDense,
}

impl AllocationError {
    /// The error's message.
    pub fn message(self) -> &'static str {
        match self {
            AllocationError::TokenCount => "num_tokens must be between 1 and 1024",
            AllocationError::RingTooDense => "no range of the ring is wide enough to split",
        }
    }
}

impl fmt::Display for AllocationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for AllocationError {}

/// SplitMix64: a seed to a well-mixed 64-bit value, so that near seeds give far offsets.
fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How many of the new node's `num_tokens` slices each donor gives: in proportion to how
/// far it owns above the fair share (largest remainders round, lower index on a tie).
/// When every node is at its share (rounding), the largest owner gives them all.
fn slices_per_donor(owned: &[u128], excess: &[u128], num_tokens: usize) -> Vec<(usize, usize)> {
    let total: u128 = excess.iter().sum();
    if total == 0 {
        let widest = (0..owned.len())
            .max_by(|&a, &b| owned[a].cmp(&owned[b]).then(b.cmp(&a)))
            .unwrap_or(0);
        return vec![(widest, num_tokens)];
    }
    let n = num_tokens as u128;
    let mut shares: Vec<(usize, usize, u128)> = excess
        .iter()
        .enumerate()
        .map(|(d, &e)| (d, (e * n / total) as usize, e * n % total))
        .collect();
    let given: usize = shares.iter().map(|s| s.1).sum();
    let mut by_remainder: Vec<usize> = (0..shares.len()).collect();
    by_remainder.sort_by(|&a, &b| shares[b].2.cmp(&shares[a].2).then(a.cmp(&b)));
    for &d in by_remainder.iter().take(num_tokens - given) {
        shares[d].1 += 1;
    }
    shares
        .into_iter()
        .filter(|s| s.1 > 0)
        .map(|s| (s.0, s.1))
        .collect()
}

/// Tokens for a node joining `meta`'s ring with `num_tokens` vnodes, sorted. The same ring,
/// count and seed always give the same tokens; the seed matters only for an empty ring.
pub fn allocate_tokens(
    meta: &TokenMetadata,
    num_tokens: usize,
    seed: u64,
) -> Result<Vec<Token>, AllocationError> {
    if num_tokens == 0 || num_tokens > MAX_TOKENS_PER_NODE {
        return Err(AllocationError::TokenCount);
    }
    if meta.is_empty() {
        let step = (1u128 << 64) / num_tokens as u128;
        let offset = u128::from(mix(seed)) % step;
        let mut tokens: Vec<Token> = (0..num_tokens as u128)
            .map(|k| Token::from_offset((offset + k * step) as u64))
            .map(|t| {
                if t == Token::MIN {
                    Token(i64::MIN + 1)
                } else {
                    t
                }
            })
            .collect();
        tokens.sort_unstable();
        return Ok(tokens);
    }

    // The ring as (token, owner) in order; the new node's tokens have owner None.
    let mut ring: Vec<(Token, Option<NodeIndex>)> = meta
        .tokens()
        .iter()
        .zip(meta.owners())
        .map(|(&t, &o)| (t, Some(o)))
        .collect();
    let mut owned = vec![0u128; meta.nodes().len()];
    for i in 0..ring.len() {
        let prev = ring[(i + ring.len() - 1) % ring.len()].0;
        if let Some(o) = ring[i].1 {
            owned[o.get()] += prev.width_to(ring[i].0);
        }
    }
    let target = (1u128 << 64) / (meta.owner_count() as u128 + 1);
    let excess: Vec<u128> = owned.iter().map(|&o| o.saturating_sub(target)).collect();
    let mut out = Vec::with_capacity(num_tokens);
    for (donor, slices) in slices_per_donor(&owned, &excess, num_tokens) {
        let mut left = excess[donor];
        for s in 0..slices {
            // The donor's widest range, the first in ring order on a tie.
            let mut best: Option<(usize, u128)> = None;
            for i in 0..ring.len() {
                if ring[i].1.map(NodeIndex::get) != Some(donor) {
                    continue;
                }
                let prev = ring[(i + ring.len() - 1) % ring.len()].0;
                let width = prev.width_to(ring[i].0);
                if best.is_none_or(|(_, w)| width > w) {
                    best = Some((i, width));
                }
            }
            let Some((i, width)) = best.filter(|&(_, w)| w >= 3) else {
                return Err(AllocationError::RingTooDense);
            };
            let mut take = left.div_ceil((slices - s) as u128).min(width - 2).max(1);
            let start = ring[(i + ring.len() - 1) % ring.len()].0;
            let mut token = Token::from_offset(start.offset().wrapping_add(take as u64));
            if token == Token::MIN {
                // Never own the ring's minimum: cut one further (width >= 3 leaves room).
                take += 1;
                token = Token::from_offset(start.offset().wrapping_add(take as u64));
            }
            debug_assert!(
                take >= 1 && take < width,
                "a new token lies inside its range"
            );
            left = left.saturating_sub(take);
            ring.insert(i, (token, None));
            out.push(token);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Most ranges a replication-aware allocation step considers cutting (the widest ones),
/// which bounds its cost on large rings.
const MAX_CANDIDATE_RANGES: usize = 128;

/// Tokens for `joining` (its dc and rack; its tokens are ignored) entering `meta`'s ring,
/// chosen for even ownership under `replication`, the idea of Cassandra's
/// `allocate_tokens_for_local_replication_factor`, simplified: each token in turn is put
/// where the squared deviations of the nodes' replicated shares plus RF^2 times those of
/// their primary shares (primaries coordinate Python drivers' requests) are least, trying
/// two cuts (the primary allocator's slice, and half) in each of the widest ranges.
/// Deterministic; the seed matters only for an empty ring.
pub fn allocate_tokens_for_replication(
    meta: &TokenMetadata,
    joining: &Node,
    replication: &Replication,
    num_tokens: usize,
    seed: u64,
) -> Result<Vec<Token>, AllocationError> {
    if num_tokens == 0 || num_tokens > MAX_TOKENS_PER_NODE {
        return Err(AllocationError::TokenCount);
    }
    if meta.is_empty() {
        return allocate_tokens(meta, num_tokens, seed);
    }
    let mut nodes: Vec<Node> = meta
        .nodes()
        .iter()
        .filter(|n| n.state.owns_tokens() && n.host_id != joining.host_id)
        .cloned()
        .collect();
    let owners_after = nodes.len() + 1;
    let mut new_node = joining.clone();
    new_node.tokens.clear();
    new_node.state = NodeState::Normal;
    nodes.push(new_node);
    let new_index = nodes.len() - 1;
    let mut current = meta.clone();
    for k in 0..num_tokens {
        let primary_target = (1u128 << 64) / owners_after as u128;
        let new_primary: u128 = primary_ownership_raw(&current)
            .get(new_index)
            .copied()
            .filter(|_| k > 0)
            .unwrap_or(0);
        let slice = primary_target
            .saturating_sub(new_primary)
            .div_ceil((num_tokens - k) as u128);
        let mut ranges: Vec<(u128, Token)> = (0..current.tokens().len())
            .map(|i| {
                let (start, end) = current.range_at(i);
                (start.width_to(end), start)
            })
            .filter(|&(w, _)| w >= 3)
            .collect();
        ranges.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        ranges.truncate(MAX_CANDIDATE_RANGES);
        let mut best: Option<(f64, Token)> = None;
        for &(width, start) in &ranges {
            for take in [slice.min(width - 2).max(1), width / 2] {
                let mut token = Token::from_offset(start.offset().wrapping_add(take as u64));
                if token == Token::MIN {
                    token = Token(i64::MIN + 1);
                }
                nodes[new_index].tokens.push(token);
                let score = TokenMetadata::new(nodes.clone()).map(|m| {
                    let replicated = replicated_ownership(&m, replication);
                    let factor = replicated.iter().sum::<f64>();
                    imbalance(&replicated, owners_after)
                        + factor * factor * imbalance(&primary_ownership(&m), owners_after)
                });
                nodes[new_index].tokens.pop();
                if let Ok(score) = score {
                    if best.is_none_or(|(b, _)| score < b) {
                        best = Some((score, token));
                    }
                }
            }
        }
        let Some((_, token)) = best else {
            return Err(AllocationError::RingTooDense);
        };
        nodes[new_index].tokens.push(token);
        current = TokenMetadata::new(nodes.clone()).map_err(|_| AllocationError::RingTooDense)?;
    }
    let mut out = nodes[new_index].tokens.clone();
    out.sort_unstable();
    Ok(out)
}

/// Sum of squared deviations of the shares from their mean over `owners` nodes.
fn imbalance(shares: &[f64], owners: usize) -> f64 {
    let fair = shares.iter().sum::<f64>() / owners as f64;
    shares.iter().map(|s| (s - fair) * (s - fair)).sum()
}

fn primary_ownership_raw(meta: &TokenMetadata) -> Vec<u128> {
    let mut owned = vec![0u128; meta.nodes().len()];
    for (i, owner) in meta.owners().iter().enumerate() {
        let (start, end) = meta.range_at(i);
        owned[owner.get()] += start.width_to(end);
    }
    owned
}

/// Each node's share of the ring's primary ranges (fractions summing to 1), by node index;
/// nodes that own nothing have 0.
pub fn primary_ownership(meta: &TokenMetadata) -> Vec<f64> {
    let mut owned = vec![0u128; meta.nodes().len()];
    let tokens = meta.tokens();
    for (i, owner) in meta.owners().iter().enumerate() {
        let (start, end) = meta.range_at(i);
        debug_assert_eq!(end, tokens[i]);
        owned[owner.get()] += start.width_to(end);
    }
    owned
        .into_iter()
        .map(|w| w as f64 / 18_446_744_073_709_551_616.0)
        .collect()
}

/// Each node's share of the data under `replication` ("effective ownership": the sum of
/// the widths of the ranges it replicates, over the ring), by node index.
pub fn replicated_ownership(meta: &TokenMetadata, replication: &Replication) -> Vec<f64> {
    let map = ReplicaMap::build(meta, replication);
    let mut owned = vec![0u128; meta.nodes().len()];
    for i in 0..meta.tokens().len() {
        let (start, end) = meta.range_at(i);
        for r in map.replicas(end) {
            owned[r.get()] += start.width_to(end);
        }
    }
    owned
        .into_iter()
        .map(|w| w as f64 / 18_446_744_073_709_551_616.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::tests::node;

    fn grow(nodes: usize, num_tokens: usize, seed: u64) -> TokenMetadata {
        let mut all = Vec::new();
        for n in 0..nodes {
            let meta = TokenMetadata::new(all.clone()).unwrap();
            let tokens = allocate_tokens(&meta, num_tokens, seed).unwrap();
            assert_eq!(tokens.len(), num_tokens);
            let ts: Vec<i64> = tokens.iter().map(|t| t.0).collect();
            all.push(node(n as u8 + 1, "dc1", &format!("rack{}", n + 1), &ts));
        }
        TokenMetadata::new(all).unwrap()
    }

    #[test]
    fn allocation_is_reproducible_and_seeded() {
        let a = grow(4, 16, 7);
        let b = grow(4, 16, 7);
        assert_eq!(a.tokens(), b.tokens());
        let c = grow(4, 16, 8);
        assert_ne!(a.tokens(), c.tokens());
    }

    #[test]
    fn every_node_gets_an_equal_primary_share() {
        for nodes in [2, 3, 4, 6, 9] {
            let meta = grow(nodes, 16, 1);
            let own = primary_ownership(&meta);
            let fair = 1.0 / nodes as f64;
            for (i, o) in own.iter().enumerate() {
                assert!(
                    (o - fair).abs() / fair < 0.01,
                    "{nodes} nodes: node {i} owns {o}, fair {fair}"
                );
            }
        }
    }

    #[test]
    fn a_single_token_per_node_still_balances() {
        let meta = grow(4, 1, 3);
        let own = primary_ownership(&meta);
        let (min, max) = own
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &o| (lo.min(o), hi.max(o)));
        // One token can take from one node only: the first nodes halve each other.
        assert!(max / min <= 2.01, "{own:?}");
    }

    #[test]
    fn replication_aware_allocation_balances_both_shares() {
        let rf3 = Replication::NetworkTopology {
            factors: vec![("dc1".into(), 3)],
        };
        let mut all = Vec::new();
        for n in 0..6u8 {
            let meta = TokenMetadata::new(all.clone()).unwrap();
            let mut joining = node(n + 1, "dc1", &format!("rack{n}"), &[]);
            joining.tokens = allocate_tokens_for_replication(&meta, &joining, &rf3, 16, 5).unwrap();
            let again = allocate_tokens_for_replication(&meta, &joining, &rf3, 16, 5).unwrap();
            assert_eq!(joining.tokens, again, "deterministic");
            all.push(joining);
        }
        let meta = TokenMetadata::new(all).unwrap();
        let worst = |v: Vec<f64>| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            v.iter().fold(0f64, |m, &x| m.max(x / mean))
        };
        let primary = worst(primary_ownership(&meta));
        let replicated = worst(replicated_ownership(&meta, &rf3));
        assert!(primary < 1.05, "primary max/mean {primary}");
        assert!(replicated < 1.10, "replicated max/mean {replicated}");
        // The primary-only allocator leaves replicated shares far less even here.
        let plain = grow(6, 16, 5);
        assert!(worst(replicated_ownership(&plain, &rf3)) > replicated);
    }

    #[test]
    fn bad_token_counts_are_rejected() {
        let meta = TokenMetadata::new(Vec::new()).unwrap();
        assert_eq!(
            allocate_tokens(&meta, 0, 1),
            Err(AllocationError::TokenCount)
        );
        assert_eq!(
            allocate_tokens(&meta, 1025, 1),
            Err(AllocationError::TokenCount)
        );
    }
}
