//! Server-pushed EVENT frames (stream -1): schema changes from the engine's schema broadcast
//! and topology / status changes from its node events, each delivered to the connections
//! that REGISTERed for its type.

use std::rc::Rc;

use sluice_engine::NodeEvent;
use sluice_protocol::response::{encode_event, Event};
use sluice_protocol::EventType;
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::connection::ConnState;
use crate::shard::ShardCtx;

/// The event types a connection has REGISTERed for (REGISTER adds to them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Registered {
    schema: bool,
    topology: bool,
    status: bool,
}

impl Registered {
    /// These types plus `types`.
    pub fn with(mut self, types: &[EventType]) -> Registered {
        for t in types {
            match t {
                EventType::SchemaChange => self.schema = true,
                EventType::TopologyChange => self.topology = true,
                EventType::StatusChange => self.status = true,
            }
        }
        self
    }

    /// Whether any type is registered.
    pub fn any(self) -> bool {
        self.schema || self.topology || self.status
    }

    /// Whether `event` is of a registered type.
    pub fn wants(self, event: &Event) -> bool {
        match event {
            Event::SchemaChange(_) => self.schema,
            Event::TopologyChange(_) => self.topology,
            Event::StatusChange(_) => self.status,
        }
    }
}

/// Starts forwarding events to `conn`, filtered by what it has registered for at the time
/// each arrives; the task is aborted when the connection ends.
pub fn spawn_events(shard: &Rc<ShardCtx>, conn: &Rc<ConnState>) -> JoinHandle<()> {
    let mut schema = shard.engine.schema_events();
    let mut nodes = shard.engine.node_events();
    let conn = conn.clone();
    tokio::task::spawn_local(async move {
        loop {
            let received = tokio::select! {
                r = schema.recv() => r.map(Event::SchemaChange),
                r = nodes.recv() => r.map(|e| match e {
                    NodeEvent::Topology(t) => Event::TopologyChange(t),
                    NodeEvent::Status(s) => Event::StatusChange(s),
                }),
            };
            let event = match received {
                Ok(event) => event,
                // A slow connection missed events: drivers re-read the schema and the peers
                // on the next one anyway (and Rust's driver polls both), so skipping is safe.
                Err(RecvError::Lagged(n)) => {
                    debug!(missed = n, "events lagged");
                    continue;
                }
                Err(RecvError::Closed) => break,
            };
            if conn.registered.get().wants(&event) {
                let compression = conn.compression.get();
                conn.outbox.push(|b| encode_event(b, &event, compression));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::response::{StatusChange, TopologyChange};

    #[test]
    fn registration_accumulates_and_filters_by_type() {
        let addr = ([127, 0, 0, 2], 9042).into();
        let topology = Event::TopologyChange(TopologyChange::NewNode(addr));
        let status = Event::StatusChange(StatusChange::Down(addr));
        let none = Registered::default();
        assert!(!none.any() && !none.wants(&topology) && !none.wants(&status));
        let t = none.with(&[EventType::TopologyChange]);
        assert!(t.any() && t.wants(&topology) && !t.wants(&status));
        let both = t.with(&[EventType::StatusChange]);
        assert!(both.wants(&topology) && both.wants(&status));
    }
}
