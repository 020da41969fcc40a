//! Connection-level requests: OPTIONS, STARTUP, REGISTER, AUTH_RESPONSE and PREPARE. They
//! change or describe the connection's state rather than the data; all but PREPARE bypass
//! the admission queue and run in order in the reader, because drivers use OPTIONS as a
//! heartbeat and turning it away makes them drop the connection.

use sluice_protocol::compression::Compression;
use sluice_protocol::frame::{Frame, Opcode};
use sluice_protocol::{DbError, ErrorResponse, ResultMessage};

use super::classify::{classify, Classified, Control};
use super::{reply, Request};
use crate::connection::LoginPhase;
use crate::supported::{cql_version_acceptable, StartupOptIns};

/// STARTUP without an acceptable CQL_VERSION.
const BAD_CQL_VERSION: ErrorResponse = ErrorResponse::new(
    DbError::ProtocolError,
    "STARTUP needs a CQL_VERSION of 3.0.0 or later",
);
/// AUTH_RESPONSE while authentication is off, or not expected.
const NO_AUTH: ErrorResponse = ErrorResponse::new(
    DbError::ProtocolError,
    "Unexpected AUTH_RESPONSE: no login is in progress on this connection",
);

/// Requests that change connection state: handled in order in the reader, never queued and
/// never turned away over a cap.
#[inline]
pub fn bypasses_queue(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Options | Opcode::Startup | Opcode::Register | Opcode::AuthResponse
    )
}

/// Decodes and handles a connection-level frame in the reader.
pub fn handle_frame(request: Request, frame: Frame) {
    match classify(&request, frame, None) {
        Ok(Classified::Control(c)) => handle(request, c),
        // A statement opcode never bypasses the queue; answered like a bad frame if it did.
        Ok(Classified::Statement(_)) => reply::static_error(
            request,
            &ErrorResponse::new(DbError::ProtocolError, "not a connection-level request"),
        ),
        Err(e) => reply::error(request, &e),
    }
}

/// Handles a connection-level request and answers it.
pub fn handle(request: Request, control: Control) {
    let shard = request.shard.clone();
    let conn = request.conn.clone();
    match control {
        Control::Options => {
            let supported = &shard.supported;
            reply::control(request, |b, stream| {
                let start = b.len();
                b.extend_from_slice(supported);
                // Pre-encoded with stream 0: patch the 2 stream bytes.
                b[start + 2..start + 4].copy_from_slice(&stream.to_be_bytes());
            });
        }
        Control::Startup(options) => {
            if !cql_version_acceptable(&options) {
                return reply::static_error(request, &BAD_CQL_VERSION);
            }
            let compression = match Compression::from_startup_options(&options) {
                Ok(c) => c,
                Err(e) => {
                    let e = ErrorResponse::new(DbError::ProtocolError, e.message());
                    return reply::static_error(request, &e);
                }
            };
            conn.opt_ins.set(StartupOptIns::from_startup(&options));
            if shard.engine.auth().requires_login() && conn.login.get() != LoginPhase::Done {
                // Drivers check this class name before they send their credentials.
                conn.login.set(LoginPhase::Awaiting);
                reply::control(request, |b, stream| {
                    sluice_protocol::response::encode_authenticate(
                        b,
                        stream,
                        sluice_engine::auth::PASSWORD_AUTHENTICATOR,
                    )
                });
                conn.compression.set(compression);
                return;
            }
            conn.ready.set(true);
            // READY is empty and never compressed; compression applies from the next frame.
            reply::control(request, sluice_protocol::response::encode_ready);
            conn.compression.set(compression);
        }
        Control::AuthResponse(token) => {
            if conn.login.get() == LoginPhase::Awaiting {
                super::login::authenticate(request, token);
            } else {
                reply::static_error(request, &NO_AUTH);
            }
        }
        Control::Register(types) => {
            let registered = conn.registered.get().with(&types);
            conn.registered.set(registered);
            if registered.any() && conn.events.borrow().is_none() {
                let task = crate::events::spawn_events(&shard, &conn);
                *conn.events.borrow_mut() = Some(task);
            }
            reply::control(request, sluice_protocol::response::encode_ready);
        }
        Control::Prepare(query) => {
            // Validated by `classify`; an empty text would only fail to parse.
            let text = std::str::from_utf8(&query).unwrap_or_default();
            match conn.with_keyspace(|ks| shard.engine.prepare(ks, text)) {
                Ok(p) => {
                    let mut result = shard.engine.prepared_result(&p);
                    // ScyllaDB's LWT bit is only for connections that opted in at STARTUP.
                    if let ResultMessage::Prepared { metadata, .. } = &mut result {
                        metadata.lwt &= conn.opt_ins.get().lwt_metadata_mark;
                    }
                    reply::result(request, &result);
                }
                Err(e) => reply::error(request, &e),
            }
        }
    }
}
