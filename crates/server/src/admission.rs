//! [A] Admission: protects the shard, decided from the 9-byte frame header alone.
//!
//! Step 1 of issue 4, backpressure, is in `connection.rs`: per-connection and per-shard
//! in-flight caps (semaphores) stop the reader from reading the socket while over either
//! cap, so the client queues instead of the server. This module is the per-shard decision
//! point that runs after a slot was obtained and before the body is decoded; it turns a
//! request away with a pre-encodable static `Overloaded` error. Delay-based shedding
//! (CoDel) from `sluice-overload` plugs in here (issue 4); until then every request that
//! obtained an in-flight slot is admitted.

use std::time::Instant;

use sluice_protocol::frame::FrameHeader;
use sluice_protocol::{ErrorCode, ErrorResponse};

use crate::ServerConfig;

/// The `Overloaded` answer (0x1001): no body, static message.
pub const OVERLOADED: ErrorResponse =
    ErrorResponse::new(ErrorCode::Overloaded, "Server is overloaded");

/// The admission decision for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Go on: decode and execute.
    Accept,
    /// Answer this error at once; the body is never decoded.
    Reject(ErrorResponse),
}

/// Per-shard admission state (owned by the shard thread, no locks).
#[derive(Debug)]
pub struct ShardAdmission {
    admitted: u64,
}

impl ShardAdmission {
    /// State for one shard.
    pub fn new(_config: &ServerConfig) -> ShardAdmission {
        ShardAdmission { admitted: 0 }
    }

    /// Decides from the header and the arrival instant.
    pub fn admit(&mut self, header: &FrameHeader, arrival: Instant) -> Admit {
        let _ = (header, arrival);
        self.admitted += 1;
        Admit::Accept
    }

    /// Requests admitted so far on this shard.
    pub fn admitted(&self) -> u64 {
        self.admitted
    }
}
