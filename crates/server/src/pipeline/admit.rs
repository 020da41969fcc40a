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

/// The admission decision for one frame, made at once from its header.
pub enum Admission {
    /// Let in.
    Admitted(Request),
    /// Turned away: answer `Overloaded` and skip the body.
    Overloaded,
    /// Over an in-flight cap while it is to be held back: the reader pauses in
    /// [`admit_after_pause`].
    OverCap,
}

/// True if `conn` is paced: pacing is on and its backlog watch has not seen it push
/// (`sluice_overload::backlog`). Its backlog is served and held back, never turned away for
/// its age.
#[inline]
pub fn is_paced(shard: &ShardCtx, conn: &ConnState) -> bool {
    !conn.pushing.get() && shard.admission.borrow().paces_windows()
}

/// Decides from `header` whether the frame is let in, without waiting. Over an in-flight
/// cap the reader pauses (backpressure, [`Admission::OverCap`]) unless the shard is
/// overloaded: then the excess is turned away, because paused, it would wait unseen in the
/// kernel socket buffer and time out at the client instead.
#[inline]
pub fn admit(
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
    let paced = is_paced(shard, conn);
    if !Permits::fit_now(shard, conn, bytes) {
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
        return Admission::OverCap;
    }
    // The caps have room, so the queue decides; a frame it turns away never touches them.
    let conn_id = Rc::as_ptr(conn) as usize;
    let admit = {
        let mut admission = shard.admission.borrow_mut();
        if !super::control::bypasses_queue(header.opcode)
            && admission.turns_away_from_header(paced, &shard.metrics)
        {
            Admit::Reject
        } else {
            admission.admit_paced(header, arrival, conn_id, paced, &shard.metrics)
        }
    };
    let Admit::Accept(ticket) = admit else {
        return turned_away(conn);
    };
    // Admission touches no cap, so the room seen above is still there.
    let permits = Permits::take_fitting(shard, conn, bytes);
    Admission::Admitted(Request::new(
        shard.clone(),
        conn.clone(),
        header,
        arrival.at(),
        Admitted::new(ticket),
        permits,
    ))
}

/// Admission of a frame [`admit`] found over a cap: waits for its units, the socket unread
/// meanwhile (backpressure), then asks the queue. The frames still buffered waited in the
/// client's queue, not the shard's, so the arrival counts from the end of the pause.
/// `Some` is the request let in; `None` means answer `Overloaded`.
pub async fn admit_after_pause(
    shard: &Rc<ShardCtx>,
    conn: &Rc<ConnState>,
    header: &FrameHeader,
) -> Option<Request> {
    shard.metrics.backpressure_pauses.fetch_add(1, Relaxed);
    let bytes = header.length as usize;
    let held = (
        conn.inflight.take(1).await,
        shard.inflight.take(1).await,
        conn.inflight_bytes.take(bytes).await,
        shard.inflight_bytes.take(bytes).await,
    );
    let arrival = Arrival::Read(shard.clock.now());
    let paced = is_paced(shard, conn);
    let conn_id = Rc::as_ptr(conn) as usize;
    let admit =
        shard
            .admission
            .borrow_mut()
            .admit_paced(header, arrival, conn_id, paced, &shard.metrics);
    let Admit::Accept(ticket) = admit else {
        turned_away(conn);
        return None;
    };
    Some(Request::new(
        shard.clone(),
        conn.clone(),
        header,
        arrival.at(),
        Admitted::new(ticket),
        Permits::keep(held),
    ))
}

/// Counts a frame turned away in its connection's backlog watch.
fn turned_away(conn: &ConnState) -> Admission {
    let mut watch = conn.backlog.get();
    watch.on_turned_away();
    conn.backlog.set(watch);
    Admission::Overloaded
}
