//! TRUNCATE in a cluster: every node of the ring truncates the table, and the statement
//! answers only once all of them did, as Cassandra's `StorageProxy.truncateBlocking`: with a
//! node down it is refused before anything is truncated, and the client sees Cassandra's
//! Truncate_error ("Error during truncate: Cannot achieve consistency level ALL").

use crate::catalog::TableDef;
use crate::coordinator::{Replica, ReplicaError, ReplicaTransport, ReplicaVerb};
use crate::{replica_msg, storage_error, Engine};
use sluice_protocol::{DbError, DetailedError, ResultMessage};
use sluice_ring::NodeState;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How long a TRUNCATE waits for every node when the request carries no deadline.
const DEFAULT_TRUNCATE_WAIT: Duration = Duration::from_secs(10);

const UNAVAILABLE: &str = "Error during truncate: Cannot achieve consistency level ALL";
const FAILED: &str = "Error during truncate: a node could not truncate the table";
const TIMED_OUT: &str = "Error during truncate: Truncate timed out - not every node answered";

fn truncate_error(message: &'static str) -> DetailedError {
    DetailedError::new(DbError::TruncateError, message)
}

/// Truncates `table` on every node of the ring that holds data (normal, joining or leaving),
/// this one included; refused when one of them is down.
pub(crate) async fn everywhere(
    engine: &Engine,
    transport: &Arc<dyn ReplicaTransport>,
    table: &TableDef,
    deadline: Option<Instant>,
) -> Result<ResultMessage, DetailedError> {
    let ring = engine.ring();
    let me = engine.node().host_id;
    let peers: Vec<Replica> = ring
        .nodes()
        .iter()
        .filter(|n| n.state != NodeState::Left && n.host_id != me)
        .map(|n| Replica {
            host_id: n.host_id,
            internode: n.internode_address,
        })
        .collect();
    if peers.iter().any(|p| !engine.is_node_up(p.host_id)) {
        return Err(truncate_error(UNAVAILABLE));
    }
    let deadline = deadline.unwrap_or_else(|| Instant::now() + DEFAULT_TRUNCATE_WAIT);
    let body = replica_msg::encode_truncate(*table.id.as_bytes());
    let mut replies = JoinSet::new();
    for peer in peers {
        replies.spawn(transport.send(peer, ReplicaVerb::Truncate, body.clone(), deadline));
    }
    engine
        .storage()
        .truncate(*table.id.as_bytes())
        .map_err(storage_error)?;
    let mut outcome = Ok(ResultMessage::Void);
    while let Some(joined) = replies.join_next().await {
        let error = match joined {
            Ok(Ok(_)) => continue,
            Ok(Err(ReplicaError::Timeout)) => TIMED_OUT,
            Ok(Err(_)) | Err(_) => FAILED,
        };
        // The first failure answers; the other nodes still truncate (their calls run on).
        outcome = Err(truncate_error(error));
        break;
    }
    replies.detach_all();
    outcome
}
