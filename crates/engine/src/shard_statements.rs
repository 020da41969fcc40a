//! A shard's own small cache of prepared statements in front of the engine's shared one, so
//! that an EXECUTE's lookup takes no lock and hashes nothing. The engine bumps a generation
//! whenever a statement leaves its cache (a schema change or an eviction); a shard cache that
//! sees another generation forgets everything, so it never serves what the engine dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::{Engine, Prepared};

/// Slots of a shard's statement cache (a power of two): direct-mapped by the id's first
/// bytes, which are uniform because ids are MD5 digests.
const SLOTS: usize = 64;

/// One shard's statement cache (not shared: the shard holds it in a `RefCell`).
pub struct ShardStatements {
    /// The engine's cache generation the slots were filled under.
    generation: u64,
    /// Direct-mapped slots: a statement sits at its id's slot or not at all.
    slots: Box<[Option<Arc<Prepared>>]>,
}

impl Default for ShardStatements {
    fn default() -> Self {
        ShardStatements {
            generation: 0,
            slots: (0..SLOTS).map(|_| None).collect(),
        }
    }
}

impl ShardStatements {
    /// The statement prepared under `id`, as [`Engine::prepared`] answers it: from this
    /// shard's slots when the engine's cache has not dropped anything since they were filled.
    #[inline]
    pub fn prepared(&mut self, engine: &Engine, id: &[u8]) -> Option<Arc<Prepared>> {
        let id: &[u8; 16] = id.try_into().ok()?;
        // Read before the engine's cache, so that a statement dropped after this read is
        // stored under a generation that is already out of date.
        let generation = engine.cache_generation.load(Ordering::Acquire);
        if generation == self.generation {
            if let Some(p) = &self.slots[slot_of(id)] {
                if p.id == *id {
                    // Keep the engine's recency current, so a statement hot here is not
                    // evicted there.
                    engine.touch(p);
                    return Some(p.clone());
                }
            }
        }
        self.fill(engine, id, generation)
    }

    /// The miss path of [`Self::prepared`]: forgets every slot if the engine's cache dropped
    /// something since they were filled, then asks the engine.
    #[cold]
    fn fill(&mut self, engine: &Engine, id: &[u8; 16], generation: u64) -> Option<Arc<Prepared>> {
        if generation != self.generation {
            self.slots.iter_mut().for_each(|slot| *slot = None);
            self.generation = generation;
        }
        let p = engine.lookup(id)?;
        self.slots[slot_of(id)] = Some(p.clone());
        Some(p)
    }

    /// How many statements the slots hold.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// True when no slot holds a statement.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The slot of `id`.
#[inline]
fn slot_of(id: &[u8; 16]) -> usize {
    usize::from(id[0]) & (SLOTS - 1)
}
