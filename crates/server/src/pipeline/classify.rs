//! Classification: the body is decoded once, into either a connection-level [`Control`]
//! request or one [`Statement`] shape shared by QUERY, EXECUTE and BATCH.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use sluice_engine::Prepared;
use sluice_overload::RequestKind;
use sluice_protocol::frame::{Frame, Opcode};
use sluice_protocol::{
    BatchQuery, BatchRequest, BoundValues, DbError, DetailedError, ErrorResponse, EventType,
    QueryParameters,
};

use super::check::Subject;
use super::Request;
use crate::connection::LoginPhase;
use crate::shard::ShardCtx;

/// Any request but OPTIONS and STARTUP before STARTUP.
const NOT_READY: ErrorResponse = ErrorResponse::new(
    DbError::ProtocolError,
    "Unexpected message, expecting STARTUP or OPTIONS",
);
/// A request other than OPTIONS, STARTUP or AUTH_RESPONSE before login.
const NOT_AUTHENTICATED: ErrorResponse = ErrorResponse::new(
    DbError::ProtocolError,
    "Unexpected message, expecting AUTH_RESPONSE: log in first",
);
/// QUERY or PREPARE text that is not UTF-8.
const NOT_UTF8: ErrorResponse = ErrorResponse::new(DbError::ProtocolError, "query is not UTF-8");

/// What a frame asks for.
pub enum Classified {
    /// Connection-level: handled in `control.rs`.
    Control(Control),
    /// A statement to check, execute and answer.
    Statement(Statement),
}

/// A connection-level request.
pub enum Control {
    /// OPTIONS: answer SUPPORTED.
    Options,
    /// STARTUP with its options.
    Startup(Vec<(String, String)>),
    /// REGISTER for these events.
    Register(Vec<EventType>),
    /// AUTH_RESPONSE with its SASL token.
    AuthResponse(Option<Bytes>),
    /// PREPARE this CQL text (validated UTF-8).
    Prepare(Bytes),
}

/// The id of an EXECUTE whose statement is not in the cache (echoed, up to 16 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownId {
    /// Length of `id`.
    pub len: u8,
    /// The id.
    pub id: [u8; 16],
}

impl UnknownId {
    /// The id of `id` (truncated to 16 bytes).
    pub fn new(id: &[u8]) -> UnknownId {
        let len = id.len().min(16);
        let mut buf = [0u8; 16];
        buf[..len].copy_from_slice(&id[..len]);
        UnknownId {
            len: len as u8,
            id: buf,
        }
    }
}

/// QUERY, EXECUTE and BATCH, decoded.
pub enum Statement {
    /// One statement: a QUERY (through the statement cache) or an EXECUTE.
    Single {
        /// The analysed statement.
        prepared: Arc<Prepared>,
        /// Its parameters.
        params: QueryParameters,
        /// Its `USING TIMEOUT`, bound (unused once the reader checked it).
        using_timeout: Option<Duration>,
    },
    /// An EXECUTE of an id the statement cache does not hold.
    Unknown(UnknownId),
    /// A BATCH.
    Batch {
        /// The batch as decoded.
        batch: BatchRequest,
        /// The smallest `USING TIMEOUT` among its statements.
        using_timeout: Option<Duration>,
    },
}

impl Statement {
    /// What [`super::check::check`] needs to know about it.
    pub fn subject(&self) -> Subject<'_> {
        match self {
            Statement::Single {
                prepared,
                params,
                using_timeout,
            } => Subject::Single {
                prepared,
                values: &params.values[..],
                using_timeout: *using_timeout,
            },
            Statement::Unknown(id) => Subject::Unknown(*id),
            Statement::Batch {
                batch,
                using_timeout,
            } => Subject::Batch {
                batch,
                using_timeout: *using_timeout,
            },
        }
    }
}

/// The kind of a request known only by its opcode (turned away before its body was read):
/// BATCH is a write; anything else answers a read timeout, which no default retry policy
/// retries either.
pub fn kind_of_opcode(opcode: Opcode) -> RequestKind {
    if opcode == Opcode::Batch {
        RequestKind::Write
    } else {
        RequestKind::Read
    }
}

/// A statement's `USING TIMEOUT`, bound from its positional `values`.
pub fn using_timeout<V: BoundValues + ?Sized>(
    shard: &ShardCtx,
    prepared: &Prepared,
    values: &V,
) -> Result<Option<Duration>, DetailedError> {
    shard.engine.timeout(prepared, values)
}

/// Decompresses and decodes `frame`. `known`: the statement of an EXECUTE the reader already
/// checked, so it is neither looked up nor bound again.
pub fn classify(
    request: &Request,
    frame: Frame,
    known: Option<Arc<Prepared>>,
) -> Result<Classified, DetailedError> {
    let shard = &request.shard;
    let conn = &request.conn;
    let header = frame.header;
    let max = shard.config.max_frame_bytes as usize;
    let protocol_error = |e: sluice_protocol::DecodeError| {
        DetailedError::from(ErrorResponse::new(DbError::ProtocolError, e.message()))
    };
    let body = conn
        .compression
        .get()
        .decompress_body(&header, frame.body, max)
        .map_err(protocol_error)?;
    let decoded = sluice_protocol::decode_request(&header, body).map_err(protocol_error)?;
    use sluice_protocol::Request as R;
    if !conn.ready.get() && !matches!(decoded, R::Options | R::Startup(_)) {
        // Before login only the exchange itself is served, as Cassandra does.
        return match (conn.login.get(), &decoded) {
            (LoginPhase::Awaiting, R::AuthResponse(_)) => {
                let R::AuthResponse(token) = decoded else {
                    unreachable!("matched above")
                };
                Ok(Classified::Control(Control::AuthResponse(token)))
            }
            (LoginPhase::NotRequired, _) => Err(NOT_READY.into()),
            _ => Err(NOT_AUTHENTICATED.into()),
        };
    }
    let statement = match decoded {
        R::Options => return Ok(Classified::Control(Control::Options)),
        R::Startup(options) => return Ok(Classified::Control(Control::Startup(options))),
        R::Register(types) => return Ok(Classified::Control(Control::Register(types))),
        R::AuthResponse(token) => return Ok(Classified::Control(Control::AuthResponse(token))),
        R::Prepare { query } => {
            std::str::from_utf8(&query).map_err(|_| DetailedError::from(NOT_UTF8))?;
            return Ok(Classified::Control(Control::Prepare(query)));
        }
        R::Query { query, params } => {
            let text = std::str::from_utf8(&query).map_err(|_| DetailedError::from(NOT_UTF8))?;
            let prepared = conn.with_keyspace(|ks| shard.engine.prepare(ks, text))?;
            single(shard, prepared, params)?
        }
        R::Execute { id, params } => match known {
            Some(prepared) => Statement::Single {
                prepared,
                params,
                using_timeout: None,
            },
            None => match shard.prepared(&id) {
                Some(prepared) => single(shard, prepared, params)?,
                None => Statement::Unknown(UnknownId::new(&id)),
            },
        },
        R::Batch(batch) => {
            let using_timeout = batch_timeout(request, &batch)?;
            Statement::Batch {
                batch,
                using_timeout,
            }
        }
    };
    Ok(Classified::Statement(statement))
}

/// A single statement with its `USING TIMEOUT` bound.
fn single(
    shard: &ShardCtx,
    prepared: Arc<Prepared>,
    params: QueryParameters,
) -> Result<Statement, DetailedError> {
    let using_timeout = using_timeout(shard, &prepared, &params.values[..])?;
    Ok(Statement::Single {
        prepared,
        params,
        using_timeout,
    })
}

/// The smallest `USING TIMEOUT` among a batch's statements. Statements that cannot be found
/// or analysed are left to the execution, which reports them.
fn batch_timeout(
    request: &Request,
    batch: &BatchRequest,
) -> Result<Option<Duration>, DetailedError> {
    let engine = &request.shard.engine;
    let mut smallest: Option<Duration> = None;
    for entry in &batch.entries {
        let prepared = match &entry.statement {
            BatchQuery::Prepared(id) => request.shard.prepared(id),
            BatchQuery::Text(text) => std::str::from_utf8(text)
                .ok()
                .and_then(|q| request.conn.with_keyspace(|ks| engine.prepare(ks, q)).ok()),
        };
        let Some(prepared) = prepared else { continue };
        if entry.values.len() != prepared.bind_specs.len() {
            continue;
        }
        if let Some(t) = engine.timeout(&prepared, &entry.values[..])? {
            smallest = Some(smallest.map_or(t, |s| s.min(t)));
        }
    }
    Ok(smallest)
}
