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
    /// BATCH_LOG: a logged batch's log write timed out (the batch may still be applied).
    BatchLog,
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
            WriteType::BatchLog => "BATCH_LOG",
        }
    }
}

/// An error as a value: each variant carries the fields its wire body needs and the wire
/// code is derived from the variant ([`DbError::code`]), so code and fields cannot disagree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbError {
    /// Server_error (0x0000): a bug or unexpected server condition.
    ServerError,
    /// Protocol_error (0x000A): malformed frame or unsupported protocol version.
    ProtocolError,
    /// Bad_credentials (0x0100): authentication failed.
    BadCredentials,
    /// Unavailable (0x1000): `<cl><required><alive>`.
    Unavailable {
        /// Consistency.
        consistency: Consistency,
        /// Required replicas.
        required: i32,
        /// Alive replicas.
        alive: i32,
    },
    /// Overloaded (0x1001).
    Overloaded,
    /// Is_bootstrapping (0x1002).
    IsBootstrapping,
    /// Truncate_error (0x1003).
    TruncateError,
    /// Write_timeout (0x1100): `<cl><received><blockfor><writeType>`.
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
    /// Read_timeout (0x1200): `<cl><received><blockfor><data_present>`.
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
    /// Read_failure (0x1300), encoded with neutral counts.
    ReadFailure,
    /// Function_failure (0x1400), encoded with empty names.
    FunctionFailure,
    /// Write_failure (0x1500), encoded with neutral counts.
    WriteFailure,
    /// Read_failure (0x1300) from a coordinator, with its counts: `<cl><received><blockfor>
    /// <numfailures><data_present>`.
    ReplicaReadFailure {
        /// Consistency.
        consistency: Consistency,
        /// Responses received.
        received: i32,
        /// Responses required.
        block_for: i32,
        /// Replicas that answered with a failure.
        failures: i32,
        /// Whether the data replica answered.
        data_present: bool,
    },
    /// Write_failure (0x1500) from a coordinator, with its counts: `<cl><received><blockfor>
    /// <numfailures><writeType>`.
    ReplicaWriteFailure {
        /// Consistency.
        consistency: Consistency,
        /// Acks received.
        received: i32,
        /// Acks required.
        block_for: i32,
        /// Replicas that answered with a failure.
        failures: i32,
        /// Write type.
        write_type: WriteType,
    },
    /// Syntax_error (0x2000).
    SyntaxError,
    /// Unauthorized (0x2100).
    Unauthorized,
    /// Invalid (0x2200).
    Invalid,
    /// Config_error (0x2300).
    ConfigError,
    /// Already_exists (0x2400): the keyspace and table names travel in [`DetailedError`].
    AlreadyExists,
    /// Unprepared (0x2500): the unknown id the client sent, up to 16 bytes.
    Unprepared {
        /// Length of `id`.
        len: u8,
        /// The id (MD5 ids are 16 bytes).
        id: [u8; 16],
    },
    /// ScyllaDB's rate-limit error (0xF000): `<op_type byte><rejected_by_coordinator byte>`.
    RateLimitReached {
        /// Read or write.
        op: OperationType,
        /// True when the coordinator rejected it before sending to replicas.
        rejected_by_coordinator: bool,
    },
}

impl DbError {
    /// The wire code of this error.
    pub const fn code(&self) -> ErrorCode {
        match self {
            DbError::ServerError => ErrorCode::ServerError,
            DbError::ProtocolError => ErrorCode::ProtocolError,
            DbError::BadCredentials => ErrorCode::BadCredentials,
            DbError::Unavailable { .. } => ErrorCode::Unavailable,
            DbError::Overloaded => ErrorCode::Overloaded,
            DbError::IsBootstrapping => ErrorCode::IsBootstrapping,
            DbError::TruncateError => ErrorCode::TruncateError,
            DbError::WriteTimeout { .. } => ErrorCode::WriteTimeout,
            DbError::ReadTimeout { .. } => ErrorCode::ReadTimeout,
            DbError::ReadFailure => ErrorCode::ReadFailure,
            DbError::FunctionFailure => ErrorCode::FunctionFailure,
            DbError::WriteFailure => ErrorCode::WriteFailure,
            DbError::ReplicaReadFailure { .. } => ErrorCode::ReadFailure,
            DbError::ReplicaWriteFailure { .. } => ErrorCode::WriteFailure,
            DbError::SyntaxError => ErrorCode::SyntaxError,
            DbError::Unauthorized => ErrorCode::Unauthorized,
            DbError::Invalid => ErrorCode::Invalid,
            DbError::ConfigError => ErrorCode::ConfigError,
            DbError::AlreadyExists => ErrorCode::AlreadyExists,
            DbError::Unprepared { .. } => ErrorCode::Unprepared,
            DbError::RateLimitReached { .. } => ErrorCode::RateLimitReached,
        }
    }

    /// The Unprepared error for `id` (echoed, up to 16 bytes).
    pub fn unprepared(id: &[u8]) -> DbError {
        let mut buf = [0u8; 16];
        let len = id.len().min(16);
        buf[..len].copy_from_slice(&id[..len]);
        DbError::Unprepared {
            len: len as u8,
            id: buf,
        }
    }

    /// The error as a client sees it: the rate-limit error goes only to clients that
    /// negotiated `SCYLLA_RATE_LIMIT_ERROR`; others get Config_error, which no default retry
    /// policy retries.
    pub const fn for_client(self, rate_limit_error_negotiated: bool) -> DbError {
        match self {
            DbError::RateLimitReached { .. } if !rate_limit_error_negotiated => {
                DbError::ConfigError
            }
            other => other,
        }
    }
}

/// An error response as a value: the error with its fields and a static message. Small and
/// `Copy`, for the hot paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorResponse {
    /// The error and its fields.
    pub error: DbError,
    /// Human-readable message.
    pub message: &'static str,
}

impl ErrorResponse {
    /// An error with a static message.
    pub const fn new(error: DbError, message: &'static str) -> ErrorResponse {
        ErrorResponse { error, message }
    }

    /// The wire code.
    pub const fn code(&self) -> ErrorCode {
        self.error.code()
    }
}

/// An error with a message built for the user, for the cold paths (syntax and semantic
/// errors, DDL) where naming the offending column or position matters more than speed.
/// The hot rejection paths use `ErrorResponse` instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetailedError {
    /// The error and its fields.
    pub error: DbError,
    /// The message.
    pub message: std::borrow::Cow<'static, str>,
    /// Already_exists: `(keyspace, table)`, table empty for a keyspace.
    pub already_exists: Option<(String, String)>,
}

impl DetailedError {
    /// An error with a message.
    pub fn new(error: DbError, message: impl Into<std::borrow::Cow<'static, str>>) -> Self {
        DetailedError {
            error,
            message: message.into(),
            already_exists: None,
        }
    }

    /// Already_exists for `keyspace` (and `table`, empty for a keyspace).
    pub fn already_exists(
        keyspace: impl Into<String>,
        table: impl Into<String>,
        message: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Self {
        DetailedError {
            error: DbError::AlreadyExists,
            message: message.into(),
            already_exists: Some((keyspace.into(), table.into())),
        }
    }

    /// The wire code.
    pub const fn code(&self) -> ErrorCode {
        self.error.code()
    }
}

impl From<ErrorResponse> for DetailedError {
    fn from(e: ErrorResponse) -> Self {
        DetailedError::new(e.error, e.message)
    }
}
