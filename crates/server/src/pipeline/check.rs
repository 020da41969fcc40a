//! Every reason to turn a statement away before it runs, cheapest first, in one function
//! ([`check`]): the client is gone, the statement is unknown, its deadline has passed, a
//! write would wait too long for its group fsync, the shard that owns its partition has
//! stopped, or the per-partition rate limiter rejects it.
//! QUERY, EXECUTE and BATCH all pass through it.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use sluice_engine::{LimitedPartition, OpKind, Prepared};
use sluice_overload::RequestKind;
use sluice_protocol::{BatchRequest, BoundValues, Value};

use super::classify::UnknownId;
use super::reply::Rejection;
use super::Request;
use crate::limiter::{op_type, LimitCheck, LimitDecision};
use crate::shard::ShardCtx;

/// The longest a deadline can be from its arrival: bounds a huge `USING TIMEOUT` so that
/// the instant arithmetic cannot overflow.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// What [`check`] looks at. `V` holds a single statement's values: decoded, or read in
/// place by the reader from an EXECUTE's head.
pub enum Subject<'a, V: BoundValues + ?Sized = [Value]> {
    /// One statement and its positional values.
    Single {
        /// The statement.
        prepared: &'a Prepared,
        /// Its positional values (all of them).
        values: &'a V,
        /// Its bound `USING TIMEOUT`.
        using_timeout: Option<Duration>,
    },
    /// An EXECUTE of an id the statement cache does not hold.
    Unknown(UnknownId),
    /// A BATCH.
    Batch {
        /// The batch.
        batch: &'a BatchRequest,
        /// The smallest `USING TIMEOUT` among its statements.
        using_timeout: Option<Duration>,
    },
}

impl<V: BoundValues + ?Sized> Clone for Subject<'_, V> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<V: BoundValues + ?Sized> Copy for Subject<'_, V> {}

/// What the rate limiter still has to do for a checked statement.
pub enum LimitPlan {
    /// Nothing: no limited table, or accepted here.
    Done,
    /// The partition belongs to another shard: its limiter decides there, with the execution.
    OnOwner(LimitCheck),
    /// Several partitions, each decided by the shard that owns it ([`ask_owners`]).
    AskOwners(Vec<LimitedPartition>),
}

/// A statement that passed [`check`].
pub struct Checked {
    /// Its deadline.
    pub deadline: Instant,
    /// The shard that owns its single partition, if it has one.
    pub owner: Option<usize>,
    /// What the rate limiter still has to decide.
    pub limit: LimitPlan,
}

/// The request kind of a statement kind, which selects its default timeout.
pub fn request_kind(kind: OpKind) -> RequestKind {
    match kind {
        OpKind::Read => RequestKind::Read,
        OpKind::Write => RequestKind::Write,
        OpKind::Range => RequestKind::Range,
        OpKind::Schema | OpKind::Other => RequestKind::Other,
    }
}

/// The deadline of every QUERY, EXECUTE and BATCH: its arrival plus its `USING TIMEOUT`,
/// else the server's default for its kind.
pub fn deadline(
    shard: &ShardCtx,
    kind: RequestKind,
    using_timeout: Option<Duration>,
    arrival: Instant,
) -> Instant {
    let timeout = shard.config.timeouts.timeout_for(kind, using_timeout);
    arrival + timeout.min(LONGEST_TIMEOUT)
}

/// Decides whether `request` may run, cheapest reason first. A single partition owned by
/// this shard is rate-limited here; anything the limiters of other shards decide is left in
/// [`Checked::limit`].
pub fn check<V: BoundValues + ?Sized>(
    request: &Request,
    subject: Subject<'_, V>,
) -> Result<Checked, Rejection> {
    debug_assert!(
        !request.answered,
        "a request is checked before it is answered"
    );
    debug_assert!(
        request.admitted.is_dispatched(&request.shard),
        "a request is checked only once admission lets it run"
    );
    let shard = &request.shard;
    // Nobody is waiting for this answer any more: do not work on it.
    if request.conn.outbox.is_closed() {
        return Err(Rejection::ClientGone);
    }
    let (kind, using_timeout) = match subject {
        Subject::Unknown(id) => return Err(Rejection::Unprepared(id)),
        Subject::Single {
            prepared,
            using_timeout,
            ..
        } => (request_kind(prepared.kind), using_timeout),
        Subject::Batch { using_timeout, .. } => (RequestKind::Write, using_timeout),
    };
    // Before any routing work, so that an expired request costs the least.
    let deadline = deadline(shard, kind, using_timeout, request.arrival);
    let now = shard.clock.now();
    if now >= deadline {
        return Err(Rejection::Expired(kind));
    }
    check_permissions(request, &subject)?;
    match subject {
        Subject::Single {
            prepared,
            values,
            using_timeout,
        } => check_single(request, prepared, values, using_timeout, now, deadline),
        Subject::Batch { batch, .. } => {
            check_group_commit(request, None, now, deadline)?;
            // A batch counts one write per distinct partition of a limited table.
            let parts = request
                .conn
                .with_keyspace(|ks| shard.engine.batch_limited_partitions(ks, batch));
            Ok(Checked {
                deadline,
                owner: None,
                limit: ask_owners_of(parts),
            })
        }
        Subject::Unknown(id) => Err(Rejection::Unprepared(id)),
    }
}

/// The logged-in role's permissions, from the connection's cache of decisions: with the
/// allow-all authorizer a flag test; with grants, a generation compare and a short scan.
fn check_permissions<V: BoundValues + ?Sized>(
    request: &Request,
    subject: &Subject<'_, V>,
) -> Result<(), Rejection> {
    let engine = &request.shard.engine;
    if !engine.auth().checks_permissions() {
        return Ok(());
    }
    let conn = &request.conn;
    let session = conn.session.borrow();
    let mut cache = conn.permissions.borrow_mut();
    let outcome = match subject {
        Subject::Single { prepared, .. } => {
            engine.check_access(session.user.as_ref(), &mut cache, prepared)
        }
        Subject::Batch { batch, .. } => engine.check_batch_access(
            session.user.as_ref(),
            &mut cache,
            session.keyspace.as_deref(),
            batch,
        ),
        Subject::Unknown(_) => Ok(()),
    };
    outcome.map_err(|denied| {
        let permission = denied.permission;
        *conn.denial.borrow_mut() = Some(denied);
        Rejection::Unauthorized(permission)
    })
}

/// A write is answered after the group fsync that makes it durable (`--durability batch`),
/// a wait shared by every write admitted meanwhile. A write expected to wait for it past its
/// deadline is expired now; one expected to wait longer than admission allows is turned away
/// `Overloaded` (see `ShardAdmission::turns_away_for_group_commit`), so that the fsync
/// covers the writes served in about the time it takes under a light load. `token` is the
/// write's partition, if it has one.
#[inline]
fn check_group_commit(
    request: &Request,
    token: Option<i64>,
    now: Instant,
    deadline: Instant,
) -> Result<(), Rejection> {
    let shard = &request.shard;
    if !shard.admission.borrow().watches_group_commit() {
        return Ok(());
    }
    let wait = shard.ack_barrier.group_commit_wait(token);
    if wait.expected.is_zero() {
        return Ok(());
    }
    // A wait too long to add to an instant ends past any deadline.
    if now
        .checked_add(wait.expected)
        .is_none_or(|done| done >= deadline)
    {
        shard.metrics.expired_group_commit.fetch_add(1, Relaxed);
        return Err(Rejection::Expired(RequestKind::Write));
    }
    let paced = !request.conn.pushing.get() && shard.admission.borrow().paces_windows();
    if shard
        .admission
        .borrow_mut()
        .turns_away_for_group_commit(wait, paced, &shard.metrics)
    {
        return Err(Rejection::Overloaded);
    }
    Ok(())
}

/// Routing, the group fsync's wait of a write, and the rate limiter of one statement.
fn check_single<V: BoundValues + ?Sized>(
    request: &Request,
    prepared: &Prepared,
    values: &V,
    using_timeout: Option<Duration>,
    now: Instant,
    deadline: Instant,
) -> Result<Checked, Rejection> {
    let shard = &request.shard;
    let route = shard
        .engine
        .route_with_timeout(prepared, values, using_timeout);
    if prepared.kind == OpKind::Write {
        check_group_commit(request, route.token, now, deadline)?;
    }
    let owner = route.token.map(|t| shard.owner_of(t));
    let remote = owner.filter(|&o| o != shard.id);
    if let Some(o) = remote {
        if shard.peers.get(o).is_none_or(|p| p.forwards.is_closed()) {
            return Err(Rejection::ShuttingDown);
        }
    }
    // The rate limiter counts a partition on the shard that owns it. Tables without a limit
    // skip all of it. `Checked` is built only on the way out, so a rejection drops nothing.
    let limit =
        if prepared.is_text_batch() || (route.token.is_none() && route.rate_limits.is_some()) {
            ask_owners_of(shard.engine.limited_partitions(prepared, values))
        } else if let (Some(token), Some(table), Some(rl), Some(op)) = (
            route.token,
            route.table,
            route.rate_limits,
            op_type(route.kind),
        ) {
            match rl.for_kind(route.kind) {
                Some(limit) => {
                    let mut limiter = shard.limiter.borrow_mut();
                    let check = LimitCheck {
                        table,
                        token,
                        op,
                        limit,
                        random: limiter.draw(),
                    };
                    if remote.is_some() {
                        LimitPlan::OnOwner(check)
                    } else if let LimitDecision::Reject(op) =
                        limiter.check(&check, &shard.engine, &shard.metrics)
                    {
                        return Err(Rejection::RateLimited(op));
                    } else {
                        LimitPlan::Done
                    }
                }
                None => LimitPlan::Done,
            }
        } else {
            LimitPlan::Done
        };
    Ok(Checked {
        deadline,
        owner,
        limit,
    })
}

/// The plan for the partitions of a multi-partition operation.
fn ask_owners_of(parts: Vec<LimitedPartition>) -> LimitPlan {
    if parts.is_empty() {
        LimitPlan::Done
    } else {
        LimitPlan::AskOwners(parts)
    }
}

/// The rate-limiter part of [`check`] that awaits: each partition of a multi-partition
/// operation is decided by the shard that owns it (this shard's at once, others' through a
/// round trip, paid only on limited tables).
pub async fn ask_owners(request: &Request, mut checked: Checked) -> Result<Checked, Rejection> {
    if let LimitPlan::AskOwners(parts) = &checked.limit {
        let decision = crate::limiter::check_partitions(&request.shard, parts).await;
        if let LimitDecision::Reject(op) = decision {
            return Err(Rejection::RateLimited(op));
        }
        checked.limit = LimitPlan::Done;
    }
    Ok(checked)
}
