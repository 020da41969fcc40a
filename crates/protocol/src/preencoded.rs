//! Error frames for the hot rejection paths, encoded once at start-up.
//!
//! Sending one is a `memcpy` of the template into the connection's write buffer plus a patch
//! of the two stream-id bytes (and, for timeouts, optionally the two consistency bytes): no
//! formatting, no allocation beyond the buffer's existing capacity. Templates are never
//! compressed (they are far below the compression threshold, and the flag says so), so one
//! set serves every connection.

use bytes::{Bytes, BytesMut};

use crate::compression::Compression;
use crate::error::{DbError, ErrorResponse, OperationType, WriteType};
use crate::messages::Consistency;
use crate::response::encode_error;

/// Message of the node-level overload rejection.
pub const OVERLOADED_MESSAGE: &str = "Server is overloaded";
/// Message of the deadline (timeout) rejections.
pub const DEADLINE_MESSAGE: &str = "Request deadline passed before execution";
/// Message of the rejection of a request whose owner shard has stopped.
pub const SHUTTING_DOWN_MESSAGE: &str = "Server is shutting down";
/// Message of the per-partition rate-limit rejections.
pub const RATE_LIMIT_MESSAGE: &str = "Per-partition rate limit reached";

/// Overloaded (0x1001), no body.
pub const OVERLOADED: ErrorResponse = ErrorResponse::new(DbError::Overloaded, OVERLOADED_MESSAGE);

/// Overloaded (0x1001) for a request the stopping node can no longer run.
pub const SHUTTING_DOWN: ErrorResponse =
    ErrorResponse::new(DbError::Overloaded, SHUTTING_DOWN_MESSAGE);

/// Write_timeout shaped so that no default retry policy retries it: writeType SIMPLE
/// (only BATCH_LOG is retried), received 0 of blockfor 1.
pub const WRITE_DEADLINE: ErrorResponse = ErrorResponse {
    error: DbError::WriteTimeout {
        consistency: Consistency::One,
        received: 0,
        block_for: 1,
        write_type: WriteType::Simple,
    },
    message: DEADLINE_MESSAGE,
};

/// Read_timeout shaped so that no default retry policy retries it: received 0 < blockfor 1
/// (policies retry only when enough replicas answered without the data).
pub const READ_DEADLINE: ErrorResponse = ErrorResponse {
    error: DbError::ReadTimeout {
        consistency: Consistency::One,
        received: 0,
        block_for: 1,
        data_present: false,
    },
    message: DEADLINE_MESSAGE,
};

/// ScyllaDB's rate-limit error (0xF000) for a connection that negotiated
/// `SCYLLA_RATE_LIMIT_ERROR`; otherwise Config_error (0x2300), which no default policy retries.
pub const fn rate_limit_error(op: OperationType, negotiated: bool) -> ErrorResponse {
    let error = DbError::RateLimitReached {
        op,
        rejected_by_coordinator: true,
    };
    ErrorResponse::new(error.for_client(negotiated), RATE_LIMIT_MESSAGE)
}

/// Offset of the stream id inside a frame.
const STREAM_OFFSET: usize = 2;

/// One complete ERROR frame with a placeholder stream id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreencodedFrame {
    frame: Bytes,
    /// Offset of the `[consistency]` short in the frame, for errors that carry one.
    consistency_offset: Option<usize>,
}

impl PreencodedFrame {
    /// Encodes `error` once (uncompressed, stream 0).
    pub fn new(error: &ErrorResponse) -> PreencodedFrame {
        let mut buf = BytesMut::new();
        encode_error(&mut buf, 0, error, Compression::None);
        let consistency_offset = match error.error {
            DbError::Unavailable { .. }
            | DbError::WriteTimeout { .. }
            | DbError::ReadTimeout { .. } => {
                // header + code int + message string
                Some(crate::frame::HEADER_LEN + 4 + 2 + error.message.len())
            }
            _ => None,
        };
        PreencodedFrame {
            frame: buf.freeze(),
            consistency_offset,
        }
    }

    /// The template bytes (stream id 0).
    pub fn as_bytes(&self) -> &[u8] {
        &self.frame
    }

    /// Length of the frame in bytes.
    pub fn len(&self) -> usize {
        self.frame.len()
    }

    /// Always false: a frame has at least a header.
    pub fn is_empty(&self) -> bool {
        self.frame.is_empty()
    }

    /// Appends the frame for `stream` to `buf`.
    #[inline]
    pub fn append(&self, buf: &mut BytesMut, stream: i16) -> usize {
        let start = buf.len();
        buf.extend_from_slice(&self.frame);
        buf[start + STREAM_OFFSET..start + STREAM_OFFSET + 2]
            .copy_from_slice(&stream.to_be_bytes());
        start
    }

    /// Appends the frame for `stream`, also patching the consistency level the client asked
    /// for (only for errors that carry one; otherwise the same as [`Self::append`]).
    #[inline]
    pub fn append_with_consistency(&self, buf: &mut BytesMut, stream: i16, cl: Consistency) {
        let start = self.append(buf, stream);
        if let Some(off) = self.consistency_offset {
            buf[start + off..start + off + 2].copy_from_slice(&(cl as u16).to_be_bytes());
        }
    }
}

/// Every pre-encoded hot-path error, built once per process (or per shard) at start-up.
#[derive(Debug, Clone)]
pub struct PreencodedErrors {
    /// Overloaded "Server is overloaded".
    pub overloaded: PreencodedFrame,
    /// Overloaded "Server is shutting down".
    pub shutting_down: PreencodedFrame,
    /// Write_timeout for a write whose deadline passed.
    pub write_timeout: PreencodedFrame,
    /// Read_timeout for a read whose deadline passed.
    pub read_timeout: PreencodedFrame,
    /// 0xF000 rate limit, read.
    pub rate_limit_read: PreencodedFrame,
    /// 0xF000 rate limit, write.
    pub rate_limit_write: PreencodedFrame,
    /// Config_error fallback of the read rate limit.
    pub rate_limit_read_config: PreencodedFrame,
    /// Config_error fallback of the write rate limit.
    pub rate_limit_write_config: PreencodedFrame,
}

impl Default for PreencodedErrors {
    fn default() -> Self {
        PreencodedErrors::new()
    }
}

impl PreencodedErrors {
    /// Encodes all templates.
    pub fn new() -> PreencodedErrors {
        PreencodedErrors {
            overloaded: PreencodedFrame::new(&OVERLOADED),
            shutting_down: PreencodedFrame::new(&SHUTTING_DOWN),
            write_timeout: PreencodedFrame::new(&WRITE_DEADLINE),
            read_timeout: PreencodedFrame::new(&READ_DEADLINE),
            rate_limit_read: PreencodedFrame::new(&rate_limit_error(OperationType::Read, true)),
            rate_limit_write: PreencodedFrame::new(&rate_limit_error(OperationType::Write, true)),
            rate_limit_read_config: PreencodedFrame::new(&rate_limit_error(
                OperationType::Read,
                false,
            )),
            rate_limit_write_config: PreencodedFrame::new(&rate_limit_error(
                OperationType::Write,
                false,
            )),
        }
    }

    /// The rate-limit template for `op`; `negotiated` = the connection sent
    /// `SCYLLA_RATE_LIMIT_ERROR` in STARTUP.
    pub fn rate_limit(&self, op: OperationType, negotiated: bool) -> &PreencodedFrame {
        match (op, negotiated) {
            (OperationType::Read, true) => &self.rate_limit_read,
            (OperationType::Write, true) => &self.rate_limit_write,
            (OperationType::Read, false) => &self.rate_limit_read_config,
            (OperationType::Write, false) => &self.rate_limit_write_config,
        }
    }

    /// The deadline template for a read or a write.
    pub fn timeout(&self, op: OperationType) -> &PreencodedFrame {
        match op {
            OperationType::Read => &self.read_timeout,
            OperationType::Write => &self.write_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::HEADER_LEN;
    use crate::wire::Reader;

    fn encoded(e: &ErrorResponse, stream: i16) -> BytesMut {
        let mut buf = BytesMut::new();
        encode_error(&mut buf, stream, e, Compression::None);
        buf
    }

    #[test]
    fn append_equals_a_fresh_encoding() {
        let all = PreencodedErrors::new();
        let cases = [
            (&all.overloaded, OVERLOADED),
            (&all.shutting_down, SHUTTING_DOWN),
            (&all.write_timeout, WRITE_DEADLINE),
            (&all.read_timeout, READ_DEADLINE),
            (
                &all.rate_limit_read,
                rate_limit_error(OperationType::Read, true),
            ),
            (
                &all.rate_limit_write,
                rate_limit_error(OperationType::Write, true),
            ),
            (
                &all.rate_limit_read_config,
                rate_limit_error(OperationType::Read, false),
            ),
            (
                &all.rate_limit_write_config,
                rate_limit_error(OperationType::Write, false),
            ),
        ];
        for (t, e) in cases {
            for stream in [0i16, 1, 255, 256, 32767, -5] {
                let mut buf = BytesMut::from(&b"xy"[..]);
                t.append(&mut buf, stream);
                assert_eq!(&buf[..2], b"xy");
                assert_eq!(&buf[2..], &encoded(&e, stream)[..], "{e:?} {stream}");
            }
        }
    }

    #[test]
    fn bodies_are_shaped_to_avoid_retries() {
        let all = PreencodedErrors::new();
        let wt = all.timeout(OperationType::Write).as_bytes();
        let body = Bytes::copy_from_slice(&wt[HEADER_LEN..]);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x1100);
        assert_eq!(r.read_string().unwrap(), DEADLINE_MESSAGE);
        assert_eq!(r.read_consistency().unwrap(), Consistency::One);
        assert_eq!((r.read_int().unwrap(), r.read_int().unwrap()), (0, 1));
        assert_eq!(r.read_string().unwrap(), "SIMPLE");

        let rt = all.timeout(OperationType::Read).as_bytes();
        let body = Bytes::copy_from_slice(&rt[HEADER_LEN..]);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x1200);
        r.read_string().unwrap();
        r.read_consistency().unwrap();
        assert_eq!((r.read_int().unwrap(), r.read_int().unwrap()), (0, 1));
        assert_eq!(r.read_u8().unwrap(), 0);
        assert_eq!(r.remaining(), 0);

        let rl = all.rate_limit(OperationType::Write, true).as_bytes();
        assert_eq!(&rl[HEADER_LEN..HEADER_LEN + 4], &[0, 0, 0xF0, 0]);
        assert_eq!(&rl[rl.len() - 2..], &[1, 1]);
        let cfg = all.rate_limit(OperationType::Read, false).as_bytes();
        assert_eq!(&cfg[HEADER_LEN..HEADER_LEN + 4], &[0, 0, 0x23, 0]);
        assert_eq!(cfg.len(), HEADER_LEN + 4 + 2 + RATE_LIMIT_MESSAGE.len());
    }

    #[test]
    fn consistency_patch_matches_a_fresh_encoding() {
        let all = PreencodedErrors::new();
        let mut buf = BytesMut::new();
        all.write_timeout
            .append_with_consistency(&mut buf, 77, Consistency::LocalQuorum);
        let mut e = WRITE_DEADLINE;
        e.error = DbError::WriteTimeout {
            consistency: Consistency::LocalQuorum,
            received: 0,
            block_for: 1,
            write_type: WriteType::Simple,
        };
        assert_eq!(&buf[..], &encoded(&e, 77)[..]);
        // No consistency in an Overloaded body: the patch is a no-op.
        let mut buf = BytesMut::new();
        all.overloaded
            .append_with_consistency(&mut buf, 3, Consistency::All);
        assert_eq!(&buf[..], &encoded(&OVERLOADED, 3)[..]);
    }

    #[test]
    fn append_does_not_reallocate_with_enough_capacity() {
        let all = PreencodedErrors::new();
        let mut buf = BytesMut::with_capacity(4096);
        let ptr = buf.as_ptr();
        let cap = buf.capacity();
        for s in 0..20 {
            all.overloaded.append(&mut buf, s);
        }
        assert_eq!(buf.as_ptr(), ptr);
        assert_eq!(buf.capacity(), cap);
        assert_eq!(buf.len(), 20 * all.overloaded.len());
    }
}
