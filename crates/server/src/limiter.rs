//! [B] Per-partition rate limiter hook (issue 3).
//!
//! Called by `request.rs` once the statement is routed (table and token known) and before
//! the execution is dispatched, on the shard that owns the partition's token when the
//! driver is shard-aware (otherwise on the receiving shard, before forwarding). The table
//! of counters from `sluice-overload` lives here, one per shard, reached with `&mut self`
//! and no lock. Tables without `per_partition_rate_limit` never touch it.

/// Per-shard limiter state (owned by the shard thread).
#[derive(Debug, Default)]
pub struct ShardLimiter {
    checked: u64,
}

/// The limiter's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitDecision {
    /// Execute.
    Accept,
}

impl ShardLimiter {
    /// An empty table.
    pub fn new() -> ShardLimiter {
        ShardLimiter::default()
    }

    /// Accounts one operation on the partition `token` and decides. No limit is configured
    /// on any table yet, so this is the no-limit fast path.
    pub fn check(&mut self, token: i64) -> LimitDecision {
        let _ = token;
        self.checked += 1;
        LimitDecision::Accept
    }

    /// Operations seen by the limiter on this shard.
    pub fn checked(&self) -> u64 {
        self.checked
    }
}
