//! Absolute request deadlines and the per-kind server defaults.
//!
//! A request's deadline is fixed once, when its frame header is read: `USING TIMEOUT` if the
//! statement has one, otherwise the server default for its kind. There is no other timeout in
//! the request path; every queue compares against this one instant.

use crate::clock::Nanos;
use std::time::Duration;

/// The class of a request, which selects its default timeout.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum RequestKind {
    /// Single-partition reads.
    Read,
    /// Writes (INSERT, UPDATE, DELETE, BATCH).
    Write,
    /// Range scans and multi-partition reads without a partition key restriction.
    Range,
    /// Everything else (schema changes, USE, OPTIONS, ...).
    Other,
}

/// Server-side default timeouts per request kind (Cassandra's and ScyllaDB's defaults).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct DeadlineDefaults {
    /// Default for [`RequestKind::Read`]: 5 s.
    pub read: Duration,
    /// Default for [`RequestKind::Write`]: 2 s.
    pub write: Duration,
    /// Default for [`RequestKind::Range`]: 10 s.
    pub range: Duration,
    /// Default for [`RequestKind::Other`]: 10 s.
    pub other: Duration,
}

impl Default for DeadlineDefaults {
    fn default() -> Self {
        DeadlineDefaults {
            read: Duration::from_secs(5),
            write: Duration::from_secs(2),
            range: Duration::from_secs(10),
            other: Duration::from_secs(10),
        }
    }
}

impl DeadlineDefaults {
    /// The default timeout for `kind`.
    pub fn for_kind(&self, kind: RequestKind) -> Duration {
        match kind {
            RequestKind::Read => self.read,
            RequestKind::Write => self.write,
            RequestKind::Range => self.range,
            RequestKind::Other => self.other,
        }
    }

    /// The timeout of a request of `kind`: `USING TIMEOUT` wins over the default
    /// (ScyllaDB's precedence). `Some(0)` is allowed and expires at once.
    pub fn timeout_for(&self, kind: RequestKind, using_timeout: Option<Duration>) -> Duration {
        using_timeout.unwrap_or_else(|| self.for_kind(kind))
    }

    /// The deadline of a request of `kind` that arrived at `arrival` (see
    /// [`DeadlineDefaults::timeout_for`]).
    pub fn deadline_for(
        &self,
        kind: RequestKind,
        using_timeout: Option<Duration>,
        arrival: Nanos,
    ) -> Deadline {
        Deadline(arrival.saturating_add(self.timeout_for(kind, using_timeout)))
    }
}

/// An absolute instant (on the monotonic clock) after which nobody waits for the answer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline(pub Nanos);

impl Deadline {
    /// A deadline that never expires (internal work only; client requests always have one).
    pub const NEVER: Deadline = Deadline(Nanos::MAX);

    /// The absolute instant.
    pub fn at(self) -> Nanos {
        self.0
    }

    /// True once `now` has reached the deadline: the work must not start.
    pub fn expired(self, now: Nanos) -> bool {
        now >= self.0
    }

    /// Time left before the deadline, zero if it has passed.
    pub fn remaining(self, now: Nanos) -> Duration {
        self.0.saturating_duration_since(now)
    }

    /// True if work expected to take `cost` cannot finish in time; lets a queue drop a request
    /// that would only be served late, before spending anything on it.
    pub fn cannot_meet(self, now: Nanos, cost: Duration) -> bool {
        now.saturating_add(cost) > self.0
    }

    /// The earlier of two deadlines (e.g. the client's and a replica hop's).
    pub fn min(self, other: Deadline) -> Deadline {
        if other.0 < self.0 {
            other
        } else {
            self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline_for(kind: RequestKind, using: Option<Duration>, arrival: Nanos) -> Deadline {
        DeadlineDefaults::default().deadline_for(kind, using, arrival)
    }

    #[test]
    fn defaults_per_kind() {
        let t0 = Nanos::from_secs(100);
        let d = deadline_for(RequestKind::Read, None, t0);
        assert_eq!(d.at(), Nanos::from_secs(105));
        assert_eq!(
            deadline_for(RequestKind::Write, None, t0).at(),
            Nanos::from_secs(102)
        );
        assert_eq!(
            deadline_for(RequestKind::Range, None, t0).at(),
            Nanos::from_secs(110)
        );
        assert_eq!(
            deadline_for(RequestKind::Other, None, t0).at(),
            Nanos::from_secs(110)
        );
    }

    #[test]
    fn using_timeout_overrides_default() {
        let t0 = Nanos::from_secs(100);
        let d = deadline_for(RequestKind::Read, Some(Duration::from_millis(10)), t0);
        assert_eq!(d.at(), Nanos::from_millis(100_010));
        assert!(!d.expired(Nanos::from_millis(100_009)));
        assert!(d.expired(Nanos::from_millis(100_010)));
        assert_eq!(
            d.remaining(Nanos::from_millis(100_004)),
            Duration::from_millis(6)
        );
        assert_eq!(d.remaining(Nanos::from_secs(200)), Duration::ZERO);
        let zero = deadline_for(RequestKind::Write, Some(Duration::ZERO), t0);
        assert!(zero.expired(t0), "USING TIMEOUT 0s expires immediately");
    }

    #[test]
    fn configurable_defaults_and_helpers() {
        let cfg = DeadlineDefaults {
            write: Duration::from_millis(50),
            ..DeadlineDefaults::default()
        };
        let d = cfg.deadline_for(RequestKind::Write, None, Nanos::ZERO);
        assert_eq!(d.at(), Nanos::from_millis(50));
        assert!(d.cannot_meet(Nanos::from_millis(45), Duration::from_millis(6)));
        assert!(!d.cannot_meet(Nanos::from_millis(45), Duration::from_millis(5)));
        assert_eq!(d.min(Deadline::NEVER), d);
        assert_eq!(Deadline::NEVER.min(d), d);
        assert!(!Deadline::NEVER.expired(Nanos(u64::MAX - 1)));
        let huge = cfg.deadline_for(RequestKind::Read, Some(Duration::MAX), Nanos::from_secs(1));
        assert_eq!(huge, Deadline::NEVER, "saturates instead of overflowing");
    }
}
