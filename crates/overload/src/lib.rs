//! Overload control with no I/O: deadlines, per-partition rate limiter, admission controller.
