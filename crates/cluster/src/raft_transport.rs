//! The metadata group's Raft messages over internode messaging.
//!
//! A Raft message is one `call` of [`VERB_RAFT`] on [`ConnectionClass::Control`], whose reply
//! is the receiver's answer. The Control class has its own connection, queue and inbound
//! handler queue per peer, so Raft heartbeats and votes never wait behind requests, responses
//! or streaming; this is by construction, as nothing here can pick another class.
//!
//! The receiving side, [`serve_raft`], owns the node's Control inbound queue and hands each
//! message to the meta node's [`RpcHandler`], the way `sluice_meta::memory::MemoryNetwork`
//! does in process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytes::Bytes;
use sluice_internode::{
    CallError, ConnectionClass, InboundMessage, InboundQueue, Messenger, Status,
};
use sluice_meta::{MetaTransport, RpcHandler, RpcKind, TransportError};
use tokio::task::JoinHandle;

use crate::verbs::VERB_RAFT;

/// Raft messages a node handles at once; beyond it a message is answered `Overloaded` at once
/// and its sender retries, so a burst of slow forwarded proposals cannot grow without bound.
pub const MAX_RAFT_HANDLERS: usize = 256;

/// The internode address of each node of the Raft group, by node id. It grows when a node
/// is added and shrinks when one is removed.
#[derive(Debug, Default)]
pub struct PeerDirectory {
    addrs: RwLock<HashMap<u64, SocketAddr>>,
}

impl PeerDirectory {
    /// An empty directory.
    pub fn new() -> PeerDirectory {
        PeerDirectory::default()
    }

    /// Records (or replaces) the internode address of `node`.
    pub fn insert(&self, node: u64, addr: SocketAddr) {
        self.write().insert(node, addr);
    }

    /// Forgets `node`, returning its address if it was known.
    pub fn remove(&self, node: u64) -> Option<SocketAddr> {
        self.write().remove(&node)
    }

    /// The internode address of `node`, if known.
    pub fn get(&self, node: u64) -> Option<SocketAddr> {
        self.read().get(&node).copied()
    }

    /// The number of nodes known.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True if no node is known.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<u64, SocketAddr>> {
        // A panic while holding the lock leaves the map consistent: recover it.
        self.addrs
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<u64, SocketAddr>> {
        self.addrs
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Sends the metadata group's Raft messages to other nodes through the messenger, always on
/// the Control class.
pub struct RaftTransport {
    messenger: Arc<Messenger>,
    directory: Arc<PeerDirectory>,
}

impl RaftTransport {
    /// A transport over `messenger` that finds nodes in `directory`.
    pub fn new(messenger: Arc<Messenger>, directory: Arc<PeerDirectory>) -> RaftTransport {
        RaftTransport {
            messenger,
            directory,
        }
    }

    /// The directory this transport looks nodes up in.
    pub fn directory(&self) -> &Arc<PeerDirectory> {
        &self.directory
    }
}

/// The address of `target`: the directory's, else the one in the group's membership (a node
/// added by another node before this one's directory heard of it).
fn resolve(directory: &PeerDirectory, target: u64, membership_addr: &str) -> Option<SocketAddr> {
    directory
        .get(target)
        .or_else(|| membership_addr.parse().ok())
}

impl MetaTransport for RaftTransport {
    async fn send(
        &self,
        target: u64,
        addr: &str,
        kind: RpcKind,
        body: Vec<u8>,
        deadline: Instant,
    ) -> Result<Vec<u8>, TransportError> {
        let peer = resolve(&self.directory, target, addr).ok_or(TransportError::Unreachable)?;
        let reply = self
            .messenger
            .call(
                peer,
                ConnectionClass::Control,
                VERB_RAFT,
                encode_message(kind, body),
                deadline,
            )
            .await
            .map_err(transport_error)?;
        Ok(Vec::from(reply))
    }
}

/// The wire body of a Raft message: the serialized message, then its kind. The kind goes last
/// so that the message is sent without copying it.
fn encode_message(kind: RpcKind, mut body: Vec<u8>) -> Bytes {
    body.push(kind.to_u8());
    Bytes::from(body)
}

/// The kind and serialized message of a wire body, if the kind is one.
fn decode_message(body: &[u8]) -> Option<(RpcKind, &[u8])> {
    let (&kind, message) = body.split_last()?;
    Some((RpcKind::from_u8(kind)?, message))
}

/// What the metadata group makes of a failed internode call.
fn transport_error(error: CallError) -> TransportError {
    match error {
        // Nobody there to run it: a node that is down, stopping, or not serving Raft yet.
        CallError::PeerDown | CallError::ShuttingDown | CallError::UnknownVerb => {
            TransportError::Unreachable
        }
        CallError::Timeout | CallError::Expired => TransportError::Timeout,
        CallError::QueueFull
        | CallError::Overloaded
        | CallError::Failed
        | CallError::TooManyInFlight
        | CallError::TooLarge
        | CallError::ReservedVerb
        | CallError::WrongClass => TransportError::Rejected(error.message()),
    }
}

/// Answers the Raft messages that arrive on `control` (the messenger's Control inbound queue)
/// with `handler`, until the messenger shuts down. Other verbs are answered `UnknownVerb`;
/// [`crate::control::serve_control`] serves more Control verbs beside Raft.
/// Call it on a tokio runtime: the service and its handlers are spawned there.
pub fn serve_raft(control: InboundQueue, handler: RpcHandler) -> JoinHandle<()> {
    crate::control::serve_control(control, handler, Vec::new())
}

/// Runs one Raft message through `handler` and answers it.
pub(crate) async fn handle_raft_message(handler: &RpcHandler, message: InboundMessage) {
    let body = message.body.clone();
    let Some((kind, request)) = decode_message(&body) else {
        message.reply_status(Status::Failed);
        return;
    };
    let deadline = message.deadline();
    match tokio::time::timeout_at(deadline.into(), handler.handle(kind, request)).await {
        Ok(Ok(reply)) => message.reply(Bytes::from(reply)),
        // The handler rejected a malformed message.
        Ok(Err(_)) => message.reply_status(Status::Failed),
        Err(_) => message.reply_status(Status::Expired),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_keeps_its_kind_and_bytes_across_the_wire() {
        let kinds = [
            RpcKind::AppendEntries,
            RpcKind::Vote,
            RpcKind::InstallSnapshot,
            RpcKind::Forward,
        ];
        for kind in kinds {
            let wire = encode_message(kind, b"{\"vote\":1}".to_vec());
            assert_eq!(
                decode_message(&wire),
                Some((kind, &b"{\"vote\":1}"[..])),
                "{kind:?}"
            );
        }
        let empty = encode_message(RpcKind::Vote, Vec::new());
        assert_eq!(decode_message(&empty), Some((RpcKind::Vote, &b""[..])));
    }

    #[test]
    fn malformed_wire_bodies_are_refused() {
        assert_eq!(decode_message(b""), None);
        assert_eq!(decode_message(b"{}\x00"), None);
        assert_eq!(decode_message(b"{}\x09"), None);
    }

    #[test]
    fn call_errors_map_to_what_raft_retries() {
        assert_eq!(
            transport_error(CallError::PeerDown),
            TransportError::Unreachable
        );
        assert_eq!(
            transport_error(CallError::UnknownVerb),
            TransportError::Unreachable
        );
        assert_eq!(
            transport_error(CallError::ShuttingDown),
            TransportError::Unreachable
        );
        assert_eq!(transport_error(CallError::Timeout), TransportError::Timeout);
        assert_eq!(transport_error(CallError::Expired), TransportError::Timeout);
        assert_eq!(
            transport_error(CallError::Overloaded),
            TransportError::Rejected("peer overloaded")
        );
        assert_eq!(
            transport_error(CallError::QueueFull),
            TransportError::Rejected("outbound queue full")
        );
    }

    #[test]
    fn the_directory_grows_shrinks_and_wins_over_the_membership_address() {
        let directory = PeerDirectory::new();
        assert!(directory.is_empty());
        let a: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let b: SocketAddr = "127.0.0.2:7000".parse().unwrap();
        directory.insert(1, a);
        directory.insert(2, b);
        assert_eq!(directory.len(), 2);
        assert_eq!(directory.get(2), Some(b));
        directory.insert(2, a);
        assert_eq!(
            directory.get(2),
            Some(a),
            "a node's new address replaces the old"
        );
        assert_eq!(directory.remove(2), Some(a));
        assert_eq!(directory.get(2), None);
        assert_eq!(directory.len(), 1);
        // The directory wins; the membership's address is the fallback, if it parses.
        assert_eq!(resolve(&directory, 1, "127.0.0.9:1"), Some(a));
        assert_eq!(resolve(&directory, 2, "127.0.0.2:7000"), Some(b));
        assert_eq!(resolve(&directory, 3, "not an address"), None);
    }
}
