//! Overload control with no I/O: deadlines, per-partition rate limiter, admission controller.
//!
//! Every type here takes the current time as an argument (see [`clock`]) and performs no I/O,
//! so the server wires them into its request path and the simulations in [`sim`] drive the
//! very same code with a fake clock.

pub mod admission;
pub mod clock;
pub mod deadline;
pub mod rate_limit;
pub mod sim;

pub use admission::{
    AdmissionConfig, AdmissionController, AdmissionStats, Backpressure, Codel, CodelConfig,
    ConcurrencyLimit, ConcurrencyLimitConfig, ConnBudget, InflightBudget, InflightCaps, Queued,
    Verdict,
};
pub use clock::{Clock, FakeClock, Nanos, SystemClock};
pub use deadline::{deadline_for, Deadline, DeadlineDefaults, RequestKind};
pub use rate_limit::{
    ColdStart, Decision, LimitKey, LimiterStats, OpType, RateLimiter, RateLimiterConfig,
    TableLimitSnapshot, TableLimitStats,
};
