//! What this node's replica service did for other coordinators: requests served and refused,
//! per verb and per reason, for `GET /metrics`. The cluster crate's service counts; the
//! server renders.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

pub use crate::coordinator::ReplicaVerb;

impl ReplicaVerb {
    /// Every verb, in counter order (the declaration order, so `verb as usize` indexes).
    pub const ALL: [ReplicaVerb; 7] = [
        ReplicaVerb::Mutation,
        ReplicaVerb::Read,
        ReplicaVerb::Repair,
        ReplicaVerb::Truncate,
        ReplicaVerb::Select,
        ReplicaVerb::Scan,
        ReplicaVerb::Slice,
    ];

    /// The verb's label in metrics.
    pub const fn label(self) -> &'static str {
        match self {
            ReplicaVerb::Mutation => "mutation",
            ReplicaVerb::Read => "read",
            ReplicaVerb::Repair => "repair",
            ReplicaVerb::Truncate => "truncate",
            ReplicaVerb::Select => "select",
            ReplicaVerb::Scan => "scan",
            ReplicaVerb::Slice => "slice",
        }
    }
}

// Counters are indexed by `verb as usize`: `ALL` must list the verbs in declaration order.
const _: () = {
    let mut i = 0;
    while i < ReplicaVerb::ALL.len() {
        assert!(ReplicaVerb::ALL[i] as usize == i);
        i += 1;
    }
};

/// Why a replica request was not run to an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalReason {
    /// Admission: the cap of requests in flight was reached.
    InFlightCap,
    /// Admission: the remaining budget was shorter than the verb's recent service time.
    Budget,
    /// The deadline had passed (at arrival or before storage).
    Expired,
    /// Admitted, then failed: a malformed body, an unknown table, a storage error.
    Failed,
}

impl RefusalReason {
    /// Every reason, in counter order.
    pub const ALL: [RefusalReason; 4] = [
        RefusalReason::InFlightCap,
        RefusalReason::Budget,
        RefusalReason::Expired,
        RefusalReason::Failed,
    ];

    /// The reason's label in metrics.
    pub const fn label(self) -> &'static str {
        match self {
            RefusalReason::InFlightCap => "in_flight_cap",
            RefusalReason::Budget => "budget",
            RefusalReason::Expired => "expired",
            RefusalReason::Failed => "failed",
        }
    }
}

const VERBS: usize = ReplicaVerb::ALL.len();
const REASONS: usize = RefusalReason::ALL.len();

/// Served and refused replica requests, per verb (and reason).
#[derive(Debug, Default)]
pub struct ReplicaStats {
    served: [AtomicU64; VERBS],
    refused: [[AtomicU64; REASONS]; VERBS],
}

impl ReplicaStats {
    /// Counts a request admitted and run.
    pub fn count_served(&self, verb: ReplicaVerb) {
        self.served[verb as usize].fetch_add(1, Relaxed);
    }

    /// Counts a request turned away or failed.
    pub fn count_refused(&self, verb: ReplicaVerb, reason: RefusalReason) {
        self.refused[verb as usize][reason as usize].fetch_add(1, Relaxed);
    }

    /// Requests of `verb` admitted and run.
    pub fn served(&self, verb: ReplicaVerb) -> u64 {
        self.served[verb as usize].load(Relaxed)
    }

    /// Requests of `verb` refused for `reason`.
    pub fn refused(&self, verb: ReplicaVerb, reason: RefusalReason) -> u64 {
        self.refused[verb as usize][reason as usize].load(Relaxed)
    }

    /// Requests of any verb refused for any reason.
    pub fn refused_total(&self) -> u64 {
        self.refused
            .iter()
            .flat_map(|r| r.iter())
            .map(|c| c.load(Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_kept_per_verb_and_reason() {
        let s = ReplicaStats::default();
        s.count_served(ReplicaVerb::Select);
        s.count_served(ReplicaVerb::Select);
        s.count_refused(ReplicaVerb::Scan, RefusalReason::Budget);
        s.count_refused(ReplicaVerb::Mutation, RefusalReason::Failed);
        assert_eq!(s.served(ReplicaVerb::Select), 2);
        assert_eq!(s.served(ReplicaVerb::Scan), 0);
        assert_eq!(s.refused(ReplicaVerb::Scan, RefusalReason::Budget), 1);
        assert_eq!(s.refused(ReplicaVerb::Scan, RefusalReason::Expired), 0);
        assert_eq!(s.refused(ReplicaVerb::Mutation, RefusalReason::Failed), 1);
        assert_eq!(s.refused_total(), 2);
    }
}
