// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

//! Sluice patch: prefix Bloom filters.
//!
//! A tree configured with a [`PrefixExtractor`] adds the hash of every key's prefix to each
//! table's Bloom filter, next to the key's own hash, and a range read whose bounds both lie
//! within one prefix skips the tables whose filter does not hold that prefix, as a point
//! read skips the tables whose filter does not hold its key.

use std::{ops::Bound, sync::Arc};

/// Finds the prefix of a key that range reads are filtered on.
pub trait PrefixExtractor: Send + Sync + std::panic::RefUnwindSafe {
    /// A name stored in every table written with this extractor: a table is filtered on
    /// prefixes only by an extractor of the same name (change the name when the prefixes
    /// change).
    fn name(&self) -> &str;

    /// The length of `key`'s prefix, or `None` when the key has none (it is then in the
    /// filter by its full key only). A key's prefix is a byte prefix of it, and every key
    /// that starts with a prefix has that prefix.
    fn prefix_len(&self, key: &[u8]) -> Option<usize>;
}

/// A prefix extractor shared by a tree's configuration and its table writers.
pub type SharedPrefixExtractor = Arc<dyn PrefixExtractor>;

/// The prefix that every key of a range starts with, if its lower bound has one and its
/// upper bound is within it or is the end of it.
pub(crate) fn range_prefix<'a>(
    extractor: &dyn PrefixExtractor,
    lo: Bound<&'a [u8]>,
    hi: Bound<&[u8]>,
) -> Option<&'a [u8]> {
    let lo = match lo {
        Bound::Included(k) | Bound::Excluded(k) => k,
        Bound::Unbounded => return None,
    };
    let prefix = lo.get(..extractor.prefix_len(lo)?)?;
    match hi {
        Bound::Included(k) => k.starts_with(prefix).then_some(prefix),
        // An exclusive end at the prefix's successor still selects only keys within it.
        Bound::Excluded(k) => (k.starts_with(prefix) || is_successor(prefix, k)).then_some(prefix),
        Bound::Unbounded => None,
    }
}

/// True when `end` is the smallest byte string above every string that starts with `prefix`.
fn is_successor(prefix: &[u8], end: &[u8]) -> bool {
    let Some(last) = prefix.iter().rposition(|&b| b != 0xFF) else {
        return false;
    };
    end.len() == last + 1
        && end.get(..last) == prefix.get(..last)
        && end.get(last).copied() == prefix.get(last).map(|b| b + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::Bound::{Excluded, Included, Unbounded};

    /// The prefix is the key's first two bytes.
    struct FirstTwo;

    impl PrefixExtractor for FirstTwo {
        fn name(&self) -> &str {
            "first_two"
        }

        fn prefix_len(&self, key: &[u8]) -> Option<usize> {
            (key.len() >= 2).then_some(2)
        }
    }

    #[test]
    fn range_prefix_only_for_ranges_within_one_prefix() {
        let e = FirstTwo;
        let ab: &[u8] = b"ab";
        assert_eq!(
            range_prefix(&e, Included(b"abc"), Included(b"abz")),
            Some(ab)
        );
        assert_eq!(range_prefix(&e, Included(b"ab"), Excluded(b"ac")), Some(ab));
        assert_eq!(
            range_prefix(&e, Excluded(b"ab\0"), Excluded(b"ab\x01")),
            Some(ab)
        );
        assert_eq!(range_prefix(&e, Included(b"abc"), Excluded(b"ad")), None);
        assert_eq!(range_prefix(&e, Included(b"abc"), Included(b"ac")), None);
        assert_eq!(range_prefix(&e, Included(b"abc"), Unbounded), None);
        assert_eq!(range_prefix(&e, Unbounded, Included(b"abc")), None);
        assert_eq!(range_prefix(&e, Included(b"a"), Included(b"a")), None);
        let top: &[u8] = b"a\xff";
        assert_eq!(
            range_prefix(&e, Included(b"a\xff1"), Excluded(b"b")),
            Some(top)
        );
        assert_eq!(
            range_prefix(&e, Included(b"\xff\xff1"), Excluded(b"\xff\xff\xff")),
            Some(&b"\xff\xff"[..])
        );
    }

    fn keys_in(tree: &crate::AnyTree, lo: &[u8], hi: &[u8]) -> crate::Result<Vec<Vec<u8>>> {
        use crate::{AbstractTree, Guard};

        tree.range(lo..hi, crate::SeqNo::MAX, None)
            .map(|g| g.key().map(|k| k.to_vec()))
            .collect()
    }

    /// Four tables whose key ranges all overlap; table `i` alone holds the prefix `a{i}`.
    fn four_tables(
        extractor: Option<SharedPrefixExtractor>,
    ) -> crate::Result<(tempfile::TempDir, crate::AnyTree)> {
        use crate::{AbstractTree, Config, SequenceNumberCounter};

        let dir = tempfile::tempdir()?;
        let tree = Config::new(
            dir.path(),
            SequenceNumberCounter::default(),
            SequenceNumberCounter::default(),
        )
        .with_prefix_extractor(extractor)
        .open()?;
        let mut seqno = 0;
        for i in b'0'..b'4' {
            for key in [[b'a', i, b'x'], [b'a', i, b'y'], [b'z', i, b'x']] {
                tree.insert(key.as_slice(), "v", seqno);
                seqno += 1;
            }
            tree.flush_active_memtable(0)?;
        }
        Ok((dir, tree))
    }

    #[test]
    fn prefix_filters_skip_tables_without_the_prefix() -> crate::Result<()> {
        use crate::AbstractTree;

        let (_dir, tree) = four_tables(Some(Arc::new(FirstTwo)))?;
        let (_plain_dir, plain) = four_tables(None)?;
        assert_eq!(4, tree.table_count());

        let version = tree.current_version();
        let tables: Vec<_> = version.iter_tables().collect();
        let hash = crate::table::filter::standard_bloom::Builder::get_hash(b"a2");
        let holders: Vec<bool> = tables
            .iter()
            .map(|t| t.maybe_contains_prefix("first_two", b"a2", hash))
            .collect::<crate::Result<_>>()?;
        assert_eq!(1, holders.iter().filter(|h| **h).count(), "{holders:?}");
        // A table is never filtered by an extractor it was not written with.
        for table in &tables {
            assert!(table.maybe_contains_prefix("other", b"a2", hash)?);
        }

        // Range reads within a prefix, at a bound and across prefixes, as without the filter.
        for (lo, hi) in [
            (&b"a2"[..], &b"a3"[..]),
            (b"a2x", b"a2y"),
            (b"a2y", b"a2z"),
            (b"a9", b"b"),
            (b"a1", b"a4"),
            (b"z1", b"z2"),
        ] {
            assert_eq!(
                keys_in(&plain, lo, hi)?,
                keys_in(&tree, lo, hi)?,
                "{lo:?}..{hi:?}"
            );
        }
        assert_eq!(
            vec![b"a2x".to_vec(), b"a2y".to_vec()],
            keys_in(&tree, b"a2", b"a3")?
        );

        // A compaction writes the prefixes into its tables too.
        tree.major_compact(u64::MAX, 0)?;
        let version = tree.current_version();
        let tables: Vec<_> = version.iter_tables().collect();
        assert_eq!(1, tables.len());
        let absent = crate::table::filter::standard_bloom::Builder::get_hash(b"a7");
        assert!(tables[0].maybe_contains_prefix("first_two", b"a2", hash)?);
        assert!(!tables[0].maybe_contains_prefix("first_two", b"a7", absent)?);
        assert_eq!(
            vec![b"a2x".to_vec(), b"a2y".to_vec()],
            keys_in(&tree, b"a2", b"a3")?
        );
        Ok(())
    }
}
