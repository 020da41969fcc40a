//! Overload control with no I/O: deadlines, per-partition rate limiter, admission controller.
//!
//! Every type here takes the current time as an argument (see [`clock`]) and performs no I/O,
//! so the server wires them into its request path and the simulations in [`sim`] drive the
//! very same code with a fake clock.
//!
//! How a shard uses them, in request-path order:
//!
//! ```
//! use sluice_overload::*;
//! use std::time::Duration;
//!
//! let clock = SystemClock::new();
//! let deadlines = DeadlineDefaults::default();
//! let mut admission = AdmissionController::<u16>::new(AdmissionConfig::default());
//! let mut limiter = RateLimiter::new(RateLimiterConfig::default());
//! let table_stats = TableLimitStats::default();
//!
//! // Frame header read (stream id 7): deadline, queue.
//! let arrival = clock.now();
//! let deadline = deadlines.deadline_for(RequestKind::Write, Some(Duration::from_millis(10)), arrival);
//! admission.enqueue(7, arrival, deadline).expect("full: answer Overloaded from the header");
//!
//! // Worker: take the next request; shed and expired ones are answered without decoding.
//! let q = admission
//!     .dispatch(clock.now(), |_stream, _verdict| { /* Overloaded or timeout frame */ })
//!     .expect("queued above");
//! // Decoded: the partition's token is known; tables without a limit pass `None`.
//! let key = LimitKey { token: -42, table: 3, op: OpType::Write };
//! let random = 0x1234_5678; // drawn once per operation by the coordinator
//! let d = limiter.check(key, Some(100), random, clock.wall(), &table_stats);
//! assert_eq!(d, Decision::Accept);
//! // ... execute, answer, then:
//! admission.on_complete(clock.now().saturating_duration_since(arrival), clock.now());
//! # let _ = q;
//! ```

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admission;
pub mod backlog;
pub mod clock;
pub mod deadline;
pub mod rate_limit;
pub mod replicated_rate;
pub mod sim;
pub mod txn_limit;

pub use admission::{
    AdmissionConfig, AdmissionController, AdmissionStats, Arrival, Codel, CodelConfig,
    ConcurrencyLimit, ConcurrencyLimitConfig, Queued, Verdict,
};
pub use backlog::{BacklogConfig, BacklogWatch, GrowingBacklogs};
pub use clock::{Clock, FakeClock, Nanos, SystemClock};
pub use deadline::{Deadline, DeadlineDefaults, RequestKind};
pub use rate_limit::{
    Acceptance, ColdStart, Decision, LimitKey, LimiterStats, OpType, RateLimiter,
    RateLimiterConfig, TableLimitSnapshot, TableLimitStats,
};
pub use replicated_rate::{clamp_window, window_of, ReplicatedCounts};
pub use txn_limit::{
    TxnAdmit, TxnLimitConfig, TxnLimitStats, TxnLimiter, TxnReject, TxnWaitTicket,
};
