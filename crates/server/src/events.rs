//! Server-pushed EVENT frames (stream -1): schema changes from the engine's broadcast,
//! delivered to connections that REGISTERed for SCHEMA_CHANGE.

use std::rc::Rc;

use sluice_protocol::response::{encode_event, Event};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::connection::ConnState;
use crate::shard::ShardCtx;

/// Starts forwarding schema changes to `conn`; the task is aborted when the connection ends.
pub fn spawn_schema_events(shard: &Rc<ShardCtx>, conn: &Rc<ConnState>) -> JoinHandle<()> {
    let mut rx = shard.engine.schema_events();
    let conn = conn.clone();
    tokio::task::spawn_local(async move {
        loop {
            match rx.recv().await {
                Ok(change) => {
                    let compression = conn.compression.get();
                    let event = Event::SchemaChange(change);
                    conn.outbox.push(|b| encode_event(b, &event, compression));
                }
                // A slow connection missed events: drivers re-read the schema on the next
                // one anyway, so skipping is safe.
                Err(RecvError::Lagged(n)) => debug!(missed = n, "schema events lagged"),
                Err(RecvError::Closed) => break,
            }
        }
    })
}
