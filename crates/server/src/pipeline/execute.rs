//! Execution: on this shard, or forwarded through a bounded channel to the shard that owns
//! the statement's partition (whose rate limiter then decides first).

use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use sluice_engine::{Prepared, RequestContext, Session};
use sluice_protocol::{DetailedError, QueryParameters, ResultMessage};
use tokio::sync::oneshot;

use super::check::{Checked, LimitPlan};
use super::classify::Statement;
use super::reply::Rejection;
use super::Request;
use crate::limiter::LimitCheck;
use crate::shard::{Forwarded, ShardCtx};

/// Why an execution produced no result.
#[derive(Debug)]
pub enum Failure {
    /// Turned away before it ran (by the owner shard's rate limiter, or the owner stopped).
    Rejected(Rejection),
    /// The engine's error.
    Error(DetailedError),
}

impl From<DetailedError> for Failure {
    fn from(e: DetailedError) -> Failure {
        Failure::Error(e)
    }
}

/// Runs a checked statement where it belongs and returns its result.
pub async fn execute(
    request: &Request,
    statement: Statement,
    checked: Checked,
) -> Result<ResultMessage, Failure> {
    debug_assert!(
        matches!(checked.limit, LimitPlan::Done | LimitPlan::OnOwner(_)),
        "the owners' limiters were asked before execution"
    );
    let shard = &request.shard;
    let conn = &request.conn;
    if let Some(delay) = shard.config.test_only_service_delay {
        // TEST ONLY: real service time in end-to-end overload tests.
        tokio::time::sleep(delay).await;
    }
    let ctx = RequestContext {
        deadline: Some(checked.deadline),
        now_micros: sluice_engine::now_micros(),
        // The connection's writer flushes the barrier before it sends any answer (a request
        // forwarded to another shard is answered through this connection's writer too).
        ack_barrier: Some(shard.ack_barrier.held()),
    };
    let mut session = conn.session.borrow().clone();
    match statement {
        Statement::Single {
            prepared, params, ..
        } => {
            let on_owner = match checked.limit {
                LimitPlan::OnOwner(c) => Some(c),
                _ => None,
            };
            let changes_auth = prepared.changes_auth;
            let result = match checked.owner {
                Some(owner) if owner != shard.id => {
                    let (s, r) =
                        forward(shard, owner, prepared, params, session, ctx, on_owner).await?;
                    session = s;
                    r?
                }
                _ => {
                    let result = shard
                        .engine
                        .execute(&mut session, &prepared, &params, &ctx)
                        .await;
                    shard.clock.executed();
                    result?
                }
            };
            if changes_auth {
                shard.metrics.auth_changes.fetch_add(1, Relaxed);
            }
            if let ResultMessage::SetKeyspace(_) = &result {
                *conn.session.borrow_mut() = session;
            }
            Ok(result)
        }
        Statement::Batch { batch, .. } => {
            let result = shard.engine.batch(&mut session, &batch, &ctx).await;
            shard.clock.executed();
            Ok(result?)
        }
        Statement::Unknown(id) => Err(Failure::Rejected(Rejection::Unprepared(id))),
    }
}

/// What the owner shard sends back: the session after execution and the result.
pub type ForwardedAnswer = (Session, Result<ResultMessage, Failure>);

/// Sends an execution to the shard that owns its partition and waits for the answer.
async fn forward(
    shard: &Rc<ShardCtx>,
    owner: usize,
    prepared: Arc<Prepared>,
    params: QueryParameters,
    session: Session,
    ctx: RequestContext,
    limit: Option<LimitCheck>,
) -> Result<ForwardedAnswer, Failure> {
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
    let stopped = Failure::Rejected(Rejection::ShuttingDown);
    let Some(peer) = shard.peers.get(owner) else {
        return Err(stopped);
    };
    // Bounded channel: a full owner queue makes this request wait (it holds its in-flight
    // units, so the connection's reader stops when enough of them wait).
    if peer.forwards.send(msg).await.is_err() {
        return Err(stopped);
    }
    rx.await.map_err(|_| stopped)
}
