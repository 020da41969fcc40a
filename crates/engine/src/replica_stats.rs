//! What this node's replica service did for other coordinators: requests served and refused,
//! per verb and per reason, for `GET /metrics`. The cluster crate's service counts; the
//! server renders.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// The verbs a replica serves, in the order their counters are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServedVerb {
    /// MUTATION (also replayed hints).
    Mutation,
    /// READ (digest or raw partition).
    Read,
    /// REPAIR (a read repair's merged partition).
    Repair,
    /// SELECT forwarded by a coordinator that is not a replica.
    Select,
    /// SCAN of a token range.
    Scan,
    /// TRUNCATE of a table.
    Truncate,
}

impl ServedVerb {
    /// Every verb, in counter order.
    pub const ALL: [ServedVerb; 6] = [
        ServedVerb::Mutation,
        ServedVerb::Read,
        ServedVerb::Repair,
        ServedVerb::Select,
        ServedVerb::Scan,
        ServedVerb::Truncate,
    ];

    /// The verb's label in metrics.
    pub const fn label(self) -> &'static str {
        match self {
            ServedVerb::Mutation => "mutation",
            ServedVerb::Read => "read",
            ServedVerb::Repair => "repair",
            ServedVerb::Select => "select",
            ServedVerb::Scan => "scan",
            ServedVerb::Truncate => "truncate",
        }
    }
}

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

const VERBS: usize = ServedVerb::ALL.len();
const REASONS: usize = RefusalReason::ALL.len();

/// Served and refused replica requests, per verb (and reason).
#[derive(Debug, Default)]
pub struct ReplicaStats {
    served: [AtomicU64; VERBS],
    refused: [[AtomicU64; REASONS]; VERBS],
}

impl ReplicaStats {
    /// Counts a request admitted and run.
    pub fn count_served(&self, verb: ServedVerb) {
        self.served[verb as usize].fetch_add(1, Relaxed);
    }

    /// Counts a request turned away or failed.
    pub fn count_refused(&self, verb: ServedVerb, reason: RefusalReason) {
        self.refused[verb as usize][reason as usize].fetch_add(1, Relaxed);
    }

    /// Requests of `verb` admitted and run.
    pub fn served(&self, verb: ServedVerb) -> u64 {
        self.served[verb as usize].load(Relaxed)
    }

    /// Requests of `verb` refused for `reason`.
    pub fn refused(&self, verb: ServedVerb, reason: RefusalReason) -> u64 {
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
        s.count_served(ServedVerb::Select);
        s.count_served(ServedVerb::Select);
        s.count_refused(ServedVerb::Scan, RefusalReason::Budget);
        s.count_refused(ServedVerb::Mutation, RefusalReason::Failed);
        assert_eq!(s.served(ServedVerb::Select), 2);
        assert_eq!(s.served(ServedVerb::Scan), 0);
        assert_eq!(s.refused(ServedVerb::Scan, RefusalReason::Budget), 1);
        assert_eq!(s.refused(ServedVerb::Scan, RefusalReason::Expired), 0);
        assert_eq!(s.refused(ServedVerb::Mutation, RefusalReason::Failed), 1);
        assert_eq!(s.refused_total(), 2);
    }
}
