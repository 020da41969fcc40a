//! Request dispatch: from an admitted frame to its encoded answer.
//!
//! decode body -> STARTUP/OPTIONS/REGISTER/AUTH handled here; QUERY goes through the
//! engine's statement cache (`prepare`, keyed by keyspace and text) and is then executed
//! like EXECUTE; PREPARE answers RESULT Prepared; BATCH runs as one engine batch.
//! Executions get a deadline [C] = arrival + `USING TIMEOUT`, else the per-kind default;
//! they pass the limiter hook [B], and run on the shard that owns their partition's token
//! (forwarded through a bounded channel when the connection is on another shard).

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use sluice_engine::{OpKind, Prepared, RequestContext, Session};
use sluice_protocol::compression::Compression;
use sluice_protocol::frame::{Frame, Opcode};
use sluice_protocol::{
    DetailedError, ErrorCode, ErrorExtra, ErrorResponse, EventType, QueryParameters, Request,
    ResultMessage,
};
use tokio::sync::oneshot;

use crate::admission::{Admitted, Outcome, Ticket};
use crate::connection::InFlight;
use crate::limiter::{op_type, LimitCheck, LimitDecision};
use crate::shard::{Forwarded, ShardCtx};
use crate::supported::{cql_version_acceptable, StartupOptIns};

const NOT_READY: ErrorResponse = ErrorResponse::new(
    ErrorCode::ProtocolError,
    "Unexpected message, expecting STARTUP or OPTIONS",
);
const BAD_CQL_VERSION: ErrorResponse = ErrorResponse::new(
    ErrorCode::ProtocolError,
    "STARTUP needs a CQL_VERSION of 3.0.0 or later",
);
const NO_AUTH: ErrorResponse = ErrorResponse::new(
    ErrorCode::ProtocolError,
    "Authentication is not enabled on this server",
);
const SHUTTING_DOWN: ErrorResponse =
    ErrorResponse::new(ErrorCode::Overloaded, "Server is shutting down");

/// Deadline passed before a write was executed: Write_timeout, writeType SIMPLE, received 0
/// of 1, so that no default retry policy retries it (spec §7.3 rule 4).
pub const WRITE_EXPIRED: ErrorResponse = sluice_protocol::preencoded::WRITE_DEADLINE;

/// Deadline passed before a read was executed: Read_timeout, received 0 of 1, no data.
pub const READ_EXPIRED: ErrorResponse = sluice_protocol::preencoded::READ_DEADLINE;

/// Handles one admitted frame and answers it through `inf`. `ticket` is its place in the
/// shard's admission queue [A]: the body is decoded only once it is dispatched. `early`:
/// an EXECUTE the reader already checked ([`precheck_in_reader`]).
pub async fn handle(
    inf: InFlight,
    frame: Frame,
    arrival: Instant,
    ticket: Ticket,
    early: Option<EarlyChecked>,
) {
    let shard = inf.shard.clone();
    let conn = inf.conn.clone();
    let admitted = Admitted::new(shard.clone(), ticket);
    match admitted.outcome().await {
        Outcome::Run => {}
        Outcome::Dropped => {
            inf.abandon();
            return;
        }
        o @ (Outcome::Shed | Outcome::Expired) => {
            let (stream, op) = (inf.stream, frame.header.opcode);
            let code = if o == Outcome::Shed {
                ErrorCode::Overloaded
            } else if op == Opcode::Batch {
                ErrorCode::WriteTimeout
            } else {
                ErrorCode::ReadTimeout
            };
            inf.answer_preencoded(code, |b| admitted.append_rejection(o, op, b, stream));
            return;
        }
    }
    let compression = conn.compression.get();
    let max = shard.config.max_frame_bytes as usize;
    let header = frame.header;
    let body = match compression.decompress_body(&header, frame.body, max) {
        Ok(b) => b,
        Err(e) => {
            inf.answer_error(&ErrorResponse::new(ErrorCode::ProtocolError, e.message()));
            return;
        }
    };
    // EXECUTE: the statement, its deadline [C] and its partition [B] come from the id and the
    // leading values, so that a request turned away there is never decoded further.
    let mut inf = inf;
    let mut checked = early.map(|e| (e.prepared, e.checked));
    if checked.is_none() && header.opcode == Opcode::Execute && conn.ready.get() {
        let mut head = sluice_protocol::ExecuteHead::default();
        if head.read(&header, &body).is_ok() && head.complete() {
            let Some(p) = shard.engine.prepared(&head.id) else {
                inf.answer_error(&sluice_protocol::response::unprepared_error(&head.id));
                return;
            };
            match precheck(inf, &p, head.values(), arrival).await {
                Some((i, c)) => {
                    inf = i;
                    checked = Some((p, c));
                }
                None => {
                    admitted.turned_away();
                    return;
                }
            }
        }
    }
    let request = match sluice_protocol::decode_request(&header, body) {
        Ok(r) => r,
        Err(e) => {
            inf.answer_error(&ErrorResponse::new(ErrorCode::ProtocolError, e.message()));
            return;
        }
    };
    if !conn.ready.get() && !matches!(request, Request::Options | Request::Startup(_)) {
        inf.answer_error(&NOT_READY);
        return;
    }
    let stream = inf.stream;
    match request {
        Request::Options => {
            let supported = &shard.supported;
            inf.answer(true, |b| {
                let start = b.len();
                b.extend_from_slice(supported);
                // Pre-encoded with stream 0: patch the 2 stream bytes.
                b[start + 2..start + 4].copy_from_slice(&stream.to_be_bytes());
            });
        }
        Request::Startup(options) => {
            if !cql_version_acceptable(&options) {
                inf.answer_error(&BAD_CQL_VERSION);
                return;
            }
            let c = match Compression::from_startup_options(&options) {
                Ok(c) => c,
                Err(e) => {
                    inf.answer_error(&ErrorResponse::new(ErrorCode::ProtocolError, e.message()));
                    return;
                }
            };
            conn.opt_ins.set(StartupOptIns::from_startup(&options));
            conn.ready.set(true);
            // READY is empty and never compressed; compression applies from the next frame.
            inf.answer(true, |b| sluice_protocol::response::encode_ready(b, stream));
            conn.compression.set(c);
        }
        Request::AuthResponse(_) => inf.answer_error(&NO_AUTH),
        Request::Register(types) => {
            if types.contains(&EventType::SchemaChange) && conn.events.borrow().is_none() {
                let task = crate::events::spawn_schema_events(&shard, &conn);
                *conn.events.borrow_mut() = Some(task);
            }
            inf.answer(true, |b| sluice_protocol::response::encode_ready(b, stream));
        }
        Request::Prepare { query } => {
            let Ok(text) = std::str::from_utf8(&query) else {
                inf.answer_error(&ErrorResponse::new(
                    ErrorCode::ProtocolError,
                    "query is not UTF-8",
                ));
                return;
            };
            let keyspace = conn.session.borrow().keyspace.clone();
            match shard.engine.prepare(keyspace.as_deref(), text) {
                Ok(p) => {
                    let mut result = shard.engine.prepared_result(&p);
                    // ScyllaDB's LWT bit is only for connections that opted in at STARTUP.
                    if let ResultMessage::Prepared { metadata, .. } = &mut result {
                        metadata.lwt &= conn.opt_ins.get().lwt_metadata_mark;
                    }
                    answer_result(inf, &result, compression);
                }
                Err(e) => answer_detailed(inf, &e, compression),
            }
        }
        Request::Query { query, params } => {
            let Ok(text) = std::str::from_utf8(&query) else {
                inf.answer_error(&ErrorResponse::new(
                    ErrorCode::ProtocolError,
                    "query is not UTF-8",
                ));
                return;
            };
            let keyspace = conn.session.borrow().keyspace.clone();
            match shard.engine.prepare(keyspace.as_deref(), text) {
                Ok(p) => {
                    if !execute(inf, p, params, arrival).await {
                        admitted.turned_away();
                    }
                }
                Err(e) => answer_detailed(inf, &e, compression),
            }
        }
        Request::Execute { id, params } => match checked {
            Some((p, c)) => run(inf, p, params, c).await,
            None => match shard.engine.prepared(&id) {
                Some(p) => {
                    if !execute(inf, p, params, arrival).await {
                        admitted.turned_away();
                    }
                }
                None => inf.answer_error(&sluice_protocol::response::unprepared_error(&id)),
            },
        },
        Request::Batch(batch) => {
            if conn.outbox.is_closed() {
                inf.abandon();
                return;
            }
            let deadline = arrival + shard.config.timeouts.write;
            let ctx = RequestContext {
                deadline: Some(deadline),
                now_micros: now_micros(),
                // The connection's writer runs the barrier before it sends any answer.
                ack_barrier: true,
            };
            if Instant::now() >= deadline {
                shard.metrics.expired_before_execution.fetch_add(1, Relaxed);
                inf.answer_error(&WRITE_EXPIRED);
                return;
            }
            let mut session = conn.session.borrow().clone();
            // [B] a batch counts one write per distinct partition of a limited table, each
            // on the shard that owns it.
            let parts = shard
                .engine
                .batch_limited_partitions(session.keyspace.as_deref(), &batch);
            if !parts.is_empty() {
                let d = crate::limiter::check_partitions(&shard, &parts).await;
                if let LimitDecision::Reject(op) = d {
                    answer_rate_limited(inf, op);
                    return;
                }
            }
            let result = shard.engine.batch(&mut session, &batch, &ctx).await;
            match result {
                Ok(r) => answer_result(inf, &r, compression),
                Err(e) => answer_detailed(inf, &e, compression),
            }
        }
    }
}

/// Routes, limits, dead-lines and runs one statement (QUERY or EXECUTE). False when it was
/// turned away before running.
async fn execute(
    inf: InFlight,
    prepared: Arc<Prepared>,
    params: QueryParameters,
    arrival: Instant,
) -> bool {
    let Some((inf, checked)) = precheck(inf, &prepared, &params.values, arrival).await else {
        return false;
    };
    run(inf, prepared, params, checked).await;
    true
}

/// What [`precheck`] decided for a request that goes on.
struct Checked {
    /// The shard that owns the statement's single partition, if it has one.
    owner: Option<usize>,
    deadline: Instant,
    /// The limiter check the owner shard makes, when the partition is another shard's.
    remote_check: Option<LimitCheck>,
}

/// Everything that can turn a statement away before it is run, cheapest first, from its
/// positional `values`: a gone client, the deadline [C], routing, the limiter [B]. Answers
/// (or abandons) the request and returns None when it must not run.
async fn precheck(
    inf: InFlight,
    prepared: &Prepared,
    values: &[sluice_protocol::Value],
    arrival: Instant,
) -> Option<(InFlight, Checked)> {
    match precheck_now(inf, prepared, values, arrival) {
        Precheck::Answered => None,
        Precheck::Pass(inf, checked) => Some((inf, checked)),
        Precheck::AskPartitions(inf, checked, parts) => {
            let d = crate::limiter::check_partitions(&inf.shard, &parts).await;
            if let LimitDecision::Reject(op) = d {
                answer_rate_limited(inf, op);
                return None;
            }
            Some((inf, checked))
        }
    }
}

/// What the synchronous part of [`precheck`] decided.
enum Precheck {
    /// Answered (turned away, or a bad value) or abandoned: it does not run.
    Answered,
    /// Passed: it runs.
    Pass(InFlight, Checked),
    /// A statement of a limited table over several partitions, or a text batch: each
    /// partition's limiter is asked on the shard that owns it, which takes an await.
    AskPartitions(InFlight, Checked, Vec<sluice_engine::LimitedPartition>),
}

/// [`precheck`] up to the limiters of other shards, without awaiting.
fn precheck_now(
    inf: InFlight,
    prepared: &Prepared,
    values: &[sluice_protocol::Value],
    arrival: Instant,
) -> Precheck {
    let shard = inf.shard.clone();
    let conn = inf.conn.clone();
    let compression = conn.compression.get();
    // Nobody is waiting for this answer any more: do not work on it.
    if conn.outbox.is_closed() {
        inf.abandon();
        return Precheck::Answered;
    }
    // [C] deadline: USING TIMEOUT, else the per-kind default, from the frame's arrival;
    // checked before any routing work so that an expired request costs the least.
    let timeout = match shard.engine.timeout(prepared, values) {
        Ok(t) => t,
        Err(e) => {
            answer_detailed(inf, &e, compression);
            return Precheck::Answered;
        }
    };
    let timeouts = &shard.config.timeouts;
    let default = match prepared.kind {
        OpKind::Read => timeouts.read,
        OpKind::Write => timeouts.write,
        OpKind::Range => timeouts.range,
        _ => timeouts.other,
    };
    let deadline = arrival + timeout.unwrap_or(default);
    if Instant::now() >= deadline {
        shard.metrics.expired_before_execution.fetch_add(1, Relaxed);
        let expired = if matches!(prepared.kind, OpKind::Write) {
            &WRITE_EXPIRED
        } else {
            &READ_EXPIRED
        };
        inf.answer_error(expired);
        return Precheck::Answered;
    }
    let route = shard.engine.route_with_timeout(prepared, values, timeout);
    let owner = route.token.map(|t| shard.owner_of(t));
    let mut checked = Checked {
        owner,
        deadline,
        remote_check: None,
    };
    // [B] per-partition limiter, always on the shard that owns the partition: a single
    // partition here or on the owner with the forwarded execution; each partition of a
    // multi-partition operation on its owner. Tables without a limit skip all of it.
    if prepared.is_text_batch() || (route.token.is_none() && route.rate_limits.is_some()) {
        let parts = shard.engine.limited_partitions(prepared, values);
        if !parts.is_empty() {
            return Precheck::AskPartitions(inf, checked, parts);
        }
    } else if let (Some(token), Some(table), Some(rl), Some(op)) = (
        route.token,
        route.table,
        route.rate_limits,
        op_type(route.kind),
    ) {
        if let Some(limit) = rl.for_kind(route.kind) {
            let mut limiter = shard.limiter.borrow_mut();
            let check = LimitCheck {
                table,
                token,
                op,
                limit,
                random: limiter.draw(),
            };
            if owner.is_some_and(|o| o != shard.id) {
                checked.remote_check = Some(check);
            } else if let LimitDecision::Reject(op) =
                limiter.check(&check, &shard.engine, &shard.metrics)
            {
                drop(limiter);
                answer_rate_limited(inf, op);
                return Precheck::Answered;
            }
        }
    }
    Precheck::Pass(inf, checked)
}

/// What the reader decided for an EXECUTE before it spawned the request's task
/// ([`precheck_in_reader`]).
pub enum Early {
    /// Answered in the reader (turned away by [C] or [B], or a bad value): no task.
    Answered,
    /// Spawn the task; with the statement and what its checks decided when they passed.
    Spawn(InFlight, Option<EarlyChecked>),
}

/// An EXECUTE that passed [C] and [B] in the reader: its statement and routing.
pub struct EarlyChecked {
    prepared: Arc<Prepared>,
    checked: Checked,
}

/// [C] and [B] for a dispatched, uncompressed EXECUTE in the connection's reader, before a
/// task is spawned for it: a request turned away costs no task, no boxed future and no
/// poll. The checks are those the task would make ([`precheck_now`]); whatever they cannot
/// settle here (the statement is unknown, its values are named or many, or it asks other
/// shards' limiters) is left to the task, which makes all of them itself.
pub fn precheck_in_reader(inf: InFlight, frame: &Frame, arrival: Instant) -> Early {
    if frame.header.is_compressed() {
        return Early::Spawn(inf, None);
    }
    let mut head = sluice_protocol::ExecuteHead::default();
    if head.read(&frame.header, &frame.body).is_err() || !head.complete() {
        return Early::Spawn(inf, None);
    }
    let Some(prepared) = inf.shard.engine.prepared(&head.id) else {
        return Early::Spawn(inf, None);
    };
    match precheck_now(inf, &prepared, head.values(), arrival) {
        Precheck::Answered => Early::Answered,
        Precheck::Pass(inf, checked) => Early::Spawn(inf, Some(EarlyChecked { prepared, checked })),
        // The task asks them again, with everything else: rare (IN on a limited table).
        Precheck::AskPartitions(inf, _, _) => Early::Spawn(inf, None),
    }
}

/// Runs a statement that passed [`precheck`], on the shard that owns its partition.
async fn run(inf: InFlight, prepared: Arc<Prepared>, params: QueryParameters, checked: Checked) {
    let shard = inf.shard.clone();
    let conn = inf.conn.clone();
    let compression = conn.compression.get();
    let Checked {
        owner,
        deadline,
        remote_check,
    } = checked;
    if let Some(delay) = shard.config.test_only_service_delay {
        // TEST ONLY: real service time in end-to-end overload tests.
        tokio::time::sleep(delay).await;
    }
    let ctx = RequestContext {
        deadline: Some(deadline),
        now_micros: now_micros(),
        // The connection's writer runs the barrier before it sends any answer (a request
        // forwarded to another shard is answered through this connection's writer too).
        ack_barrier: true,
    };
    let session = conn.session.borrow().clone();
    let (session, result) = match owner {
        Some(o) if o != shard.id => {
            match forward(&shard, o, prepared, params, session, ctx, remote_check).await {
                Some(answer) => answer,
                None => {
                    inf.answer_error(&SHUTTING_DOWN);
                    return;
                }
            }
        }
        _ => {
            let mut session = session;
            let r = shard
                .engine
                .execute(&mut session, &prepared, &params, &ctx)
                .await;
            (session, r)
        }
    };
    match result {
        Ok(r) => {
            if let ResultMessage::SetKeyspace(_) = &r {
                *conn.session.borrow_mut() = session;
            }
            answer_result(inf, &r, compression);
        }
        // Rejected by the owner's limiter: the pre-encoded frame, as for a local reject.
        Err(e) if e.code == ErrorCode::RateLimitReached => answer_rate_limited(inf, route_op(&e)),
        Err(e) => answer_detailed(inf, &e, compression),
    }
}

/// The limiter operation type of a rate-limit error.
fn route_op(e: &DetailedError) -> sluice_overload::OpType {
    match e.extra {
        ErrorExtra::RateLimit {
            op: sluice_protocol::OperationType::Read,
            ..
        } => sluice_overload::OpType::Read,
        _ => sluice_overload::OpType::Write,
    }
}

/// Answers a rate-limited operation with the pre-encoded frame: 0xF000 (with op type and
/// rejected-by-coordinator) if the connection negotiated it at STARTUP, else Config_error.
/// No allocation, no formatting, no logging.
fn answer_rate_limited(inf: InFlight, op: sluice_overload::OpType) {
    let shard = inf.shard.clone();
    let negotiated = inf.conn.opt_ins.get().rate_limit_error;
    let code = if negotiated {
        ErrorCode::RateLimitReached
    } else {
        ErrorCode::ConfigError
    };
    shard.metrics.count_error(code as u32);
    shard.metrics.rejected_rate_limited.fetch_add(1, Relaxed);
    let stream = inf.stream;
    let limiter = shard.limiter.borrow();
    let frame = limiter.rejection_frame(op, negotiated);
    inf.answer(false, |b| {
        frame.append(b, stream);
    });
}

/// Sends an execution to the shard that owns its partition and waits for the answer.
/// Returns None only when that shard has stopped (shutdown).
async fn forward(
    shard: &Rc<ShardCtx>,
    owner: usize,
    prepared: Arc<Prepared>,
    params: QueryParameters,
    session: Session,
    ctx: RequestContext,
    limit: Option<LimitCheck>,
) -> Option<(Session, Result<ResultMessage, DetailedError>)> {
    shard.metrics.forwards_out.fetch_add(1, Relaxed);
    let (tx, rx) = oneshot::channel();
    let msg = Forwarded {
        prepared,
        params,
        session,
        ctx,
        limit,
        reply: tx,
    };
    // Bounded channel: a full owner queue makes this request wait (it holds its in-flight
    // slot, so the connection's reader stops when enough of them wait).
    shard.peers.get(owner)?.forwards.send(msg).await.ok()?;
    rx.await.ok()
}

fn answer_result(inf: InFlight, result: &ResultMessage, compression: Compression) {
    let stream = inf.stream;
    inf.answer(true, |b| {
        sluice_protocol::response::encode_result(b, stream, result, compression)
    });
}

fn answer_detailed(inf: InFlight, err: &DetailedError, compression: Compression) {
    let stream = inf.stream;
    let code = err.code;
    let opt_ins = inf.conn.opt_ins.get();
    inf.shard.metrics.count_error(code as u32);
    match code {
        ErrorCode::WriteTimeout | ErrorCode::ReadTimeout => {
            inf.shard.metrics.timed_out.fetch_add(1, Relaxed);
        }
        ErrorCode::RateLimitReached => {
            inf.shard
                .metrics
                .rejected_rate_limited
                .fetch_add(1, Relaxed);
        }
        _ => {}
    }
    // The rate-limit code only goes to clients that negotiated it; others get Config_error.
    let downgraded;
    let err = if code == ErrorCode::RateLimitReached && !opt_ins.rate_limit_error {
        downgraded = DetailedError {
            code: ErrorCode::ConfigError,
            extra: ErrorExtra::None,
            ..err.clone()
        };
        &downgraded
    } else {
        err
    };
    inf.answer(false, |b| {
        sluice_protocol::response::encode_detailed_error(b, stream, err, compression)
    });
}

/// Wall-clock time in microseconds (write timestamps when the client sends none).
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}
