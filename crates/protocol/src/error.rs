//! Error responses (ERROR message bodies) as small `Copy` values with static messages.

use crate::messages::Consistency;

/// A native-protocol error code (v4 §9, plus ScyllaDB's rate-limit code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// 0x0000: a bug or unexpected server condition. Never used for expected conditions.
    ServerError = 0x0000,
    /// 0x000A: malformed frame or unsupported protocol version.
    ProtocolError = 0x000A,
    /// 0x0100: authentication failed.
    BadCredentials = 0x0100,
    /// 0x1000: not enough replicas alive.
    Unavailable = 0x1000,
    /// 0x1001: the node is overloaded.
    Overloaded = 0x1001,
    /// 0x1002: the node is bootstrapping.
    IsBootstrapping = 0x1002,
    /// 0x1003: truncation failed.
    TruncateError = 0x1003,
    /// 0x1100: write timed out.
    WriteTimeout = 0x1100,
    /// 0x1200: read timed out.
    ReadTimeout = 0x1200,
    /// 0x1300: read failed on replicas.
    ReadFailure = 0x1300,
    /// 0x1400: a function failed.
    FunctionFailure = 0x1400,
    /// 0x1500: write failed on replicas.
    WriteFailure = 0x1500,
    /// 0x2000: CQL syntax error.
    SyntaxError = 0x2000,
    /// 0x2100: not authorized.
    Unauthorized = 0x2100,
    /// 0x2200: invalid query.
    Invalid = 0x2200,
    /// 0x2300: configuration error (also the rate-limit error for clients that did not opt in).
    ConfigError = 0x2300,
    /// 0x2400: keyspace or table already exists.
    AlreadyExists = 0x2400,
    /// 0x2500: unknown prepared statement id.
    Unprepared = 0x2500,
    /// 0xF000: ScyllaDB's per-partition rate limit error (advertised in SUPPORTED).
    RateLimitReached = 0xF000,
}

/// Whether a rate-limited operation was a read or a write (ScyllaDB's `op_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationType {
    /// A read.
    Read = 0,
    /// A write.
    Write = 1,
}

/// The kind of write that timed out (`writeType` string of Write_timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriteType {
    /// SIMPLE: not retried by any default policy.
    Simple,
    /// BATCH (logged).
    Batch,
    /// UNLOGGED_BATCH.
    UnloggedBatch,
    /// COUNTER.
    Counter,
    /// CAS (lightweight transaction).
    Cas,
}

impl WriteType {
    /// The string sent on the wire.
    pub const fn as_str(self) -> &'static str {
        match self {
            WriteType::Simple => "SIMPLE",
            WriteType::Batch => "BATCH",
            WriteType::UnloggedBatch => "UNLOGGED_BATCH",
            WriteType::Counter => "COUNTER",
            WriteType::Cas => "CAS",
        }
    }
}

/// The code-specific part of an error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorExtra {
    /// No extra fields.
    None,
    /// Unavailable: `<cl><required><alive>`.
    Unavailable {
        /// Consistency.
        consistency: Consistency,
        /// Required replicas.
        required: i32,
        /// Alive replicas.
        alive: i32,
    },
    /// Write_timeout: `<cl><received><blockfor><writeType>`.
    WriteTimeout {
        /// Consistency.
        consistency: Consistency,
        /// Acks received.
        received: i32,
        /// Acks required.
        block_for: i32,
        /// Write type (SIMPLE so that no default policy retries).
        write_type: WriteType,
    },
    /// Read_timeout: `<cl><received><blockfor><data_present>`.
    ReadTimeout {
        /// Consistency.
        consistency: Consistency,
        /// Responses received.
        received: i32,
        /// Responses required.
        block_for: i32,
        /// Whether the data replica answered.
        data_present: bool,
    },
    /// Rate limit: `<op_type byte><rejected_by_coordinator byte>`.
    RateLimit {
        /// Read or write.
        op: OperationType,
        /// True when the coordinator rejected it before sending to replicas.
        rejected_by_coordinator: bool,
    },
    /// Unprepared: the id is written by the encoder from the request (up to 16 bytes).
    Unprepared {
        /// Length of `id`.
        len: u8,
        /// The unknown id the client sent (MD5 ids are 16 bytes).
        id: [u8; 16],
    },
}

/// An error response as a value: code, static message, extra fields. Small and `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorResponse {
    /// The code.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: &'static str,
    /// Code-specific fields.
    pub extra: ErrorExtra,
}

impl ErrorResponse {
    /// An error with no extra fields.
    pub const fn new(code: ErrorCode, message: &'static str) -> ErrorResponse {
        ErrorResponse {
            code,
            message,
            extra: ErrorExtra::None,
        }
    }
}

/// An error with a message built for the user, for the cold paths (syntax and semantic
/// errors, DDL) where naming the offending column or position matters more than speed.
/// The hot rejection paths use `ErrorResponse` instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetailedError {
    /// The code.
    pub code: ErrorCode,
    /// The message.
    pub message: std::borrow::Cow<'static, str>,
    /// Code-specific fields.
    pub extra: ErrorExtra,
    /// Already_exists: `(keyspace, table)`, table empty for a keyspace.
    pub already_exists: Option<(String, String)>,
}

impl DetailedError {
    /// An error with a message and no extra fields.
    pub fn new(code: ErrorCode, message: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        DetailedError {
            code,
            message: message.into(),
            extra: ErrorExtra::None,
            already_exists: None,
        }
    }
}

impl From<ErrorResponse> for DetailedError {
    fn from(e: ErrorResponse) -> Self {
        DetailedError {
            code: e.code,
            message: std::borrow::Cow::Borrowed(e.message),
            extra: e.extra,
            already_exists: None,
        }
    }
}
