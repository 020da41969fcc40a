//! Reading a held-back connection's socket ahead into its reader's buffer, so that a client
//! that does not slow down shows it even when the kernel's socket buffer is small.
//!
//! A paced connection over an in-flight cap is held back: its reader pauses. Once the
//! kernel's socket buffer is full, TCP then paces an open-loop client by the reader exactly
//! as a window paces itself, and its backlog stops growing where the backlog watch
//! (`sluice_overload::backlog`) can see it. So before each such pause the reader moves what
//! the kernel holds into its own buffer, without taking any of it as a request: a window's
//! backlog stays at its window, an open-loop client's keeps growing (and its client keeps
//! sending), and the watch sees the difference. The buffer is bounded per connection
//! ([`MAX_READ_AHEAD_PER_CONNECTION`], far more than any driver's window of requests: a
//! connection that reaches it is pushing at once) and per shard ([`ReadAheadPool`]: when it
//! is full, a connection holding far more than its share is pushing, the others stop
//! reading ahead). Frames read ahead are still the client's backlog: while the connection
//! is paced they count from when the reader takes them, not from their read
//! (`crate::socket_wait::ReadArrivals::next_arrival`), so that a window with more work than
//! a deadline is not expired for being read early. Why:
//! docs/decisions/2026-11-27-read-ahead-shows-a-client-that-pushes.md.

use std::cell::Cell;
use std::rc::Rc;

use bytes::BytesMut;

use crate::connection::ConnState;
use crate::shard::ShardCtx;

/// Most bytes one connection's reader holds unprocessed while held back. A driver's window
/// (cqlsh COPY's 512 batches of 20 rows, 256 batches of 200 rows) is a few MiB; an
/// open-loop client reaches this within tens of milliseconds at a few times the capacity.
pub const MAX_READ_AHEAD_PER_CONNECTION: usize = 16 << 20;
/// Most read-ahead bytes of all of a shard's connections together.
pub const MAX_READ_AHEAD_PER_SHARD: usize = 64 << 20;
/// Largest single read of a read-ahead.
const READ_AHEAD_STEP: usize = 1 << 20;

/// The read-ahead bytes a shard's connections hold, bounded (see the module documentation).
#[derive(Debug)]
pub struct ReadAheadPool {
    limit: usize,
    /// Bytes charged by all connections.
    total: Cell<usize>,
    /// Connections holding a charge.
    holders: Cell<usize>,
}

impl ReadAheadPool {
    /// A pool of `limit` bytes, empty.
    pub fn new(limit: usize) -> Rc<ReadAheadPool> {
        Rc::new(ReadAheadPool {
            limit,
            total: Cell::new(0),
            holders: Cell::new(0),
        })
    }

    /// Bytes charged by all connections.
    pub fn total(&self) -> usize {
        self.total.get()
    }

    /// Connections holding a charge.
    pub fn holders(&self) -> usize {
        self.holders.get()
    }
}

/// One connection's share of its shard's [`ReadAheadPool`]: given back when dropped.
#[derive(Debug)]
pub struct ReadAheadCharge {
    pool: Rc<ReadAheadPool>,
    bytes: usize,
}

impl ReadAheadCharge {
    /// A connection's charge in `pool`, nothing held.
    pub fn new(pool: Rc<ReadAheadPool>) -> ReadAheadCharge {
        ReadAheadCharge { pool, bytes: 0 }
    }

    /// Bytes this connection holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Most this connection may hold now: its own bound, or what the pool leaves it.
    pub fn allowed(&self) -> usize {
        let others = self.pool.total.get() - self.bytes;
        MAX_READ_AHEAD_PER_CONNECTION.min(self.pool.limit.saturating_sub(others))
    }

    /// Sets what this connection holds to `bytes`, at most [`Self::allowed`].
    pub fn set(&mut self, bytes: usize) {
        let total = self.pool.total.get();
        debug_assert!(total >= self.bytes, "a charge is part of its pool's total");
        debug_assert!(bytes <= self.allowed(), "a charge stays within its bounds");
        let total = total - self.bytes + bytes;
        let holders =
            self.pool.holders.get() + usize::from(bytes > 0) - usize::from(self.bytes > 0);
        self.bytes = bytes;
        self.pool.total.set(total);
        self.pool.holders.set(holders);
        debug_assert!(total <= self.pool.limit, "the pool stays within its limit");
        debug_assert!(
            holders <= total,
            "every holder holds at least a byte of the total"
        );
    }

    /// True if the pool is full and this connection holds more than twice the mean share:
    /// it, not the windows beside it, fills the pool.
    fn fills_the_pool(&self) -> bool {
        let total = self.pool.total.get();
        total >= self.pool.limit
            && self.bytes.saturating_mul(self.pool.holders.get()) > total.saturating_mul(2)
    }
}

impl Drop for ReadAheadCharge {
    fn drop(&mut self) {
        self.set(0);
        debug_assert_eq!(self.bytes, 0, "a dropped charge gives back everything");
    }
}

/// Before a paced connection's reader pauses over an in-flight cap: reads its socket ahead
/// into `buf` through `read_some` (at most the given bytes appended, 0 when the socket has
/// nothing more), up to what its charge allows, and marks the connection pushing when it
/// holds its whole bound or fills the shard's pool. Returns the bytes read. A connection
/// already pushing, or with pacing off, reads nothing ahead.
pub fn read_ahead(
    shard: &ShardCtx,
    conn: &ConnState,
    buf: &mut BytesMut,
    charge: &mut ReadAheadCharge,
    mut read_some: impl FnMut(&mut BytesMut, usize) -> usize,
) -> usize {
    if conn.pushing.get() || !shard.admission.borrow().paces_windows() {
        return 0;
    }
    let allowed = charge.allowed();
    let mut read = 0;
    while buf.len() < allowed {
        let want = (allowed - buf.len()).min(READ_AHEAD_STEP);
        buf.reserve(want);
        let n = read_some(buf, want);
        debug_assert!(n <= want, "a read-ahead reads at most what it asked for");
        if n == 0 {
            break;
        }
        read += n;
    }
    charge.set(buf.len().min(allowed));
    // The backlog is in the buffer now (the kernel's part is what did not fit): the watch
    // samples it here too, since a reader that pauses at every frame may not come back to
    // its socket read for as long as it holds a read-ahead.
    let at = shard.admission.borrow().nanos_of(shard.clock.now());
    let mut watch = conn.backlog.get();
    let mut pushing = watch.observe(at, buf.len() as u64, &shard.growing_backlogs);
    if buf.len() >= MAX_READ_AHEAD_PER_CONNECTION || charge.fills_the_pool() {
        watch.mark_pushing(at);
        pushing = true;
    }
    conn.backlog.set(watch);
    conn.pushing.set(pushing);
    read
}

/// The reader took every complete frame of its buffer: what it read ahead is processed, so
/// its charge goes back to the pool, and a buffer grown beyond `keep_capacity` for it is let
/// go. Nothing to do (no call, no allocation) for a reader that did not read ahead.
#[inline]
pub fn release(charge: &mut ReadAheadCharge, buf: &mut BytesMut, keep_capacity: usize) {
    if charge.bytes() == 0 {
        return;
    }
    charge.set(0);
    if buf.capacity() > keep_capacity {
        let mut smaller = BytesMut::with_capacity(buf.len());
        smaller.extend_from_slice(buf);
        *buf = smaller;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_are_bounded_and_every_byte_goes_back() {
        let pool = ReadAheadPool::new(3 * MAX_READ_AHEAD_PER_CONNECTION / 2);
        let mut a = ReadAheadCharge::new(pool.clone());
        let mut b = ReadAheadCharge::new(pool.clone());
        assert_eq!(a.allowed(), MAX_READ_AHEAD_PER_CONNECTION, "its own bound");
        a.set(MAX_READ_AHEAD_PER_CONNECTION);
        assert_eq!(
            b.allowed(),
            MAX_READ_AHEAD_PER_CONNECTION / 2,
            "what the pool leaves"
        );
        b.set(b.allowed());
        assert_eq!((pool.total(), pool.holders()), (pool.limit, 2));
        assert!(!b.fills_the_pool(), "a third of a full pool is its share");
        assert!(
            !a.fills_the_pool(),
            "two thirds of it is not twice the mean"
        );
        {
            let mut c = ReadAheadCharge::new(pool.clone());
            assert_eq!(c.allowed(), 0, "a full pool leaves nothing");
            c.set(0);
            assert_eq!(pool.holders(), 2, "holding nothing is not holding");
        }
        b.set(1);
        a.set(MAX_READ_AHEAD_PER_CONNECTION);
        b.set(0);
        drop(a);
        drop(b);
        assert_eq!(
            (pool.total(), pool.holders()),
            (0, 0),
            "dropped charges leak nothing"
        );
    }

    #[test]
    fn a_connection_far_above_its_share_fills_the_pool() {
        let pool = ReadAheadPool::new(100);
        let mut small: Vec<ReadAheadCharge> =
            (0..4).map(|_| ReadAheadCharge::new(pool.clone())).collect();
        for c in &mut small {
            c.set(5);
        }
        let mut big = ReadAheadCharge::new(pool.clone());
        big.set(big.allowed());
        assert_eq!((big.bytes(), pool.total()), (80, 100));
        assert!(big.fills_the_pool(), "80 of 100 among five holders");
        assert!(small.iter().all(|c| !c.fills_the_pool()));
    }

    #[test]
    fn release_gives_back_the_charge_and_the_grown_buffer() {
        let pool = ReadAheadPool::new(MAX_READ_AHEAD_PER_SHARD);
        let mut charge = ReadAheadCharge::new(pool.clone());
        let mut buf = BytesMut::with_capacity(1 << 20);
        buf.extend_from_slice(&[7u8; 10]);
        release(&mut charge, &mut buf, 64 << 10);
        assert!(
            buf.capacity() >= 1 << 20,
            "no read-ahead, the buffer is kept"
        );
        charge.set(buf.len());
        release(&mut charge, &mut buf, 64 << 10);
        assert_eq!((charge.bytes(), pool.total()), (0, 0));
        assert!(buf.capacity() < 1 << 20, "the grown buffer is let go");
        assert_eq!(&buf[..], &[7u8; 10][..], "its bytes are kept");
    }
}
