//! The request pipeline: one request is one [`Request`] value that flows through plain
//! functions, one stage per file, in this order:
//!
//! ```text
//! admit.rs     from the 9-byte header: in-flight caps, the shard's admission queue  -> Overloaded
//! classify.rs  decode the body once: control requests, or one statement shape
//! control.rs   OPTIONS, STARTUP, REGISTER, AUTH_RESPONSE, PREPARE: connection state
//! login.rs     the password authenticator's SASL PLAIN exchange, throttled per address
//! check.rs     every reason to turn a statement away, cheapest first, in one function
//!              (permissions included, from the connection's cache of decisions)
//! execute.rs   on this shard, or forwarded to the shard that owns the partition
//! reply.rs     every answer: results, errors, and rejections from pre-encoded frames
//! ```
//!
//! Stages that do not wait run in the connection's reader ([`start`]); a request that has to
//! wait (a queued admission, another shard's limiter or execution, group commit) continues in
//! [`finish`], which the reader polls once and spawns as a task only if it is still waiting.
//! A dispatched EXECUTE is checked in [`start`] from its head (id and leading values), so
//! one turned away by its deadline or the rate limiter costs neither a task nor a full decode.

pub mod admit;
pub mod check;
pub mod classify;
pub mod control;
pub mod execute;
pub mod login;
pub mod reply;

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use sluice_engine::Prepared;
use sluice_protocol::frame::{Frame, Opcode};
use sluice_protocol::ExecuteHead;

use crate::admission::{Admitted, Outcome};
use crate::budget::Held;
use crate::connection::ConnState;
use crate::shard::ShardCtx;
use check::Checked;
use classify::Classified;
use reply::Rejection;

/// A request's in-flight units: one request of its connection's and of its shard's caps,
/// and these bytes of each (clamped to each cap). Given back by [`Request`]'s drop, through
/// the connection and shard the request already holds, so they keep no references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permits {
    /// Bytes taken from the connection's byte cap.
    pub conn_bytes: usize,
    /// Bytes taken from the shard's byte cap.
    pub shard_bytes: usize,
}

impl Permits {
    /// True if a frame of `bytes` fits every cap now (nobody waits, room for it).
    #[inline]
    pub fn fit_now(shard: &ShardCtx, conn: &ConnState, bytes: usize) -> bool {
        conn.inflight.fits_now(1)
            && shard.inflight.fits_now(1)
            && conn.inflight_bytes.fits_now(bytes)
            && shard.inflight_bytes.fits_now(bytes)
    }

    /// Takes a frame's units after [`Self::fit_now`] said they fit.
    #[inline]
    pub fn take_fitting(shard: &ShardCtx, conn: &ConnState, bytes: usize) -> Permits {
        conn.inflight.take_fitting(1);
        shard.inflight.take_fitting(1);
        Permits {
            conn_bytes: conn.inflight_bytes.take_fitting(bytes),
            shard_bytes: shard.inflight_bytes.take_fitting(bytes),
        }
    }

    /// Keeps units taken by waiting (see `admit`) past their [`Held`]s.
    pub fn keep(held: (Held, Held, Held, Held)) -> Permits {
        let (c, s, conn_bytes, shard_bytes) = held;
        let requests = (c.keep(), s.keep());
        debug_assert_eq!(requests, (1, 1), "one request of each cap");
        Permits {
            conn_bytes: conn_bytes.keep(),
            shard_bytes: shard_bytes.keep(),
        }
    }

    /// Gives the units back to the caps they came from.
    #[inline]
    fn give_back(self, shard: &ShardCtx, conn: &ConnState) {
        conn.inflight.give_back(1);
        shard.inflight.give_back(1);
        conn.inflight_bytes.give_back(self.conn_bytes);
        shard.inflight_bytes.give_back(self.shard_bytes);
    }
}

/// One request between its admission and its answer. Holds its in-flight permits and its
/// place in the admission queue, both given back when it is dropped; dropped unanswered (a
/// panic in the request path), it answers Server_error so the client's stream is not left
/// hanging.
pub struct Request {
    /// The shard serving it.
    pub shard: Rc<ShardCtx>,
    /// Its connection.
    pub conn: Rc<ConnState>,
    /// Its stream id.
    pub stream: i16,
    /// Its opcode.
    pub opcode: Opcode,
    /// When its frame arrived (see `socket_wait`): the deadline counts from here.
    pub arrival: Instant,
    pub(crate) admitted: Admitted,
    pub(crate) answered: bool,
    permits: Permits,
}

impl Request {
    /// A request admitted with `admitted` and holding `permits`.
    pub(crate) fn new(
        shard: Rc<ShardCtx>,
        conn: Rc<ConnState>,
        header: &sluice_protocol::FrameHeader,
        arrival: Instant,
        admitted: Admitted,
        permits: Permits,
    ) -> Request {
        shard.metrics.inflight.fetch_add(1, Relaxed);
        Request {
            shard,
            conn,
            stream: header.stream,
            opcode: header.opcode,
            arrival,
            admitted,
            answered: false,
            permits,
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.shard.metrics.inflight.fetch_sub(1, Relaxed);
        if !self.answered {
            reply::internal_error(&self.shard, &self.conn, self.stream);
        }
        self.admitted.release(&self.shard);
        self.permits.give_back(&self.shard, &self.conn);
    }
}

/// What [`start`] leaves to [`finish`].
pub struct Pending {
    request: Request,
    frame: Frame,
    /// An EXECUTE that passed [`check::check`] in the reader, from its head.
    early: Option<(Arc<Prepared>, Checked)>,
}

/// Runs the stages that need no wait, in the reader. Returns what is left, if anything.
pub fn start(request: Request, frame: Frame) -> Option<Pending> {
    if control::bypasses_queue(request.opcode) {
        control::handle_frame(request, frame);
        return None;
    }
    if request.opcode != Opcode::Execute
        || !request.conn.ready.get()
        || frame.header.is_compressed()
        || !request.admitted.is_dispatched(&request.shard)
    {
        return Some(Pending {
            request,
            frame,
            early: None,
        });
    }
    // The head is read once, here; the full decode happens only if the request goes on.
    let mut head = ExecuteHead::new(&frame.body);
    let known = match head.read(&frame.header) {
        Ok(id) if head.complete() => request.shard.prepared(id),
        _ => None,
    };
    let Some(prepared) = known else {
        // The head borrows the body: gone before the frame moves on.
        drop(head);
        return Some(Pending {
            request,
            frame,
            early: None,
        });
    };
    let using_timeout = match classify::using_timeout(&request.shard, &prepared, &head) {
        Ok(t) => t,
        Err(e) => {
            reply::refuse(request, &e);
            return None;
        }
    };
    let subject = check::Subject::Single {
        prepared: &prepared,
        values: &head,
        using_timeout,
    };
    let checked = check::check(&request, subject);
    drop(head);
    match checked {
        Ok(checked) => Some(Pending {
            request,
            frame,
            early: Some((prepared, checked)),
        }),
        Err(rejection) => {
            reply::reject(request, rejection);
            None
        }
    }
}

/// The stages after [`start`]: wait for admission if queued, classify, check, execute and
/// reply. Polled once in the reader; a task only if it waits.
pub async fn finish(pending: Pending) {
    let Pending {
        request,
        frame,
        early,
    } = pending;
    match request.admitted.outcome(&request.shard).await {
        Outcome::Run => {}
        Outcome::Dropped => return reply::reject(request, Rejection::ClientGone),
        Outcome::Shed => return reply::reject(request, Rejection::Overloaded),
        Outcome::Expired => {
            let kind = classify::kind_of_opcode(request.opcode);
            return reply::reject(request, Rejection::Expired(kind));
        }
    }
    let (known, early_checked) = match early {
        Some((prepared, checked)) => (Some(prepared), Some(checked)),
        None => (None, None),
    };
    let statement = match classify::classify(&request, frame, known) {
        Ok(Classified::Statement(s)) => s,
        Ok(Classified::Control(c)) => return control::handle(request, c),
        Err(e) => return reply::refuse(request, &e),
    };
    let checked = match early_checked {
        Some(c) => c,
        None => match check::check(&request, statement.subject()) {
            Ok(c) => c,
            Err(rejection) => return reply::reject(request, rejection),
        },
    };
    let checked = match check::ask_owners(&request, checked).await {
        Ok(c) => c,
        Err(rejection) => return reply::reject(request, rejection),
    };
    match execute::execute(&request, statement, checked).await {
        Ok(result) => reply::result(request, &result),
        Err(failure) => reply::failure(request, failure),
    }
}
