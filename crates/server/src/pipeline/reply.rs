//! Every answer of the request path is encoded here: results, errors, and rejections, which
//! are pre-encoded frames with only the stream id patched (no allocation, no formatting).
//! Each answer counts its metrics exactly once and tells admission whether the request's
//! release is a latency sample for the concurrency limit: only requests that ran are.

use std::sync::atomic::Ordering::Relaxed;

use sluice_overload::{OpType, RequestKind};
use sluice_protocol::frame::FrameError;
use sluice_protocol::{DbError, DetailedError, ErrorCode, ErrorResponse, ResultMessage};

use sluice_engine::auth::Permission;

use super::classify::UnknownId;
use super::execute::Failure;
use super::Request;
use crate::connection::ConnState;
use crate::limiter::protocol_op;
use crate::shard::ShardCtx;

/// Why a request was turned away without running. Small and `Copy`; each variant is
/// answered with its own pre-encoded frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Admission shed it (queue full, standing delay, over a cap while overloaded).
    Overloaded,
    /// Its deadline passed before it ran: a timeout no default retry policy retries.
    Expired(RequestKind),
    /// The per-partition rate limiter rejected this operation.
    RateLimited(OpType),
    /// EXECUTE of an id the statement cache does not hold.
    Unprepared(UnknownId),
    /// The shard that owns its partition has stopped (the node is shutting down).
    ShuttingDown,
    /// Its client disconnected: nothing is answered.
    ClientGone,
    /// The logged-in role lacks this permission; the message naming the role and the
    /// resource waits in the connection's `denial` (shared, never formatted here).
    Unauthorized(Permission),
}

/// The answer to a request whose result was lost to a bug (a panic in the request path).
const INTERNAL: ErrorResponse = ErrorResponse::new(
    DbError::ServerError,
    "internal error while serving the request",
);

/// Answers a result.
pub fn result(mut request: Request, result: &ResultMessage) {
    let stream = request.stream;
    let compression = request.conn.compression.get();
    request.shard.metrics.served.fetch_add(1, Relaxed);
    request
        .conn
        .outbox
        .push(|b| sluice_protocol::response::encode_result(b, stream, result, compression));
    request.answered = true;
}

/// Answers a connection-level request with a frame `encode` writes (READY, SUPPORTED...).
pub fn control(mut request: Request, encode: impl FnOnce(&mut bytes::BytesMut, i16)) {
    let stream = request.stream;
    request.shard.metrics.served.fetch_add(1, Relaxed);
    request.conn.outbox.push(|b| encode(b, stream));
    request.answered = true;
}

/// Answers why an execution produced no result.
pub fn failure(request: Request, failure: Failure) {
    match failure {
        Failure::Rejected(r) => reject(request, r),
        Failure::Error(e) => error(request, &e),
    }
}

/// Answers an error found before the request ran (it could not be decoded or analysed): like
/// [`error`], but its release is no latency sample.
pub fn refuse(request: Request, e: &DetailedError) {
    request.admitted.turned_away();
    error(request, e);
}

/// Answers an error with a message built for the user.
pub fn error(mut request: Request, e: &DetailedError) {
    let metrics = &request.shard.metrics;
    match e.error {
        DbError::RateLimitReached { op, .. } => {
            let op = match op {
                sluice_protocol::OperationType::Read => OpType::Read,
                sluice_protocol::OperationType::Write => OpType::Write,
            };
            return reject(request, Rejection::RateLimited(op));
        }
        DbError::WriteTimeout { .. } | DbError::ReadTimeout { .. } => {
            metrics.timed_out.fetch_add(1, Relaxed);
        }
        _ => {}
    }
    metrics.count_error(e.code() as u32);
    let stream = request.stream;
    let compression = request.conn.compression.get();
    request
        .conn
        .outbox
        .push(|b| sluice_protocol::response::encode_detailed_error(b, stream, e, compression));
    request.answered = true;
}

/// Answers a static error (control requests).
pub fn static_error(mut request: Request, e: &ErrorResponse) {
    encode_static(&request.shard, &request.conn, request.stream, e);
    request.answered = true;
}

/// Answers a rejection with its pre-encoded frame (or nothing, for a gone client). The
/// request did not run, so its release is no latency sample.
pub fn reject(mut request: Request, rejection: Rejection) {
    request.admitted.turned_away();
    request.answered = true;
    let shard = &request.shard;
    let metrics = &shard.metrics;
    let frames = &shard.frames;
    let stream = request.stream;
    let outbox = &request.conn.outbox;
    match rejection {
        Rejection::Overloaded => {
            metrics.count_overloaded_error();
            outbox.push(|b| {
                frames.overloaded.append(b, stream);
            });
        }
        Rejection::Expired(kind) => {
            metrics.expired_before_execution.fetch_add(1, Relaxed);
            let frame = if kind == RequestKind::Write {
                metrics.count_error_code::<{ ErrorCode::WriteTimeout as u32 }>();
                &frames.write_timeout
            } else {
                metrics.count_error_code::<{ ErrorCode::ReadTimeout as u32 }>();
                &frames.read_timeout
            };
            outbox.push(|b| {
                frame.append(b, stream);
            });
        }
        Rejection::RateLimited(op) => {
            let negotiated = request.conn.opt_ins.get().rate_limit_error;
            debug_assert_eq!(
                DbError::RateLimitReached {
                    op: protocol_op(op),
                    rejected_by_coordinator: true,
                }
                .for_client(negotiated)
                .code(),
                if negotiated {
                    ErrorCode::RateLimitReached
                } else {
                    ErrorCode::ConfigError
                },
                "the code counted is the code answered"
            );
            if negotiated {
                metrics.count_error_code::<{ ErrorCode::RateLimitReached as u32 }>();
            } else {
                metrics.count_error_code::<{ ErrorCode::ConfigError as u32 }>();
            }
            metrics.rejected_rate_limited.fetch_add(1, Relaxed);
            let frame = frames.rate_limit(protocol_op(op), negotiated);
            outbox.push(|b| {
                frame.append(b, stream);
            });
        }
        Rejection::Unprepared(UnknownId { len, id }) => {
            let e = ErrorResponse::new(
                DbError::Unprepared { len, id },
                sluice_protocol::response::UNPREPARED_MESSAGE,
            );
            encode_static(shard, &request.conn, stream, &e);
        }
        Rejection::ShuttingDown => {
            metrics.count_overloaded_error();
            outbox.push(|b| {
                frames.shutting_down.append(b, stream);
            });
        }
        Rejection::ClientGone => {
            metrics.abandoned.fetch_add(1, Relaxed);
        }
        Rejection::Unauthorized(_) => {
            metrics.count_error(ErrorCode::Unauthorized as u32);
            let compression = request.conn.compression.get();
            let denial = request.conn.denial.borrow_mut().take();
            outbox.push(|b| match &denial {
                Some(u) => u.encode(b, stream, compression),
                None => sluice_protocol::response::encode_error(
                    b,
                    stream,
                    &sluice_engine::auth::Unauthorized::GENERIC,
                    compression,
                ),
            });
        }
    }
}

/// Answers a frame turned away from its header, before it became a [`Request`].
#[inline]
pub fn overloaded_from_header(shard: &ShardCtx, conn: &ConnState, stream: i16) {
    shard.metrics.count_overloaded_error();
    let frames = &shard.frames;
    conn.outbox.push(|b| {
        frames.overloaded.append(b, stream);
    });
}

/// A malformed or unsupported frame: answers ProtocolError (or the §1.1 unsupported-version
/// reply) on its stream, then closes this connection only.
pub fn protocol_close(shard: &ShardCtx, conn: &ConnState, e: FrameError) {
    shard.metrics.count_error(ErrorCode::ProtocolError as u32);
    shard.metrics.protocol_closes.fetch_add(1, Relaxed);
    conn.outbox.push(|b| e.encode_reply(b));
    conn.outbox.close();
}

/// Answers a request dropped unanswered (see [`Request`]'s drop).
pub(crate) fn internal_error(shard: &ShardCtx, conn: &ConnState, stream: i16) {
    encode_static(shard, conn, stream, &INTERNAL);
}

/// Encodes a static error (no allocation beyond the outbox's capacity) and counts it.
fn encode_static(shard: &ShardCtx, conn: &ConnState, stream: i16, e: &ErrorResponse) {
    shard.metrics.count_error(e.code() as u32);
    let compression = conn.compression.get();
    conn.outbox
        .push(|b| sluice_protocol::response::encode_error(b, stream, e, compression));
}
