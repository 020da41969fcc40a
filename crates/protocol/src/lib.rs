//! Sluice wire protocol: CQL native protocol v4 frames, messages and compression.

pub mod error;
pub mod messages;

pub use error::{DetailedError, ErrorCode, ErrorExtra, ErrorResponse, OperationType, WriteType};
pub use messages::*;
