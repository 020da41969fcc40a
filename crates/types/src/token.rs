//! Partition tokens and shards: Cassandra's Murmur3Partitioner hash, the routing key that
//! drivers hash, and ScyllaDB's token-to-shard mapping.

const C1: u64 = 0x87c3_7b91_1142_53d5;
const C2: u64 = 0x4cf5_ad43_2745_937f;

#[inline]
fn fmix(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

#[inline]
fn mix_k1(k1: u64) -> u64 {
    k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2)
}

#[inline]
fn mix_k2(k2: u64) -> u64 {
    k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1)
}

/// Reads 8 bytes little-endian; `chunk` is always exactly 8 bytes long.
#[inline]
fn le_u64(chunk: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(chunk);
    u64::from_le_bytes(b)
}

/// Up to 8 tail bytes as one word, each byte sign-extended before it is shifted into place
/// (the Cassandra quirk: `(long) byte` in Java). The bytes themselves make the little-endian
/// word; a byte with its top bit set also flips every bit above it, which for all such
/// bytes together is the prefix XOR of their top bits moved up by one.
#[inline]
fn tail_word(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    let raw = if n >= 4 {
        // Two 4-byte loads that overlap when n < 8: the shared bytes are equal, so OR
        // assembles the word without a variable-length copy.
        let lo = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let hi = u32::from_le_bytes([bytes[n - 4], bytes[n - 3], bytes[n - 2], bytes[n - 1]]);
        u64::from(lo) | (u64::from(hi) << ((n - 4) * 8))
    } else {
        bytes
            .iter()
            .enumerate()
            .fold(0, |w, (i, &b)| w | (u64::from(b) << (i * 8)))
    };
    let mut flips = (raw & 0x8080_8080_8080_8080) << 1;
    flips ^= flips << 1;
    flips ^= flips << 2;
    flips ^= flips << 4;
    flips ^= flips << 8;
    flips ^= flips << 16;
    flips ^= flips << 32;
    raw ^ flips
}

/// The Murmur3Partitioner token of a routing key.
///
/// This is MurmurHash3_x64_128 with seed 0, keeping the low half (`h1`), with Cassandra's
/// quirk: tail bytes are sign-extended (Java `(long) byte`) before they are mixed in.
/// `i64::MIN` is normalized to `i64::MAX`, as Cassandra does, because `i64::MIN` is the
/// ring's minimum token and no key may hash to it. The empty key hashes to 0.
pub fn murmur3_token(key: &[u8]) -> i64 {
    let mut h1: u64 = 0;
    let mut h2: u64 = 0;

    let mut blocks = key.chunks_exact(16);
    for block in &mut blocks {
        let k1 = le_u64(&block[..8]);
        let k2 = le_u64(&block[8..]);

        h1 ^= mix_k1(k1);
        h1 = h1
            .rotate_left(27)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x52dc_e729);

        h2 ^= mix_k2(k2);
        h2 = h2
            .rotate_left(31)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x3849_5ab5);
    }

    let tail = blocks.remainder();
    if tail.len() > 8 {
        h2 ^= mix_k2(tail_word(&tail[8..]));
    }
    if !tail.is_empty() {
        h1 ^= mix_k1(tail_word(&tail[..tail.len().min(8)]));
    }

    let len = key.len() as u64;
    h1 ^= len;
    h2 ^= len;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix(h1);
    h2 = fmix(h2);
    h1 = h1.wrapping_add(h2);

    let token = h1 as i64;
    if token == i64::MIN {
        i64::MAX
    } else {
        token
    }
}

/// Appends the routing key of a partition key to `out`: a single component is its raw
/// serialized bytes; a composite key is, per component, `u16 BE length ‖ bytes ‖ 0x00`.
///
/// Components longer than `u16::MAX` cannot be expressed in a composite key; their length
/// is truncated to the low 16 bits exactly as the drivers' `as u16` cast does (the engine
/// rejects partition key components over 64 KiB before they get here).
pub fn routing_key_into(components: &[&[u8]], out: &mut Vec<u8>) {
    match components {
        [single] => out.extend_from_slice(single),
        many => {
            for c in many {
                out.extend_from_slice(&(c.len() as u16).to_be_bytes());
                out.extend_from_slice(c);
                out.push(0);
            }
        }
    }
}

/// The routing key of a partition key (see [`routing_key_into`]).
pub fn routing_key(components: &[&[u8]]) -> Vec<u8> {
    let len = match components {
        [single] => single.len(),
        many => many.iter().map(|c| c.len() + 3).sum(),
    };
    let mut out = Vec::with_capacity(len);
    routing_key_into(components, &mut out);
    out
}

/// ScyllaDB's `SCYLLA_SHARDING_IGNORE_MSB` as Sluice advertises it: shards, stores and
/// shard-aware drivers agree on it.
pub const SHARDING_IGNORE_MSB: u8 = 12;

/// The ScyllaDB shard that owns `token` (biased-token-round-robin sharding):
/// `((((token + 2^63) mod 2^64) << ignore_msb) mod 2^64) * nr_shards >> 64`.
///
/// `nr_shards == 0` is treated as one shard; an `ignore_msb` of 64 or more shifts
/// everything out, mapping every token to shard 0, like a 64-bit shift in the spec.
pub fn shard_of(token: i64, nr_shards: u32, ignore_msb: u8) -> u32 {
    if nr_shards <= 1 {
        return 0;
    }
    let biased = (token as u64).wrapping_add(1u64 << 63);
    let shifted = if ignore_msb >= 64 {
        0
    } else {
        biased << ignore_msb
    };
    ((u128::from(shifted) * u128::from(nr_shards)) >> 64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_token_vectors() {
        let cases: [(&[u8], i64); 9] = [
            (b"test", -6017608668500074083),
            (b"xd", 4507812186440344727),
            (b"primary_key", -1632642444691073360),
            ("kremówki".as_bytes(), 4354931215268080151),
            (&0i64.to_be_bytes(), 2945182322382062539),
            (&1i64.to_be_bytes(), 6292367497774912474),
            (&(-1i64).to_be_bytes(), 7071048584287372947),
            (&1i32.to_be_bytes(), -4069959284402364209),
            (b"", 0),
        ];
        for (key, want) in cases {
            assert_eq!(murmur3_token(key), want, "key {key:?}");
        }
        let composite = routing_key(&[&1i32.to_be_bytes(), b"a"]);
        assert_eq!(murmur3_token(&composite), 6516349416904725244);
    }

    #[test]
    fn long_keys_cover_full_blocks_and_both_tail_halves() {
        // Keys of 16..=40 bytes exercise full blocks plus tails in k1 only and in k1+k2;
        // bytes >= 0x80 exercise the sign-extension quirk. Every length must hash
        // differently from its neighbours and deterministically.
        let key: Vec<u8> = (0u8..40)
            .map(|i| i.wrapping_mul(37).wrapping_add(0x80))
            .collect();
        let mut seen = std::collections::HashSet::new();
        for len in 0..=key.len() {
            let t = murmur3_token(&key[..len]);
            assert_eq!(t, murmur3_token(&key[..len]));
            assert!(seen.insert(t), "collision at len {len}");
        }
    }

    /// The tail word against the byte-by-byte sign extension it replaces.
    #[test]
    fn tail_words_sign_extend_every_byte() {
        fn by_bytes(bytes: &[u8]) -> u64 {
            let mut k = 0u64;
            for (i, &b) in bytes.iter().enumerate() {
                k ^= (b as i8 as i64 as u64) << (i * 8);
            }
            k
        }
        proptest::proptest!(|(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..=8))| {
            proptest::prop_assert_eq!(tail_word(&bytes), by_bytes(&bytes));
        });
        for bytes in [
            &[0x80u8][..],
            &[0xff; 8],
            &[0x7f, 0x80, 0x01, 0xff],
            &[0, 0, 0, 0, 0, 0, 0, 0x80],
        ] {
            assert_eq!(tail_word(bytes), by_bytes(bytes), "{bytes:?}");
        }
    }

    #[test]
    fn sign_extension_changes_the_hash() {
        // A plain (non-sign-extending) x64_128 of [0x80] would mix k1 = 0x80; Cassandra
        // mixes 0xffff_ffff_ffff_ff80. Recompute both by hand to prove which one we do.
        let quirk = {
            let k1 = 0xffff_ffff_ffff_ff80u64;
            let mut h1 = mix_k1(k1) ^ 1;
            let mut h2 = 1u64;
            h1 = h1.wrapping_add(h2);
            h2 = h2.wrapping_add(h1);
            h1 = fmix(h1);
            h2 = fmix(h2);
            h1.wrapping_add(h2) as i64
        };
        assert_eq!(murmur3_token(&[0x80]), quirk);
    }

    #[test]
    fn routing_key_layout() {
        assert_eq!(routing_key(&[b"abc"]), b"abc".to_vec());
        assert_eq!(
            routing_key(&[b"ab", b""]),
            vec![0, 2, b'a', b'b', 0, 0, 0, 0]
        );
        let mut out = vec![9];
        routing_key_into(&[b"x", b"yz"], &mut out);
        assert_eq!(out, vec![9, 0, 1, b'x', 0, 0, 2, b'y', b'z', 0]);
    }

    #[test]
    fn scylla_shard_vectors() {
        assert_eq!(shard_of(murmur3_token(b"a"), 12, 12), 4);
        assert_eq!(shard_of(murmur3_token(b"b"), 12, 12), 6);
        assert_eq!(shard_of(i64::MIN, 12, 0), 0);
        assert_eq!(shard_of(i64::MAX, 12, 0), 11);
        assert_eq!(shard_of(12345, 1, 12), 0);
        assert_eq!(shard_of(12345, 0, 12), 0);
        assert_eq!(shard_of(12345, 8, 64), 0);
    }

    #[test]
    fn shards_are_balanced_without_msb_bias() {
        let mut counts = [0u32; 4];
        for i in 0..4000i64 {
            let s = shard_of(murmur3_token(&i.to_be_bytes()), 4, 12);
            counts[s as usize] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "unbalanced shards {counts:?}");
        }
    }
}
