//! Plain counters per connection class, read as a `Copy` snapshot.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::class::{ConnectionClass, CLASS_COUNT};

#[derive(Default)]
pub(crate) struct ClassCounters {
    pub(crate) frames_in: AtomicU64,
    pub(crate) bytes_in: AtomicU64,
    pub(crate) frames_out: AtomicU64,
    pub(crate) bytes_out: AtomicU64,
    pub(crate) queue_full: AtomicU64,
    pub(crate) overloaded_replies: AtomicU64,
    pub(crate) expired_outbound: AtomicU64,
    pub(crate) expired_inbound: AtomicU64,
    pub(crate) malformed_closes: AtomicU64,
}

/// The live counters of one messenger.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) classes: [ClassCounters; CLASS_COUNT],
    pub(crate) handshake_failures: AtomicU64,
}

impl Metrics {
    pub(crate) fn class(&self, class: ConnectionClass) -> &ClassCounters {
        &self.classes[class.index()]
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut classes = [ClassMetrics::default(); CLASS_COUNT];
        for (out, c) in classes.iter_mut().zip(&self.classes) {
            *out = ClassMetrics {
                frames_in: read(&c.frames_in),
                bytes_in: read(&c.bytes_in),
                frames_out: read(&c.frames_out),
                bytes_out: read(&c.bytes_out),
                queue_full: read(&c.queue_full),
                overloaded_replies: read(&c.overloaded_replies),
                expired_outbound: read(&c.expired_outbound),
                expired_inbound: read(&c.expired_inbound),
                malformed_closes: read(&c.malformed_closes),
            };
        }
        MetricsSnapshot {
            classes,
            handshake_failures: read(&self.handshake_failures),
        }
    }
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

/// Counters of one connection class, in both directions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassMetrics {
    /// Frames read from peers.
    pub frames_in: u64,
    /// Bytes read from peers, headers included.
    pub bytes_in: u64,
    /// Frames written to peers.
    pub frames_out: u64,
    /// Bytes written to peers, headers included.
    pub bytes_out: u64,
    /// Sends refused because the outbound queue was full.
    pub queue_full: u64,
    /// Inbound requests answered `Overloaded` (or one-way messages dropped) because the
    /// handler queue was full.
    pub overloaded_replies: u64,
    /// Outbound messages dropped unwritten because their deadline had passed.
    pub expired_outbound: u64,
    /// Inbound messages not run because they expired before arrival or in the handler queue.
    pub expired_inbound: u64,
    /// Connections closed because a peer sent a malformed frame.
    pub malformed_closes: u64,
}

/// A copy of every counter of a messenger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Counters per class, indexed by [`ConnectionClass::index`].
    pub classes: [ClassMetrics; CLASS_COUNT],
    /// Inbound connections closed before or during the handshake: malformed, from another
    /// cluster, or over the connection limit.
    pub handshake_failures: u64,
}

impl MetricsSnapshot {
    /// The counters of one class.
    pub fn class(&self, class: ConnectionClass) -> ClassMetrics {
        self.classes[class.index()]
    }
}
