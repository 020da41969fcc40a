// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::key::InternalKey;
use crate::{
    value::{InternalValue, SeqNo, UserValue},
    ValueType,
};
use crate::UserKey;
use crossbeam_skiplist::map::Entry;
use crossbeam_skiplist::SkipMap;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicBool, AtomicU64};

pub use crate::tree::inner::MemtableId;

/// The memtable serves as an intermediary, ephemeral, sorted storage for new items
///
/// When the Memtable exceeds some size, it should be flushed to a table.
pub struct Memtable {
    #[doc(hidden)]
    pub id: MemtableId,

    /// The actual content, stored in a lock-free skiplist.
    #[doc(hidden)]
    pub items: SkipMap<InternalKey, UserValue>,

    /// Approximate active memtable size.
    ///
    /// If this grows too large, a flush is triggered.
    pub(crate) approximate_size: AtomicU64,

    /// Highest encountered sequence number.
    ///
    /// This is used so that `get_highest_seqno` has O(1) complexity.
    pub(crate) highest_seqno: AtomicU64,

    pub(crate) requested_rotation: AtomicBool,
}

impl Memtable {
    /// Returns the memtable ID.
    pub fn id(&self) -> MemtableId {
        self.id
    }

    /// Returns `true` if the memtable was already flagged for rotation.
    pub fn is_flagged_for_rotation(&self) -> bool {
        self.requested_rotation
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Flags the memtable as requested for rotation.
    pub fn flag_rotated(&self) {
        self.requested_rotation
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    #[doc(hidden)]
    #[must_use]
    pub fn new(id: MemtableId) -> Self {
        Self {
            id,
            items: SkipMap::default(),
            approximate_size: AtomicU64::default(),
            highest_seqno: AtomicU64::default(),
            requested_rotation: AtomicBool::default(),
        }
    }

    /// Creates an iterator over all items.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = InternalValue> + '_ {
        self.items.iter().map(|entry| InternalValue {
            key: entry.key().clone(),
            value: entry.value().clone(),
        })
    }

    /// Creates an iterator over a range of items.
    pub(crate) fn range<'a, R: RangeBounds<InternalKey> + 'a>(
        &'a self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = InternalValue> + 'a {
        self.items.range(range).map(|entry| InternalValue {
            key: entry.key().clone(),
            value: entry.value().clone(),
        })
    }

    /// Sluice patch: a range that yields, going forward, only the newest version of each
    /// key visible at `seqno` (see `VisibleRange`).
    pub(crate) fn range_visible(
        &self,
        range: (Bound<InternalKey>, Bound<InternalKey>),
        seqno: SeqNo,
    ) -> VisibleRange<'_> {
        VisibleRange {
            items: &self.items,
            seqno,
            lo: range.0,
            hi: range.1,
            front: None,
            front_started: false,
            back: None,
            back_started: false,
            front_last: None,
            back_last: None,
        }
    }

    /// Returns the item by key if it exists.
    ///
    /// The item with the highest seqno will be returned, if `seqno` is None.
    #[doc(hidden)]
    pub fn get(&self, key: &[u8], seqno: SeqNo) -> Option<InternalValue> {
        if seqno == 0 {
            return None;
        }

        // NOTE: This range start deserves some explanation...
        // InternalKeys are multi-sorted by 2 categories: user_key and Reverse(seqno). (tombstone doesn't really matter)
        // We search for the lowest entry that is greater or equal the user's prefix key
        // and has the seqno (or lower) we want (because the seqno is stored in reverse order)
        //
        // Example: We search for "abc"
        //
        // key -> seqno
        //
        // a   -> 7
        // abc -> 5 <<< This is the lowest key (highest seqno) that matches the key with seqno=None
        // abc -> 4
        // abc -> 3 <<< If searching for abc and seqno=4, we would get this
        // abcdef -> 6
        // abcdef -> 5
        //
        let lower_bound = InternalKey::new(key, seqno - 1, ValueType::Value);

        let mut iter = self
            .items
            .range(lower_bound..)
            .take_while(|entry| &*entry.key().user_key == key);

        iter.next().map(|entry| InternalValue {
            key: entry.key().clone(),
            value: entry.value().clone(),
        })
    }

    /// Sluice patch: the items of two keys (`first` < `second`) as [`Memtable::get`] gives
    /// each, found with one skiplist search when `second` lies a few entries after `first`
    /// (a partition header and its row); otherwise the second key gets a search of its own.
    #[doc(hidden)]
    pub fn get_pair(
        &self,
        first: &[u8],
        second: &[u8],
        seqno: SeqNo,
    ) -> (Option<InternalValue>, Option<InternalValue>) {
        /// Entries stepped over before the second key gets a search of its own.
        const MAX_STEPS: usize = 8;

        debug_assert!(first < second, "get_pair needs ascending keys");
        if seqno == 0 {
            return (None, None);
        }
        let lower_bound = InternalKey::new(first, seqno - 1, ValueType::Value);
        let mut found_first = None;
        for (step, entry) in self.items.range(lower_bound..).enumerate() {
            if step == MAX_STEPS {
                break;
            }
            let key = entry.key();
            let user_key: &[u8] = &key.user_key;
            if user_key == first {
                // The range starts at the newest version visible at `seqno`: the first
                // entry of `first` is the one `get` returns; the rest are older.
                if found_first.is_none() {
                    found_first = Some(InternalValue {
                        key: key.clone(),
                        value: entry.value().clone(),
                    });
                }
            } else if user_key == second {
                // Versions of `second` newer than the read sort first: step over them.
                if key.seqno < seqno {
                    let found_second = InternalValue {
                        key: key.clone(),
                        value: entry.value().clone(),
                    };
                    return (found_first, Some(found_second));
                }
            } else if user_key > second {
                return (found_first, None);
            }
        }
        (found_first, self.get(second, seqno))
    }

    /// Gets approximate size of memtable in bytes.
    pub fn size(&self) -> u64 {
        self.approximate_size
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Counts the number of items in the memtable.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Returns `true` if the memtable is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Inserts an item into the memtable
    #[doc(hidden)]
    pub fn insert(&self, item: InternalValue) -> (u64, u64) {
        let (item_size, size_after, _) = self.insert_entry(item);
        (item_size, size_after)
    }

    /// Sluice patch: `insert`, also returning the new entry (for `insert_superseding`).
    fn insert_entry(&self, item: InternalValue) -> (u64, u64, Entry<'_, InternalKey, UserValue>) {
        let item_size = entry_size(&item.key.user_key, &item.value);

        let size_before = self
            .approximate_size
            .fetch_add(item_size, std::sync::atomic::Ordering::AcqRel);

        let key = InternalKey::new(item.key.user_key, item.key.seqno, item.key.value_type);
        let entry = self.items.insert(key, item.value);

        self.highest_seqno
            .fetch_max(item.key.seqno, std::sync::atomic::Ordering::AcqRel);

        (item_size, size_before + item_size, entry)
    }

    /// Sluice patch: inserts like `insert`, then removes the versions of the item's key that
    /// the version just before it supersedes, when that version's seqno is below
    /// `drop_below` (0: remove nothing). Returns the item's size and the bytes removed
    /// (already subtracted from the memtable's size).
    ///
    /// Every write of a key otherwise adds a version that stays until the memtable is
    /// flushed: a key overwritten often fills the memtable with versions no read can see,
    /// and every insert and read searches a skiplist that many times larger (RocksDB's
    /// `inplace_update_support` answers the same workload). Keeping the newest two versions
    /// is safe when the caller passes as `drop_below` a seqno that every read starting from
    /// now will see (the visible seqno, all earlier writes published) and no read is open
    /// (checked in that order, so a read that opens later sees the previous version): reads
    /// at `SeqNo::MAX` always see the newest version. A weak tombstone deletes one version
    /// only, so nothing is removed when the new item or the previous version is one.
    pub fn insert_superseding(&self, item: InternalValue, drop_below: SeqNo) -> (u64, u64) {
        let weak = item.key.value_type == ValueType::WeakTombstone;
        let (item_size, _, entry) = self.insert_entry(item);
        let removed = if weak || drop_below == 0 {
            0
        } else {
            self.remove_superseded(&entry, drop_below)
        };
        (item_size, removed)
    }

    /// Removes the versions after the one following `entry` (same user key), if that one
    /// is older than `drop_below` and not a weak tombstone; returns the bytes removed.
    fn remove_superseded(
        &self,
        entry: &Entry<'_, InternalKey, UserValue>,
        drop_below: SeqNo,
    ) -> u64 {
        let user_key = &entry.key().user_key;
        let Some(previous) = entry.next() else {
            return 0;
        };
        let p = previous.key();
        if p.user_key != *user_key
            || p.seqno >= drop_below
            || p.value_type == ValueType::WeakTombstone
        {
            return 0;
        }
        let mut removed = 0;
        let mut next = previous.next();
        while let Some(old) = next {
            if old.key().user_key != *user_key {
                break;
            }
            next = old.next();
            if old.remove() {
                removed += entry_size(&old.key().user_key, old.value());
            }
        }
        if removed > 0 {
            self.approximate_size
                .fetch_sub(removed, std::sync::atomic::Ordering::AcqRel);
        }
        removed
    }

    /// Returns the highest sequence number in the memtable.
    pub fn get_highest_seqno(&self) -> Option<SeqNo> {
        if self.is_empty() {
            None
        } else {
            Some(
                self.highest_seqno
                    .load(std::sync::atomic::Ordering::Acquire),
            )
        }
    }
}

/// The size a memtable counts for an item (Sluice patch: shared by insert and removal).
fn entry_size(key: &UserKey, value: &UserValue) -> u64 {
    #[expect(
        clippy::expect_used,
        reason = "keys are limited to 16-bit length + values are limited to 32-bit length"
    )]
    (key.len() + value.len() + std::mem::size_of::<InternalValue>())
        .try_into()
        .expect("should fit into u64")
}

/// How many older versions of a key `VisibleRange` steps over one by one before it seeks
/// past the rest (a seek costs a search from the top of the skiplist).
const VERSION_STEPS_BEFORE_SEEK: usize = 4;

/// Sluice patch: a range of a memtable that yields, going forward, only the newest version
/// of each user key visible at `seqno` (item seqno below it), and skips the older versions
/// with a seek once there are more than a few. A key overwritten many times (every write
/// adds a version until the memtable is flushed) then costs a read a handful of steps
/// instead of one per version. Going backward it yields every visible version, as
/// `range` + a seqno filter did; the consumer (`MvccStream`) keeps the newest either way,
/// since each source still yields the newest visible version of each key it holds.
pub struct VisibleRange<'a> {
    items: &'a SkipMap<InternalKey, UserValue>,
    seqno: SeqNo,
    lo: Bound<InternalKey>,
    hi: Bound<InternalKey>,
    /// The next entry to look at from the front (None: exhausted or not started).
    front: Option<Entry<'a, InternalKey, UserValue>>,
    front_started: bool,
    back: Option<Entry<'a, InternalKey, UserValue>>,
    back_started: bool,
    /// The user key last yielded at each end: the ends stop where they meet.
    front_last: Option<UserKey>,
    back_last: Option<UserKey>,
}

impl<'a> VisibleRange<'a> {
    fn above_lo(&self, key: &InternalKey) -> bool {
        match &self.lo {
            Bound::Included(lo) => key >= lo,
            Bound::Excluded(lo) => key > lo,
            Bound::Unbounded => true,
        }
    }

    fn below_hi(&self, key: &InternalKey) -> bool {
        match &self.hi {
            Bound::Included(hi) => key <= hi,
            Bound::Excluded(hi) => key < hi,
            Bound::Unbounded => true,
        }
    }

    /// The first entry after `entry` whose user key is not `user_key`.
    fn past_versions(
        &self,
        entry: Entry<'a, InternalKey, UserValue>,
        user_key: &UserKey,
    ) -> Option<Entry<'a, InternalKey, UserValue>> {
        let mut next = entry.next();
        for _ in 0..VERSION_STEPS_BEFORE_SEEK {
            let e = next?;
            if e.key().user_key != *user_key {
                return Some(e);
            }
            next = e.next();
        }
        let e = next?;
        if e.key().user_key != *user_key {
            return Some(e);
        }
        // Seqno 0 sorts last among a key's versions (whatever the value type).
        let last_version = InternalKey::new(user_key.clone(), 0, ValueType::Tombstone);
        self.items.lower_bound(Bound::Excluded(&last_version))
    }
}

impl Iterator for VisibleRange<'_> {
    type Item = InternalValue;

    fn next(&mut self) -> Option<InternalValue> {
        if !self.front_started {
            self.front_started = true;
            self.front = match &self.lo {
                Bound::Included(k) => self.items.lower_bound(Bound::Included(k)),
                Bound::Excluded(k) => self.items.lower_bound(Bound::Excluded(k)),
                Bound::Unbounded => self.items.front(),
            };
        }
        loop {
            let entry = self.front.take()?;
            let key = entry.key();
            if !self.below_hi(key)
                || self
                    .back_last
                    .as_ref()
                    .is_some_and(|back| key.user_key >= *back)
            {
                return None;
            }
            if key.seqno >= self.seqno {
                // Newer than the reader's snapshot.
                self.front = entry.next();
                continue;
            }
            let item = InternalValue {
                key: key.clone(),
                value: entry.value().clone(),
            };
            self.front = self.past_versions(entry, &item.key.user_key);
            self.front_last = Some(item.key.user_key.clone());
            return Some(item);
        }
    }
}

impl DoubleEndedIterator for VisibleRange<'_> {
    fn next_back(&mut self) -> Option<InternalValue> {
        if !self.back_started {
            self.back_started = true;
            self.back = match &self.hi {
                Bound::Included(k) => self.items.upper_bound(Bound::Included(k)),
                Bound::Excluded(k) => self.items.upper_bound(Bound::Excluded(k)),
                Bound::Unbounded => self.items.back(),
            };
        }
        loop {
            let entry = self.back.take()?;
            let key = entry.key();
            if !self.above_lo(key)
                || self
                    .front_last
                    .as_ref()
                    .is_some_and(|front| key.user_key <= *front)
            {
                return None;
            }
            self.back = entry.prev();
            if key.seqno >= self.seqno {
                continue;
            }
            self.back_last = Some(key.user_key.clone());
            return Some(InternalValue {
                key: key.clone(),
                value: entry.value().clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ValueType;
    use test_log::test;

    /// Sluice patch: `insert_superseding` keeps the newest two versions of a key when the
    /// previous one is below `drop_below`, nothing else, and keeps the size in step.
    #[test]
    fn insert_superseding_keeps_the_newest_two_versions() {
        let memtable = Memtable::new(0);
        let put = |key: &[u8], seqno, drop_below| {
            memtable.insert_superseding(
                InternalValue::from_components(key, *b"value", seqno, ValueType::Value),
                drop_below,
            )
        };
        for seqno in 0..3 {
            assert_eq!(0, put(b"a", seqno, 0).1, "drop_below 0 removes nothing");
        }
        put(b"b", 3, 100);
        assert_eq!(4, memtable.len());
        // a@0 and a@1 are superseded by a@2, which every reader sees.
        let (size, removed) = put(b"a", 4, 100);
        assert_eq!(2 * size, removed);
        assert_eq!(3, memtable.len());
        assert_eq!(3 * size, memtable.size());
        let seqnos: Vec<SeqNo> = memtable.iter().map(|v| v.key.seqno).collect();
        assert_eq!(vec![4, 2, 3], seqnos);
        // A reader below the previous version's seqno may still need what is under it.
        put(b"a", 5, 4);
        assert_eq!(4, memtable.len());
        assert_eq!(Some(2), memtable.get(b"a", 3).map(|v| v.key.seqno));

        // A weak tombstone deletes exactly one version: it never lets anything go.
        memtable.insert_superseding(InternalValue::new_weak_tombstone(*b"a", 6), 100);
        assert_eq!(5, memtable.len());
        put(b"a", 7, 100);
        assert_eq!(
            6,
            memtable.len(),
            "the previous version is a weak tombstone"
        );
        put(b"a", 8, 100);
        let versions = memtable.iter().filter(|v| &*v.key.user_key == b"a");
        assert_eq!(2, versions.count());
    }

    #[test]
    #[expect(clippy::unwrap_used)]
    fn memtable_mvcc_point_read() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            *b"hello-key-999991",
            *b"hello-value-999991",
            0,
            ValueType::Value,
        ));

        let item = memtable.get(b"hello-key-99999", SeqNo::MAX);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", SeqNo::MAX);
        assert_eq!(*b"hello-value-999991", &*item.unwrap().value);

        memtable.insert(InternalValue::from_components(
            *b"hello-key-999991",
            *b"hello-value-999991-2",
            1,
            ValueType::Value,
        ));

        let item = memtable.get(b"hello-key-99999", SeqNo::MAX);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", SeqNo::MAX);
        assert_eq!((*b"hello-value-999991-2"), &*item.unwrap().value);

        let item = memtable.get(b"hello-key-99999", 1);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", 1);
        assert_eq!((*b"hello-value-999991"), &*item.unwrap().value);

        let item = memtable.get(b"hello-key-99999", 2);
        assert_eq!(None, item);

        let item = memtable.get(b"hello-key-999991", 2);
        assert_eq!((*b"hello-value-999991-2"), &*item.unwrap().value);
    }

    #[test]
    fn memtable_get() {
        let memtable = Memtable::new(0);

        let value =
            InternalValue::from_components(b"abc".to_vec(), b"abc".to_vec(), 0, ValueType::Value);

        memtable.insert(value.clone());

        assert_eq!(Some(value), memtable.get(b"abc", SeqNo::MAX));
    }

    #[test]
    fn memtable_get_highest_seqno() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            0,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            1,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            2,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            3,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            4,
            ValueType::Value,
        ));

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                4,
                ValueType::Value,
            )),
            memtable.get(b"abc", SeqNo::MAX)
        );
    }

    #[test]
    fn memtable_get_prefix() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            b"abc0".to_vec(),
            b"abc".to_vec(),
            0,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            255,
            ValueType::Value,
        ));

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                255,
                ValueType::Value,
            )),
            memtable.get(b"abc", SeqNo::MAX)
        );

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc0".to_vec(),
                b"abc".to_vec(),
                0,
                ValueType::Value,
            )),
            memtable.get(b"abc0", SeqNo::MAX)
        );
    }

    #[test]
    fn memtable_get_old_version() {
        let memtable = Memtable::new(0);

        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            0,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            99,
            ValueType::Value,
        ));
        memtable.insert(InternalValue::from_components(
            b"abc".to_vec(),
            b"abc".to_vec(),
            255,
            ValueType::Value,
        ));

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                255,
                ValueType::Value,
            )),
            memtable.get(b"abc", SeqNo::MAX)
        );

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                99,
                ValueType::Value,
            )),
            memtable.get(b"abc", 100)
        );

        assert_eq!(
            Some(InternalValue::from_components(
                b"abc".to_vec(),
                b"abc".to_vec(),
                0,
                ValueType::Value,
            )),
            memtable.get(b"abc", 50)
        );
    }
    /// Sluice patch: `range_visible` read through `MvccStream` gives what `range` with a
    /// seqno filter gives, forward and backward, for many versions of few keys.
    #[test]
    fn range_visible_matches_the_filtered_range() {
        use crate::mvcc_stream::MvccStream;
        use std::ops::Bound;

        let memtable = Memtable::new(0);
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut rand = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        // 40 keys, most with many versions, a few tombstones.
        for seqno in 0..3_000u64 {
            let key = format!("k{:02}", rand(40));
            let value_type = if rand(10) == 0 {
                ValueType::Tombstone
            } else {
                ValueType::Value
            };
            memtable.insert(InternalValue::from_components(
                key.as_bytes(),
                seqno.to_be_bytes(),
                seqno,
                value_type,
            ));
        }
        let key = |i: u64| format!("k{i:02}").into_bytes();
        // Bounds as `create_range` makes them.
        let los = |i: u64| {
            [
                Bound::Unbounded,
                Bound::Included(InternalKey::new(key(i), SeqNo::MAX, ValueType::Tombstone)),
                Bound::Excluded(InternalKey::new(key(i), 0, ValueType::Tombstone)),
            ]
        };
        let his = |i: u64| {
            [
                Bound::Unbounded,
                Bound::Included(InternalKey::new(key(i), 0, ValueType::Value)),
                Bound::Excluded(InternalKey::new(key(i), SeqNo::MAX, ValueType::Value)),
            ]
        };
        let flat = |items: Vec<crate::Result<InternalValue>>| -> Vec<(Vec<u8>, SeqNo)> {
            items
                .into_iter()
                .map(|v| {
                    let v = v.expect("no I/O in a memtable");
                    (v.key.user_key.to_vec(), v.key.seqno)
                })
                .collect()
        };
        let mut checked = 0;
        for _ in 0..200 {
            let (a, b) = (rand(42), rand(42));
            let seqno = [1, 2, rand(3_000), rand(3_000), 3_000, SeqNo::MAX][rand(6) as usize];
            for lo in los(a.min(b)) {
                for hi in his(a.max(b)) {
                    let range = (lo.clone(), hi.clone());
                    let expected = |reverse: bool| {
                        let iter = memtable
                            .range(range.clone())
                            .filter(|v| crate::range::seqno_filter(v.key.seqno, seqno))
                            .map(Ok);
                        let stream = MvccStream::new(iter);
                        flat(if reverse {
                            stream.rev().collect()
                        } else {
                            stream.collect()
                        })
                    };
                    let actual = |reverse: bool| {
                        let iter = memtable.range_visible(range.clone(), seqno).map(Ok);
                        let stream = MvccStream::new(iter);
                        flat(if reverse {
                            stream.rev().collect()
                        } else {
                            stream.collect()
                        })
                    };
                    assert_eq!(actual(false), expected(false), "{range:?} at {seqno}");
                    assert_eq!(actual(true), expected(true), "{range:?} at {seqno}, reversed");
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 200 * 9);
        // The forward stream steps over versions: fewer items than the plain range.
        let plain = memtable.range::<(Bound<InternalKey>, Bound<InternalKey>)>((Bound::Unbounded, Bound::Unbounded)).count();
        let visible = memtable
            .range_visible((Bound::Unbounded, Bound::Unbounded), SeqNo::MAX)
            .count();
        assert_eq!(plain, 3_000);
        assert_eq!(visible, 40);
    }
}
