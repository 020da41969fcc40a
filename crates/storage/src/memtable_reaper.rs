//! Frees flushed memtables away from fjall's locks.
//!
//! fjall drops a flushed memtable when it garbage-collects old tree versions, and it does
//! so while holding the keyspace's version lock. Freeing a large skiplist node by node
//! takes long, and every read of the keyspace (so every write too: a write reads the row it
//! merges into) waits for that lock meanwhile, a stall of the whole node at each flush. The reaper keeps its own reference to every memtable it
//! sees become active, so that fjall's drop only decrements a count, and frees a memtable
//! here, on its own thread and under no lock, once it holds the last reference.

use fjall::{AbstractTree, Keyspace};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the reaper looks. A memtable active for less than this may escape it (fjall
/// then frees it as before); a memtable of the configured size takes far longer to fill.
const POLL: Duration = Duration::from_millis(20);

/// The reaper thread and its stop flag.
pub(crate) struct MemtableReaper {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl MemtableReaper {
    /// Starts reaping the memtables of the keyspaces that `for_each_keyspace` visits (it
    /// calls its argument once per keyspace in use; a keyspace it stops visiting, such as a
    /// dropped table's, has its memtables freed here too).
    pub(crate) fn start<F>(for_each_keyspace: F) -> std::io::Result<MemtableReaper>
    where
        F: Fn(&mut dyn FnMut(&Keyspace)) + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("sluice-memtable-reaper".into())
            .spawn(move || run(&for_each_keyspace, &flag))?;
        Ok(MemtableReaper {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for MemtableReaper {
    /// Stops the thread and waits for it (what it still holds is freed as it exits).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            if h.join().is_err() {
                tracing::error!("memtable reaper panicked");
            }
        }
    }
}

fn run(for_each_keyspace: &dyn Fn(&mut dyn FnMut(&Keyspace)), stop: &AtomicBool) {
    crate::background::lower_current_thread();
    // By fjall's keyspace id.
    let mut kept: HashMap<u64, Kept<_>> = HashMap::new();
    let mut seen: Vec<u64> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        seen.clear();
        for_each_keyspace(&mut |keyspace| {
            let active = keyspace.tree.active_memtable();
            kept.entry(keyspace.id())
                .or_default()
                .observe(active.id(), active);
            seen.push(keyspace.id());
        });
        // Keyspaces no longer in use: what was kept for them is freed here.
        kept.retain(|id, _| seen.contains(id));
        std::thread::park_timeout(POLL);
    }
}

/// The memtables the reaper holds, oldest first. Bounded by those fjall itself still holds
/// (the active one, the sealed ones waiting for flush, those a snapshot reads) plus at most
/// one poll's worth that became free.
struct Kept<M> {
    memtables: Vec<(u64, Arc<M>)>,
}

impl<M> Default for Kept<M> {
    fn default() -> Self {
        Kept {
            memtables: Vec::new(),
        }
    }
}

impl<M> Kept<M> {
    /// Takes a reference to `active` if it is new, then frees every memtable of which this
    /// is the last reference. Returns how many it freed.
    fn observe(&mut self, id: u64, active: Arc<M>) -> usize {
        if self.memtables.last().map(|(i, _)| *i) != Some(id) {
            self.memtables.push((id, active));
        }
        let before = self.memtables.len();
        // A count of 1 is our own reference: fjall and every reader are done with it, and
        // nothing can take a new one, so freeing it here is safe and blocks nobody.
        self.memtables.retain(|(_, m)| Arc::strong_count(m) > 1);
        before - self.memtables.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_a_memtable_only_once_nobody_else_holds_it() {
        let mut kept = Kept::default();
        // fjall's references: the active memtable, later also a sealed one.
        let first = Arc::new(vec![0u8; 16]);
        assert_eq!(kept.observe(1, first.clone()), 0);
        // Seen again while still active: not taken twice.
        assert_eq!(kept.observe(1, first.clone()), 0);
        assert_eq!(kept.memtables.len(), 1);
        let second = Arc::new(vec![1u8; 16]);
        assert_eq!(kept.observe(2, second.clone()), 0, "first is still sealed");
        let weak = Arc::downgrade(&first);
        drop(first); // flushed and garbage-collected by fjall: only the reaper holds it
        assert_eq!(weak.strong_count(), 1);
        assert_eq!(kept.observe(2, second.clone()), 1);
        assert_eq!(weak.strong_count(), 0, "freed by the reaper");
        assert_eq!(kept.memtables.len(), 1);
        assert_eq!(Arc::strong_count(&second), 2, "the active one stays held");
    }
}
