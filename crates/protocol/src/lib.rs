//! Sluice wire protocol: CQL native protocol v4 frames, messages and compression.
//!
//! Requests are decoded zero-copy from the frame body ([`decode_request`]); responses are
//! encoded straight into the connection's write buffer ([`response`]); hot-path error
//! frames are built once and copied with the stream id patched ([`preencoded`]).

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod compression;
pub mod error;
pub mod frame;
pub mod messages;
pub mod preencoded;
pub mod request;
pub mod response;
pub mod sasl;
pub mod wire;

pub use compression::Compression;
pub use error::{DbError, DetailedError, ErrorCode, ErrorResponse, OperationType, WriteType};
pub use frame::{Frame, FrameDecoder, FrameError, FrameHeader, Opcode, HEADER_LEN};
pub use messages::*;
pub use preencoded::{PreencodedErrors, PreencodedFrame};
pub use request::{
    decode_request, peek_consistency, peek_execute_id, peek_query_text, ExecuteHead, VALUE_PREFIX,
};
pub use wire::DecodeError;
