//! The read count exchange of the per-partition read limit in a cluster.
//!
//! Writes reach every replica, so each replica's count of admitted writes already holds every
//! coordinator's. Reads reach only some replicas, so a node that admits a read of a table with
//! `max_reads_per_second` keeps it in [`PendingReads`], and every [`EXCHANGE_INTERVAL`] sends
//! the other replicas of each key how many reads it admitted, in which window (a one-way
//! message, [`encode_read_counts`]). The receiver adds them to its count of admitted reads;
//! the read decision is then made from this node's admissions plus its peers', and several
//! coordinators share one limit whichever replicas the drivers pick.
//!
//! Everything is bounded: [`MAX_PENDING_KEYS`] keys wait between two exchanges (the reads of
//! further keys are not shared, and counted as dropped), a message holds at most
//! [`MAX_KEYS_PER_MESSAGE`] keys, and a malformed message is refused whole, before anything
//! is counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};

use crate::replica_msg::MalformedBody;

/// How often a node sends the reads it admitted to the other replicas of their keys: the
/// limit can be exceeded by about this fraction of a second's worth of reads.
pub const EXCHANGE_INTERVAL: Duration = Duration::from_millis(25);

/// Keys whose admitted reads wait for the next exchange.
pub const MAX_PENDING_KEYS: usize = 4096;

/// Keys in one message (its body is at most `3 + 32 × 256` bytes).
pub const MAX_KEYS_PER_MESSAGE: usize = 256;

/// The version byte a body starts with.
const VERSION: u8 = 1;
/// Version byte and key count.
const HEADER_LEN: usize = 3;
/// Table id, token, window and count.
const ENTRY_LEN: usize = 16 + 8 + 4 + 4;

/// Reads of one key a node admitted in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCount {
    /// The table's id.
    pub table: [u8; 16],
    /// The partition's token.
    pub token: i64,
    /// The sender's one-second window the reads were admitted in.
    pub window: u32,
    /// How many (at least one).
    pub count: u32,
}

/// Encodes up to [`MAX_KEYS_PER_MESSAGE`] counts into one message body.
pub fn encode_read_counts(counts: &[ReadCount]) -> Bytes {
    debug_assert!(!counts.is_empty() && counts.len() <= MAX_KEYS_PER_MESSAGE);
    let counts = &counts[..counts.len().min(MAX_KEYS_PER_MESSAGE)];
    let mut b = BytesMut::with_capacity(HEADER_LEN + ENTRY_LEN * counts.len());
    b.put_u8(VERSION);
    b.put_u16(counts.len() as u16);
    for c in counts {
        b.put_slice(&c.table);
        b.put_i64(c.token);
        b.put_u32(c.window);
        b.put_u32(c.count);
    }
    b.freeze()
}

fn entry_at(body: &[u8], i: usize) -> ReadCount {
    let e = &body[HEADER_LEN + i * ENTRY_LEN..HEADER_LEN + (i + 1) * ENTRY_LEN];
    let mut table = [0u8; 16];
    table.copy_from_slice(&e[..16]);
    let word = |at: usize| [e[at], e[at + 1], e[at + 2], e[at + 3]];
    ReadCount {
        table,
        token: i64::from_be_bytes([e[16], e[17], e[18], e[19], e[20], e[21], e[22], e[23]]),
        window: u32::from_be_bytes(word(24)),
        count: u32::from_be_bytes(word(28)),
    }
}

/// Checks a whole body and returns its counts; nothing is read from a body that is not
/// exactly a version byte, a key count within bounds and that many entries of non-zero count.
pub fn decode_read_counts(
    body: &[u8],
) -> Result<impl Iterator<Item = ReadCount> + '_, MalformedBody> {
    if body.len() < HEADER_LEN {
        return Err(MalformedBody("read counts: truncated header"));
    }
    if body[0] != VERSION {
        return Err(MalformedBody("read counts: unknown version"));
    }
    let n = usize::from(u16::from_be_bytes([body[1], body[2]]));
    if n == 0 || n > MAX_KEYS_PER_MESSAGE {
        return Err(MalformedBody("read counts: key count out of bounds"));
    }
    if body.len() != HEADER_LEN + n * ENTRY_LEN {
        return Err(MalformedBody(
            "read counts: length does not match the key count",
        ));
    }
    if (0..n).any(|i| entry_at(body, i).count == 0) {
        return Err(MalformedBody("read counts: a zero count"));
    }
    Ok((0..n).map(move |i| entry_at(body, i)))
}

/// The reads this node admitted since the last exchange, per (table, token, window).
#[derive(Debug, Default)]
pub(crate) struct PendingReads {
    counts: HashMap<([u8; 16], i64, u32), u32>,
}

impl PendingReads {
    /// Adds one admitted read; false when [`MAX_PENDING_KEYS`] other keys already wait.
    pub(crate) fn add(&mut self, table: [u8; 16], token: i64, window: u32) -> bool {
        let full = self.counts.len() >= MAX_PENDING_KEYS;
        match self.counts.get_mut(&(table, token, window)) {
            Some(n) => *n = n.saturating_add(1),
            None if full => return false,
            None => {
                self.counts.insert((table, token, window), 1);
            }
        }
        debug_assert!(self.counts.len() <= MAX_PENDING_KEYS);
        true
    }

    /// The reads of a key admitted in `window` that wait for the next exchange.
    pub(crate) fn waiting(&self, table: &[u8; 16], token: i64, window: u32) -> u32 {
        self.counts
            .get(&(*table, token, window))
            .copied()
            .unwrap_or(0)
    }

    /// Everything that waits, leaving nothing.
    pub(crate) fn take(&mut self) -> Vec<ReadCount> {
        let out = self
            .counts
            .drain()
            .map(|((table, token, window), count)| ReadCount {
                table,
                token,
                window,
                count,
            })
            .collect();
        debug_assert!(self.counts.is_empty());
        out
    }
}

/// What the exchange sent, received and could not share.
#[derive(Debug, Default)]
pub struct ReadCountStats {
    messages_sent: AtomicU64,
    keys_sent: AtomicU64,
    keys_received: AtomicU64,
    malformed: AtomicU64,
    dropped: AtomicU64,
}

/// A copy of [`ReadCountStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadCountSnapshot {
    /// Messages built for peers.
    pub messages_sent: u64,
    /// Key counts in them.
    pub keys_sent: u64,
    /// Key counts received and counted.
    pub keys_received: u64,
    /// Messages refused as malformed.
    pub malformed: u64,
    /// Admitted reads not shared: too many keys waited.
    pub dropped: u64,
}

impl ReadCountStats {
    pub(crate) fn sent(&self, messages: usize, keys: usize) {
        self.messages_sent
            .fetch_add(messages as u64, Ordering::Relaxed);
        self.keys_sent.fetch_add(keys as u64, Ordering::Relaxed);
    }

    pub(crate) fn received(&self, keys: usize) {
        self.keys_received.fetch_add(keys as u64, Ordering::Relaxed);
    }

    pub(crate) fn malformed(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> ReadCountSnapshot {
        ReadCountSnapshot {
            messages_sent: self.messages_sent.load(Ordering::Relaxed),
            keys_sent: self.keys_sent.load(Ordering::Relaxed),
            keys_received: self.keys_received.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(i: u32) -> ReadCount {
        ReadCount {
            table: [i as u8; 16],
            token: -(i64::from(i) << 40) - 3,
            window: 1_800_000_000 + i,
            count: i + 1,
        }
    }

    #[test]
    fn counts_round_trip_and_bodies_are_bounded() {
        let counts: Vec<ReadCount> = (0..MAX_KEYS_PER_MESSAGE as u32).map(count).collect();
        let body = encode_read_counts(&counts);
        assert_eq!(body.len(), HEADER_LEN + ENTRY_LEN * MAX_KEYS_PER_MESSAGE);
        let back: Vec<ReadCount> = decode_read_counts(&body).unwrap().collect();
        assert_eq!(back, counts);
        let one = encode_read_counts(&counts[3..4]);
        assert_eq!(
            decode_read_counts(&one).unwrap().collect::<Vec<_>>(),
            vec![count(3)]
        );
    }

    #[test]
    fn malformed_bodies_are_refused_whole() {
        let body = encode_read_counts(&[count(1), count(2)]).to_vec();
        let refused = |b: &[u8]| decode_read_counts(b).err().map(|e| e.0);
        assert!(refused(&[]).is_some());
        assert!(refused(&body[..2]).is_some());
        // Truncated, or with a byte too many.
        assert!(refused(&body[..body.len() - 1]).is_some());
        let mut longer = body.clone();
        longer.push(0);
        assert!(refused(&longer).is_some());
        let mut version = body.clone();
        version[0] = 9;
        assert!(refused(&version).is_some());
        // A key count of zero, or above the bound, whatever follows.
        let mut zero = body.clone();
        zero[1..3].copy_from_slice(&0u16.to_be_bytes());
        assert!(refused(&zero[..HEADER_LEN]).is_some());
        let n = MAX_KEYS_PER_MESSAGE + 1;
        let mut huge = vec![VERSION];
        huge.extend_from_slice(&(n as u16).to_be_bytes());
        huge.resize(HEADER_LEN + n * ENTRY_LEN, 1);
        assert!(refused(&huge).is_some());
        // A zero count in the second entry refuses the first too.
        let mut zero_count = body.clone();
        let at = HEADER_LEN + 2 * ENTRY_LEN - 4;
        zero_count[at..at + 4].copy_from_slice(&0u32.to_be_bytes());
        assert!(refused(&zero_count).is_some());
        // Any prefix of a good body is refused, never a panic.
        for len in 0..body.len() {
            assert!(refused(&body[..len]).is_some(), "prefix of {len} bytes");
        }
    }

    #[test]
    fn pending_reads_are_bounded_and_taken_once() {
        let mut p = PendingReads::default();
        for i in 0..MAX_PENDING_KEYS as i64 {
            assert!(p.add([1; 16], i, 7));
        }
        // A key already waiting still counts; a new one is not kept.
        assert!(p.add([1; 16], 0, 7));
        assert!(!p.add([1; 16], -1, 7));
        assert!(!p.add([1; 16], 0, 8));
        let taken = p.take();
        assert_eq!(taken.len(), MAX_PENDING_KEYS);
        assert_eq!(taken.iter().map(|c| u64::from(c.count)).sum::<u64>(), 4097);
        assert!(p.take().is_empty());
        assert!(p.add([1; 16], -1, 8));
    }
}
