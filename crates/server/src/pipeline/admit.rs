//! Admission, from the 9-byte frame header alone: the in-flight caps (backpressure) and the
//! shard's admission queue. This is the one place a request is let in or turned away
//! `Overloaded` before its body is looked at.

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use sluice_overload::Arrival;
use sluice_protocol::frame::{FrameHeader, HEADER_LEN};

use super::{Permits, Request};
use crate::admission::{Admit, Admitted};
use crate::connection::{ConnState, MAX_OUTBOX_BYTES};
use crate::shard::ShardCtx;

/// The admission decision for one frame.
pub enum Admission {
    /// Let in at once.
    Admitted(Request),
    /// Let in after the reader paused over an in-flight cap: the frames still buffered
    /// waited in the client's queue, not the shard's, so their arrival counts from now.
    AdmittedAfterPause(Request),
    /// Turned away: answer `Overloaded` and skip the body.
    Overloaded,
}

/// Decides from `header` whether the frame is let in. Over an in-flight cap the reader
/// pauses (backpressure) unless the shard is overloaded: then the excess is turned away,
/// because paused, it would wait unseen in the kernel socket buffer and time out at the
/// client instead.
pub async fn admit(
    shard: &Rc<ShardCtx>,
    conn: &Rc<ConnState>,
    header: &FrameHeader,
    arrival: Arrival<Instant>,
) -> Admission {
    // A frame larger than a byte cap takes the whole cap (frames are bounded by
    // max_frame_bytes), so it waits for the scope to drain instead of stalling.
    let bytes = header.length as usize;
    let mut watch = conn.backlog.get();
    watch.on_frame(HEADER_LEN + bytes);
    conn.backlog.set(watch);
    // A connection that slows down when held back is served, and held back over its caps;
    // one that keeps pushing has its excess turned away while the shard is overloaded.
    let paced = !conn.pushing.get() && shard.admission.borrow().paces_windows();
    let (permits, arrival, paused) = match try_permits(shard, conn, bytes) {
        Some(p) => (p, arrival, false),
        None => {
            if !paced
                && !super::control::bypasses_queue(header.opcode)
                && conn.outbox.pending() < MAX_OUTBOX_BYTES
                && shard
                    .admission
                    .borrow_mut()
                    .reject_over_cap(shard.clock.now())
            {
                shard
                    .admission
                    .borrow_mut()
                    .count_rejected_over_cap(&shard.metrics);
                return turned_away(conn);
            }
            shard.metrics.backpressure_pauses.fetch_add(1, Relaxed);
            let p = wait_permits(shard, conn, bytes).await;
            (p, Arrival::Read(shard.clock.now()), true)
        }
    };
    let conn_id = Rc::as_ptr(conn) as usize;
    let admit =
        shard
            .admission
            .borrow_mut()
            .admit_paced(header, arrival, conn_id, paced, &shard.metrics);
    let ticket = match admit {
        Admit::Accept(t) => t,
        Admit::Reject => return turned_away(conn),
    };
    let admitted = Admitted::new(shard.clone(), ticket);
    let request = Request::new(
        shard.clone(),
        conn.clone(),
        header,
        arrival.at(),
        admitted,
        permits,
    );
    if paused {
        Admission::AdmittedAfterPause(request)
    } else {
        Admission::Admitted(request)
    }
}

/// Counts a frame turned away in its connection's backlog watch.
fn turned_away(conn: &ConnState) -> Admission {
    let mut watch = conn.backlog.get();
    watch.on_turned_away();
    conn.backlog.set(watch);
    Admission::Overloaded
}

/// Takes a request's units if all four are free now, without awaiting (so without spending
/// the task's cooperative budget); `None` if a cap is reached (nothing is kept then).
#[inline]
fn try_permits(shard: &ShardCtx, conn: &ConnState, bytes: usize) -> Option<Permits> {
    let c = conn.inflight.try_take(1)?;
    let s = shard.inflight.try_take(1)?;
    let cbytes = conn.inflight_bytes.try_take(bytes)?;
    let sbytes = shard.inflight_bytes.try_take(bytes)?;
    Some((c, s, cbytes, sbytes))
}

/// Waits for a request's units, the socket unread meanwhile (backpressure).
async fn wait_permits(shard: &ShardCtx, conn: &ConnState, bytes: usize) -> Permits {
    let c = conn.inflight.take(1).await;
    let s = shard.inflight.take(1).await;
    let cbytes = conn.inflight_bytes.take(bytes).await;
    let sbytes = shard.inflight_bytes.take(bytes).await;
    (c, s, cbytes, sbytes)
}
