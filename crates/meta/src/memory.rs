//! An in-process [`MetaTransport`] for tests: every node's messages go through one
//! [`MemoryNetwork`], which can drop, delay, partition and pause them, from a seeded generator.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::{MetaTransport, RpcHandler, RpcKind, TransportError};

/// The shared in-process network of a test cluster.
#[derive(Clone)]
pub struct MemoryNetwork {
    state: Arc<Mutex<NetworkState>>,
}

struct NetworkState {
    handlers: HashMap<u64, RpcHandler>,
    /// Nodes whose messages (both ways) are held until they resume or the deadline passes.
    paused: HashSet<u64>,
    /// Partition group of each node; nodes in different groups cannot talk. Empty: healed.
    groups: HashMap<u64, u32>,
    delay_max: Duration,
    drop_per_million: u32,
    rng: u64,
}

impl NetworkState {
    /// xorshift64*: deterministic for a seed, good enough to pick drops and delays.
    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn separated(&self, a: u64, b: u64) -> bool {
        match (self.groups.get(&a), self.groups.get(&b)) {
            (Some(x), Some(y)) => x != y,
            (None, None) => false,
            // A node not named in the partition is in a group of its own.
            _ => !self.groups.is_empty(),
        }
    }
}

/// What to do with one message, decided under the lock.
enum Fate {
    Deliver(RpcHandler, Duration),
    Hold,
    Lose,
    Refuse,
}

impl MemoryNetwork {
    /// A network with no faults whose random choices follow `seed`.
    pub fn new(seed: u64) -> MemoryNetwork {
        MemoryNetwork {
            state: Arc::new(Mutex::new(NetworkState {
                handlers: HashMap::new(),
                paused: HashSet::new(),
                groups: HashMap::new(),
                delay_max: Duration::ZERO,
                drop_per_million: 0,
                rng: seed | 1,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, NetworkState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The transport node `from` sends with.
    pub fn transport(&self, from: u64) -> MemoryTransport {
        MemoryTransport {
            network: self.clone(),
            from,
        }
    }

    /// Routes messages for `node` to `handler` (the node is up).
    pub fn register(&self, node: u64, handler: RpcHandler) {
        self.lock().handlers.insert(node, handler);
    }

    /// Stops routing to `node` (the node is down): messages to it are refused.
    pub fn unregister(&self, node: u64) {
        self.lock().handlers.remove(&node);
    }

    /// Holds every message to and from `node`, as if its process were stopped.
    pub fn pause(&self, node: u64) {
        self.lock().paused.insert(node);
    }

    /// Releases a paused node.
    pub fn resume(&self, node: u64) {
        self.lock().paused.remove(&node);
    }

    /// Splits the nodes into groups that cannot reach each other; unnamed nodes are alone.
    pub fn partition(&self, groups: &[&[u64]]) {
        let mut state = self.lock();
        state.groups.clear();
        for (group, nodes) in groups.iter().enumerate() {
            for node in *nodes {
                state.groups.insert(*node, group as u32);
            }
        }
    }

    /// Removes any partition.
    pub fn heal(&self) {
        self.lock().groups.clear();
    }

    /// Delays each message by a random time up to `max`.
    pub fn set_delay(&self, max: Duration) {
        self.lock().delay_max = max;
    }

    /// Loses each message (request or reply) with probability `per_million` / 1,000,000.
    pub fn set_drop_rate(&self, per_million: u32) {
        self.lock().drop_per_million = per_million.min(1_000_000);
    }

    fn fate(&self, from: u64, to: u64) -> Fate {
        let mut state = self.lock();
        if state.paused.contains(&from) || state.paused.contains(&to) {
            return Fate::Hold;
        }
        if state.separated(from, to) {
            return Fate::Lose;
        }
        let Some(handler) = state.handlers.get(&to).cloned() else {
            return Fate::Refuse;
        };
        if state.drop_per_million > 0
            && state.next_random() % 1_000_000 < u64::from(state.drop_per_million)
        {
            return Fate::Lose;
        }
        let max = state.delay_max.as_micros() as u64;
        let delay = if max == 0 {
            Duration::ZERO
        } else {
            Duration::from_micros(state.next_random() % (max + 1))
        };
        Fate::Deliver(handler, delay)
    }

    /// Waits while either end is paused; false if the deadline passed first.
    async fn wait_unpaused(&self, from: u64, to: u64, deadline: Instant) -> bool {
        loop {
            {
                let state = self.lock();
                if !state.paused.contains(&from) && !state.paused.contains(&to) {
                    return true;
                }
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// One node's sending side of a [`MemoryNetwork`].
#[derive(Clone)]
pub struct MemoryTransport {
    network: MemoryNetwork,
    from: u64,
}

async fn lost(deadline: Instant) -> TransportError {
    tokio::time::sleep_until(deadline.into()).await;
    TransportError::Timeout
}

impl MetaTransport for MemoryTransport {
    async fn send(
        &self,
        target: u64,
        _addr: &str,
        kind: RpcKind,
        body: Vec<u8>,
        deadline: Instant,
    ) -> Result<Vec<u8>, TransportError> {
        let network = &self.network;
        let handler = loop {
            match network.fate(self.from, target) {
                Fate::Deliver(handler, delay) => {
                    tokio::time::sleep(delay).await;
                    break handler;
                }
                Fate::Hold => {
                    if !network.wait_unpaused(self.from, target, deadline).await {
                        return Err(TransportError::Timeout);
                    }
                }
                Fate::Lose => return Err(lost(deadline).await),
                Fate::Refuse => return Err(TransportError::Unreachable),
            }
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let reply = match tokio::time::timeout(remaining, handler.handle(kind, &body)).await {
            Ok(reply) => reply?,
            Err(_) => return Err(TransportError::Timeout),
        };
        // The reply crosses the same network: a partition or pause since then loses it.
        match network.fate(target, self.from) {
            Fate::Deliver(_, delay) => {
                tokio::time::sleep(delay).await;
                Ok(reply)
            }
            Fate::Hold => {
                if network.wait_unpaused(target, self.from, deadline).await {
                    Ok(reply)
                } else {
                    Err(TransportError::Timeout)
                }
            }
            Fate::Lose => Err(lost(deadline).await),
            // The sender is down; nobody reads the reply.
            Fate::Refuse => Err(TransportError::Unreachable),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_separate_groups_and_unnamed_nodes() {
        let network = MemoryNetwork::new(1);
        network.partition(&[&[1, 2], &[3]]);
        let state = network.lock();
        assert!(!state.separated(1, 2));
        assert!(state.separated(1, 3));
        assert!(state.separated(2, 4), "an unnamed node is alone");
        drop(state);
        network.heal();
        assert!(!network.lock().separated(1, 3));
    }

    #[test]
    fn the_same_seed_gives_the_same_choices() {
        let a = MemoryNetwork::new(42);
        let b = MemoryNetwork::new(42);
        let draws =
            |n: &MemoryNetwork| (0..100).map(|_| n.lock().next_random()).collect::<Vec<_>>();
        assert_eq!(draws(&a), draws(&b));
        assert_ne!(draws(&a), draws(&MemoryNetwork::new(43)));
    }
}
