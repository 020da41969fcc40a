// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

use crate::{SeqNo, UserKey, ValueType};

#[derive(Clone, Eq)]
pub struct InternalKey {
    pub user_key: UserKey,
    pub seqno: SeqNo,
    pub value_type: ValueType,
}

impl PartialEq for InternalKey {
    fn eq(&self, other: &Self) -> bool {
        self.user_key == other.user_key && self.seqno == other.seqno
    }
}

#[cfg_attr(coverage_nightly, coverage(off))]
impl std::fmt::Debug for InternalKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?}:{}:{}",
            self.user_key,
            self.seqno,
            match self.value_type {
                ValueType::Value => "V",
                ValueType::Tombstone => "T",
                ValueType::WeakTombstone => "W",
                ValueType::Indirection => "Vb",
            },
        )
    }
}

impl InternalKey {
    pub fn new<K: Into<UserKey>>(user_key: K, seqno: SeqNo, value_type: ValueType) -> Self {
        let user_key = user_key.into();

        assert!(
            u16::try_from(user_key.len()).is_ok(),
            "keys can be 65535 bytes in length",
        );

        Self {
            user_key,
            seqno,
            value_type,
        }
    }

    pub fn is_tombstone(&self) -> bool {
        self.value_type.is_tombstone()
    }
}

impl PartialOrd for InternalKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

// Order by user key ascending, THEN by sequence number descending
// This is one of the most important functions
// Otherwise queries will not match expected behaviour
impl Ord for InternalKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Sluice patch: the user keys through `cmp_bytes` instead of `Slice`'s `Ord`.
        cmp_bytes(&self.user_key, &other.user_key).then_with(|| other.seqno.cmp(&self.seqno))
    }
}

/// Sluice patch: the lexicographic order of two byte strings (what `<[u8] as Ord>::cmp`
/// gives), eight bytes at a time as big-endian words, inlined.
///
/// Every memtable insert and lookup compares its key with the keys of about two skiplist
/// nodes per level. `Slice`'s own `Ord` (`ByteView`'s) calls `memcmp` twice per comparison,
/// once on the 4-byte inline prefixes and once on the whole keys; the keys of one table share
/// a long prefix (Sluice's start with a 16-byte table id), so the first call never decides and
/// both calls' set-up costs more than the words compared here.
#[inline]
pub(crate) fn cmp_bytes(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    let common = a.len().min(b.len());
    let (mut x, mut y) = (&a[..common], &b[..common]);
    while let (Some((wx, rx)), Some((wy, ry))) =
        (x.split_first_chunk::<8>(), y.split_first_chunk::<8>())
    {
        if wx != wy {
            return u64::from_be_bytes(*wx).cmp(&u64::from_be_bytes(*wy));
        }
        x = rx;
        y = ry;
    }
    for (bx, by) in x.iter().zip(y) {
        if bx != by {
            return bx.cmp(by);
        }
    }
    a.len().cmp(&b.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;
    use test_log::test;

    /// Sluice patch: `cmp_bytes` orders as the slice order does, over keys that share
    /// prefixes of every length (so that every word and tail position decides somewhere),
    /// and `InternalKey`'s order is still user key ascending, then seqno descending.
    #[test]
    fn cmp_bytes_matches_the_slice_order() {
        let mut rng = rand::rng();
        for _ in 0..200_000 {
            let len_a = rng.random_range(0..48);
            let mut a: Vec<u8> = (0..len_a).map(|_| rng.random_range(0..4)).collect();
            let mut b = a.clone();
            // b: a prefix of a, then its own bytes (few values, so that ties are common).
            b.truncate(rng.random_range(0..=len_a));
            let extra = rng.random_range(0..20);
            b.extend((0..extra).map(|_| rng.random_range(0..4)));
            if rng.random_bool(0.1) {
                a.push(255);
            }
            assert_eq!(cmp_bytes(&a, &b), a.as_slice().cmp(&b), "{a:?} {b:?}");
            assert_eq!(cmp_bytes(&b, &a), b.as_slice().cmp(&a), "{b:?} {a:?}");
            assert_eq!(cmp_bytes(&a, &a), std::cmp::Ordering::Equal);

            let (sa, sb) = (rng.random::<u64>(), rng.random::<u64>());
            let (ka, kb) = (
                InternalKey::new(a.clone(), sa, ValueType::Value),
                InternalKey::new(b.clone(), sb, ValueType::Value),
            );
            let expected = a.as_slice().cmp(&b).then(sb.cmp(&sa));
            assert_eq!(ka.cmp(&kb), expected);
        }
    }

    #[test]
    fn key_order_smoke_test() {
        use ValueType::Value as V;

        let mut keys = [
            InternalKey::new(b"d", 3, V),
            InternalKey::new(b"a", 0, V),
            InternalKey::new(b"b", 0, V),
            InternalKey::new(b"a", 2, V),
            InternalKey::new(b"b", 1, V),
            InternalKey::new(b"a", 1, V),
            InternalKey::new(b"c", 3, V),
        ];
        keys.sort();

        assert_eq!(
            [
                InternalKey::new(b"a", 2, V),
                InternalKey::new(b"a", 1, V),
                InternalKey::new(b"a", 0, V),
                InternalKey::new(b"b", 1, V),
                InternalKey::new(b"b", 0, V),
                InternalKey::new(b"c", 3, V),
                InternalKey::new(b"d", 3, V),
            ],
            keys,
        );
    }
}
