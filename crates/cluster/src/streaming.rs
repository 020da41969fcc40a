//! Streaming: the records of a token range of a table move from a node that holds them to a
//! node that gains the range, over the Bulk class.
//!
//! The receiving node drives it: it plans which ranges it gains between two rings
//! ([`plan_gains`]), then pulls each one with [`VERB_STREAM_FETCH`] in chunks of at most
//! [`MAX_CHUNK_BYTES`], one chunk in flight, each with its own deadline, resuming from the
//! last key it applied when a call fails (after a retry, from the next source). A chunk is
//! applied and durable before the next is asked for, so memory stays at one chunk and a
//! failed stream keeps what it applied (applying a record twice changes nothing).
//!
//! The storage is reached through [`LocalData`], which the node's owner attaches once its
//! storage and schema are open.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use sluice_internode::{ConnectionClass, InboundMessage, InboundQueue, Messenger, Status};
use sluice_ring::{natural_replicas, NodeState, Replication, Token, TokenMetadata};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::verbs::{VERB_MUTATION, VERB_STREAM_FETCH};

/// Most key and value bytes one streamed chunk carries (plus at most one record over).
pub const MAX_CHUNK_BYTES: usize = 1 << 20;
/// How long one chunk may take, request to reply.
pub const CHUNK_DEADLINE: Duration = Duration::from_secs(30);
/// Attempts of one chunk at one source before the next source is tried.
const ATTEMPTS_PER_SOURCE: u32 = 3;
/// Pause between two attempts of one chunk.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// Fetch requests a node serves at once; more are answered `Overloaded` (and retried).
const MAX_FETCH_HANDLERS: usize = 4;

/// A table id, as storage names tables.
pub type TableKey = [u8; 16];

/// One stored record: its data key and encoded value.
pub type Record = (Vec<u8>, Vec<u8>);

/// A replicated table, with its keyspace's replication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamTable {
    /// The table's id.
    pub id: TableKey,
    /// Its keyspace's replication (never `Local`).
    pub replication: Replication,
}

/// A chunk of records in key order, and where the next one starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamChunk {
    /// Records in ascending key order.
    pub records: Vec<Record>,
    /// The last key of the chunk when the range has more; `None` when it is exhausted.
    pub resume_after: Option<Vec<u8>>,
}

/// What importing a chunk runs in.
pub type ImportFuture = Pin<Box<dyn Future<Output = Result<(), &'static str>> + Send>>;

/// This node's storage and schema, as streaming needs them.
pub trait LocalData: Send + Sync + 'static {
    /// The replicated tables (user keyspaces, not LocalStrategy).
    fn tables(&self) -> Vec<StreamTable>;
    /// The records of `table` with tokens in `(start, end]` (`start` `None`: from the smallest
    /// token), strictly after `after`, up to about `max_bytes`. Blocking: run it off the
    /// event loop.
    fn export(
        &self,
        table: TableKey,
        start: Option<i64>,
        end: i64,
        after: Option<&[u8]>,
        max_bytes: usize,
    ) -> Result<StreamChunk, &'static str>;
    /// Merges `records` of `table` into storage by timestamp; resolves once they are durable.
    fn import(&self, table: TableKey, records: Vec<Record>) -> ImportFuture;
    /// Bytes of data on disk. Blocking.
    fn load_bytes(&self) -> u64;
}

/// Where a node's [`LocalData`] is attached once it is open (handlers answer `Failed`
/// before).
pub type DataSlot = Arc<OnceLock<Arc<dyn LocalData>>>;

/// One range of one table to pull, with the nodes to pull it from, preferred first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// The table.
    pub table: TableKey,
    /// Tokens after this one (`None`: from the smallest token).
    pub start: Option<i64>,
    /// Up to and including this token.
    pub end: i64,
    /// Internode addresses of nodes that hold the range.
    pub sources: Vec<SocketAddr>,
}

/// What a stream moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamStats {
    /// Ranges pulled completely.
    pub ranges: u64,
    /// Ranges that could not be pulled from any source.
    pub failed_ranges: u64,
    /// Records applied.
    pub records: u64,
    /// Key and value bytes applied.
    pub bytes: u64,
}

impl StreamStats {
    /// Adds another stream's figures.
    pub fn add(&mut self, other: StreamStats) {
        self.ranges += other.ranges;
        self.failed_ranges += other.failed_ranges;
        self.records += other.records;
        self.bytes += other.bytes;
    }
}

/// `ring` with the node `host_id` in `state` (the node must be in it).
pub fn ring_with_state(
    ring: &TokenMetadata,
    host_id: Uuid,
    state: NodeState,
) -> Option<TokenMetadata> {
    let mut nodes = ring.nodes().to_vec();
    let node = nodes.iter_mut().find(|n| n.host_id == host_id)?;
    node.state = state;
    TokenMetadata::new(nodes).ok()
}

/// The ranges of every table that `me` replicates in `new` but not in `old`, each with the
/// nodes that replicate it in `old` as sources (`prefer` first, `avoid` left out, `me` never).
pub fn plan_gains(
    tables: &[StreamTable],
    old: &TokenMetadata,
    new: &TokenMetadata,
    me: Uuid,
    prefer: Option<Uuid>,
    avoid: Option<Uuid>,
) -> Vec<Transfer> {
    let mut bounds: Vec<i64> = old
        .tokens()
        .iter()
        .chain(new.tokens())
        .map(|t| t.0)
        .collect();
    bounds.sort_unstable();
    bounds.dedup();
    let mut plan = Vec::new();
    if bounds.is_empty() || new.index_of(me).is_none() {
        return plan;
    }
    let mut old_replicas = Vec::new();
    let mut new_replicas = Vec::new();
    for table in tables {
        if matches!(table.replication, Replication::Local) {
            continue;
        }
        for (i, &end) in bounds.iter().enumerate() {
            natural_replicas(new, &table.replication, Token(end), &mut new_replicas);
            if !new_replicas.iter().any(|r| new.node(*r).host_id == me) {
                continue;
            }
            natural_replicas(old, &table.replication, Token(end), &mut old_replicas);
            let hosts: Vec<&sluice_ring::Node> =
                old_replicas.iter().map(|r| old.node(*r)).collect();
            if hosts.iter().any(|n| n.host_id == me) {
                continue;
            }
            let mut sources: Vec<SocketAddr> = Vec::with_capacity(hosts.len());
            for wanted in [true, false] {
                for node in &hosts {
                    let preferred = prefer == Some(node.host_id);
                    if preferred == wanted && avoid != Some(node.host_id) {
                        sources.push(node.internode_address);
                    }
                }
            }
            let prev = bounds[if i == 0 { bounds.len() - 1 } else { i - 1 }];
            if prev < end {
                plan.push(Transfer {
                    table: table.id,
                    start: Some(prev),
                    end,
                    sources,
                });
            } else {
                // The range that wraps around the ring: (prev, max] and [min, end].
                plan.push(Transfer {
                    table: table.id,
                    start: Some(prev),
                    end: i64::MAX,
                    sources: sources.clone(),
                });
                plan.push(Transfer {
                    table: table.id,
                    start: None,
                    end,
                    sources,
                });
            }
        }
    }
    plan
}

/// Whether every table still has as many replicas as its replication factor asks for (per
/// data center) once `leaving` is gone: a decommission that would leave fewer is refused, as
/// Cassandra does.
pub fn enough_replicas_without(
    tables: &[StreamTable],
    ring: &TokenMetadata,
    leaving: Uuid,
) -> bool {
    let remaining = |dc: Option<&str>| {
        ring.nodes()
            .iter()
            .filter(|n| n.host_id != leaving && n.state == NodeState::Normal)
            .filter(|n| dc.is_none_or(|dc| n.dc == dc))
            .count()
    };
    tables.iter().all(|table| match &table.replication {
        Replication::Local => true,
        Replication::Simple { factor } => *factor as usize <= remaining(None),
        Replication::NetworkTopology { factors } => factors
            .iter()
            .all(|(dc, factor)| *factor as usize <= remaining(Some(dc))),
    })
}

/// Pulls every transfer of `plan` into `data`, one chunk at a time.
pub async fn run_plan(
    messenger: &Messenger,
    data: &Arc<dyn LocalData>,
    plan: &[Transfer],
) -> StreamStats {
    let mut stats = StreamStats::default();
    for transfer in plan {
        match pull(messenger, data, transfer).await {
            Ok(moved) => {
                stats.add(moved);
                stats.ranges += 1;
            }
            Err((moved, why)) => {
                stats.add(moved);
                stats.failed_ranges += 1;
                tracing::warn!(
                    start = ?transfer.start,
                    end = transfer.end,
                    sources = ?transfer.sources,
                    why,
                    "could not stream a range from any of its sources"
                );
            }
        }
    }
    stats
}

/// Pulls one range, resuming from the last applied key across failures and sources.
async fn pull(
    messenger: &Messenger,
    data: &Arc<dyn LocalData>,
    transfer: &Transfer,
) -> Result<StreamStats, (StreamStats, &'static str)> {
    let mut stats = StreamStats::default();
    let mut after: Option<Vec<u8>> = None;
    let mut last: &'static str = "no source";
    'sources: for source in &transfer.sources {
        let mut attempts = 0;
        loop {
            let request = FetchRequest {
                table: transfer.table,
                start: transfer.start,
                end: transfer.end,
                after: after.clone(),
                max_bytes: MAX_CHUNK_BYTES as u32,
            };
            let reply = messenger
                .call(
                    *source,
                    ConnectionClass::Bulk,
                    VERB_STREAM_FETCH,
                    request.encode(),
                    Instant::now() + CHUNK_DEADLINE,
                )
                .await;
            let chunk = match reply {
                Ok(body) => match decode_chunk(&body) {
                    Some(chunk) => chunk,
                    None => {
                        last = "malformed chunk";
                        continue 'sources;
                    }
                },
                Err(error) => {
                    last = error.message();
                    attempts += 1;
                    if attempts >= ATTEMPTS_PER_SOURCE {
                        continue 'sources;
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            };
            let resume = chunk.resume_after;
            let count = chunk.records.len() as u64;
            let bytes: usize = chunk.records.iter().map(|(k, v)| k.len() + v.len()).sum();
            if count > 0 {
                if let Err(why) = data.import(transfer.table, chunk.records).await {
                    // Local storage failed: another source will not help.
                    return Err((stats, why));
                }
                stats.records += count;
                stats.bytes += bytes as u64;
            }
            match resume {
                Some(key) => {
                    debug_assert!(after.as_ref().is_none_or(|a| *a < key), "progress");
                    after = Some(key);
                    attempts = 0;
                }
                None => return Ok(stats),
            }
        }
    }
    Err((stats, last))
}

/// Where the Bulk class's replayed hints go once the replica service runs: a bounded queue
/// of the MUTATION messages other coordinators replay to this node.
pub type HintSlot = Arc<OnceLock<tokio::sync::mpsc::Sender<InboundMessage>>>;

/// Serves the Bulk inbound queue: fetch requests for ranges of this node's data, and replayed
/// hints, handed to the replica service through `hints`. Messages before the data (or the
/// replica service) is attached are answered `Failed`; a hint that finds the replica
/// service's queue full is answered `Overloaded`, and its sender replays it later.
pub fn serve_bulk(mut bulk: InboundQueue, data: DataSlot, hints: HintSlot) -> JoinHandle<()> {
    debug_assert_eq!(bulk.class(), ConnectionClass::Bulk);
    let running = Arc::new(Semaphore::new(MAX_FETCH_HANDLERS));
    tokio::spawn(async move {
        while let Some(message) = bulk.recv().await {
            if message.verb == VERB_MUTATION {
                match hints.get() {
                    Some(replica) => {
                        if let Err(full) = replica.try_send(message) {
                            let (tokio::sync::mpsc::error::TrySendError::Full(message)
                            | tokio::sync::mpsc::error::TrySendError::Closed(message)) = full;
                            message.reply_status(Status::Overloaded);
                        }
                    }
                    None => message.reply_status(Status::Failed),
                }
                continue;
            }
            if message.verb != VERB_STREAM_FETCH {
                message.reply_status(Status::UnknownVerb);
                continue;
            }
            let Some(local) = data.get().cloned() else {
                message.reply_status(Status::Failed);
                continue;
            };
            let Ok(permit) = Arc::clone(&running).try_acquire_owned() else {
                message.reply_status(Status::Overloaded);
                continue;
            };
            tokio::spawn(async move {
                serve_fetch(local, message).await;
                drop(permit);
            });
        }
    })
}

async fn serve_fetch(data: Arc<dyn LocalData>, message: InboundMessage) {
    let Some(request) = FetchRequest::decode(&message.body) else {
        message.reply_status(Status::Failed);
        return;
    };
    let max_bytes = (request.max_bytes as usize).clamp(1, MAX_CHUNK_BYTES);
    let exported = tokio::task::spawn_blocking(move || {
        data.export(
            request.table,
            request.start,
            request.end,
            request.after.as_deref(),
            max_bytes,
        )
    })
    .await;
    match exported {
        Ok(Ok(chunk)) => message.reply(encode_chunk(&chunk)),
        Ok(Err(why)) => {
            tracing::warn!(why, "cannot export a range for streaming");
            message.reply_status(Status::Failed);
        }
        Err(_) => message.reply_status(Status::Failed),
    }
}

/// A request for one chunk of a range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FetchRequest {
    pub(crate) table: TableKey,
    pub(crate) start: Option<i64>,
    pub(crate) end: i64,
    pub(crate) after: Option<Vec<u8>>,
    pub(crate) max_bytes: u32,
}

/// Length marker of an absent key.
const ABSENT: u32 = u32::MAX;

impl FetchRequest {
    pub(crate) fn encode(&self) -> Bytes {
        let after_len = self.after.as_ref().map_or(0, Vec::len);
        let mut out = BytesMut::with_capacity(16 + 1 + 8 + 8 + 4 + after_len + 4);
        out.put_slice(&self.table);
        out.put_u8(u8::from(self.start.is_some()));
        out.put_i64(self.start.unwrap_or(0));
        out.put_i64(self.end);
        put_optional(&mut out, self.after.as_deref());
        out.put_u32(self.max_bytes);
        out.freeze()
    }

    pub(crate) fn decode(body: &[u8]) -> Option<FetchRequest> {
        let mut r = Reader(body);
        let table: TableKey = r.take(16)?.try_into().ok()?;
        let has_start = r.u8()?;
        let start = r.i64()?;
        let end = r.i64()?;
        let after = r.optional()?;
        let max_bytes = r.u32()?;
        if has_start > 1 || !r.0.is_empty() {
            return None;
        }
        Some(FetchRequest {
            table,
            start: (has_start == 1).then_some(start),
            end,
            after,
            max_bytes,
        })
    }
}

fn put_optional(out: &mut BytesMut, bytes: Option<&[u8]>) {
    match bytes {
        Some(b) => {
            out.put_u32(b.len() as u32);
            out.put_slice(b);
        }
        None => out.put_u32(ABSENT),
    }
}

/// Encodes a chunk: the resume key, the record count, then each key and value.
pub(crate) fn encode_chunk(chunk: &StreamChunk) -> Bytes {
    let payload: usize = chunk
        .records
        .iter()
        .map(|(k, v)| 8 + k.len() + v.len())
        .sum();
    let mut out = BytesMut::with_capacity(4 + 4 + payload + 64);
    put_optional(&mut out, chunk.resume_after.as_deref());
    out.put_u32(chunk.records.len() as u32);
    for (key, value) in &chunk.records {
        out.put_u32(key.len() as u32);
        out.put_slice(key);
        out.put_u32(value.len() as u32);
        out.put_slice(value);
    }
    out.freeze()
}

/// Decodes a chunk; `None` for anything malformed (a length past the end, trailing bytes).
pub(crate) fn decode_chunk(body: &[u8]) -> Option<StreamChunk> {
    let mut r = Reader(body);
    let resume_after = r.optional()?;
    let count = r.u32()? as usize;
    // Each record takes at least 8 bytes: a count past that is malformed, not a huge
    // allocation.
    if count > r.0.len() / 8 {
        return None;
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        let key_len = r.u32()? as usize;
        let key = r.take(key_len)?.to_vec();
        let value_len = r.u32()? as usize;
        let value = r.take(value_len)?.to_vec();
        records.push((key, value));
    }
    r.0.is_empty().then_some(StreamChunk {
        records,
        resume_after,
    })
}

/// A cursor over a message body; every read checks the length.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
    }

    fn i64(&mut self) -> Option<i64> {
        self.take(8)
            .and_then(|b| b.try_into().ok())
            .map(i64::from_be_bytes)
    }

    fn optional(&mut self) -> Option<Option<Vec<u8>>> {
        match self.u32()? {
            ABSENT => Some(None),
            n => self.take(n as usize).map(|b| Some(b.to_vec())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_ring::Node;

    fn node(i: u8, tokens: &[i64], state: NodeState) -> Node {
        Node {
            host_id: Uuid::from_u128(u128::from(i)),
            cql_address: format!("127.0.0.{i}:9042").parse().unwrap(),
            internode_address: format!("127.0.0.{i}:7000").parse().unwrap(),
            dc: "dc1".to_owned(),
            rack: "r1".to_owned(),
            tokens: tokens.iter().map(|t| Token(*t)).collect(),
            state,
        }
    }

    fn addr(i: u8) -> SocketAddr {
        format!("127.0.0.{i}:7000").parse().unwrap()
    }

    fn table(factor: u32) -> StreamTable {
        StreamTable {
            id: [factor as u8; 16],
            replication: Replication::Simple { factor },
        }
    }

    /// Each transfer's (start, end, sources), its table left out.
    fn ranges_of(plan: Vec<Transfer>) -> Vec<(Option<i64>, i64, Vec<SocketAddr>)> {
        plan.into_iter()
            .map(|t| (t.start, t.end, t.sources))
            .collect()
    }

    #[test]
    fn a_joining_node_gains_the_ranges_before_its_tokens_from_their_old_owners() {
        let nodes = vec![
            node(1, &[-100], NodeState::Normal),
            node(2, &[0], NodeState::Normal),
            node(3, &[100], NodeState::Normal),
            node(4, &[50], NodeState::Joining),
        ];
        let old = TokenMetadata::new(nodes).unwrap();
        let me = Uuid::from_u128(4);
        let new = ring_with_state(&old, me, NodeState::Normal).unwrap();
        let plan = plan_gains(&[table(1)], &old, &new, me, None, None);
        assert_eq!(
            plan,
            vec![Transfer {
                table: [1; 16],
                start: Some(0),
                end: 50,
                sources: vec![addr(3)],
            }]
        );
        // With RF 2 it also takes (-100, 0], held before by nodes 2 and 3.
        let ranges = ranges_of(plan_gains(&[table(2)], &old, &new, me, None, None));
        assert_eq!(
            ranges,
            vec![
                (Some(-100), 0, vec![addr(2), addr(3)]),
                (Some(0), 50, vec![addr(3), addr(1)]),
            ]
        );
        // A token below every other takes the range that wraps around the ring, in two parts.
        let wrapping = TokenMetadata::new(vec![
            node(1, &[-100], NodeState::Normal),
            node(2, &[0], NodeState::Normal),
            node(3, &[100], NodeState::Normal),
            node(5, &[-200], NodeState::Joining),
        ])
        .unwrap();
        let five = Uuid::from_u128(5);
        let joined = ring_with_state(&wrapping, five, NodeState::Normal).unwrap();
        let ranges = ranges_of(plan_gains(
            &[table(1)],
            &wrapping,
            &joined,
            five,
            None,
            None,
        ));
        assert_eq!(
            ranges,
            vec![
                (Some(100), i64::MAX, vec![addr(1)]),
                (None, -200, vec![addr(1)]),
            ]
        );
        // Nothing changes for a node that already owned its ranges.
        assert!(plan_gains(&[table(2)], &new, &new, me, None, None).is_empty());
    }

    #[test]
    fn a_leaving_nodes_ranges_go_to_their_new_replicas_from_it_first_or_never_when_dead() {
        let nodes = vec![
            node(1, &[-100], NodeState::Normal),
            node(2, &[0], NodeState::Normal),
            node(3, &[100], NodeState::Leaving),
        ];
        let old = TokenMetadata::new(nodes).unwrap();
        let leaving = Uuid::from_u128(3);
        let old = ring_with_state(&old, leaving, NodeState::Normal).unwrap();
        let new = ring_with_state(&old, leaving, NodeState::Left).unwrap();
        // Node 1 takes (0, 100] at RF 1, from the leaving node.
        let plan = plan_gains(
            &[table(1)],
            &old,
            &new,
            Uuid::from_u128(1),
            Some(leaving),
            None,
        );
        assert_eq!(
            plan,
            vec![Transfer {
                table: [1; 16],
                start: Some(0),
                end: 100,
                sources: vec![addr(3)],
            }]
        );
        assert!(plan_gains(&[table(1)], &old, &new, Uuid::from_u128(2), None, None).is_empty());
        // RF 2, node 3 dead: node 2 gains (100, -100] and pulls it from node 1 only.
        let plan = plan_gains(
            &[table(2)],
            &old,
            &new,
            Uuid::from_u128(2),
            None,
            Some(leaving),
        );
        assert!(!plan.is_empty());
        assert!(plan.iter().all(|t| t.sources == vec![addr(1)]), "{plan:?}");
    }

    #[test]
    fn a_node_may_leave_only_if_every_replication_factor_still_fits() {
        let ring = TokenMetadata::new(vec![
            node(1, &[-100], NodeState::Normal),
            node(2, &[0], NodeState::Normal),
            node(3, &[100], NodeState::Normal),
            node(4, &[50], NodeState::Joining),
        ])
        .unwrap();
        let three = Uuid::from_u128(3);
        assert!(enough_replicas_without(&[table(1), table(2)], &ring, three));
        // The joining node does not count: two normal nodes remain for RF 3.
        assert!(!enough_replicas_without(&[table(3)], &ring, three));
        let nts = |dc: &str, factor| StreamTable {
            id: [9; 16],
            replication: Replication::NetworkTopology {
                factors: vec![(dc.to_owned(), factor)],
            },
        };
        assert!(enough_replicas_without(&[nts("dc1", 2)], &ring, three));
        assert!(!enough_replicas_without(&[nts("dc1", 3)], &ring, three));
        assert!(!enough_replicas_without(&[nts("dc2", 1)], &ring, three));
    }

    #[test]
    fn chunks_and_requests_survive_the_wire_and_garbage_is_refused() {
        let chunk = StreamChunk {
            records: vec![(vec![1, 2], vec![]), (vec![3; 40], vec![9; 7])],
            resume_after: Some(vec![3; 40]),
        };
        let wire = encode_chunk(&chunk);
        assert_eq!(decode_chunk(&wire), Some(chunk));
        for cut in 0..wire.len() {
            assert_eq!(decode_chunk(&wire[..cut]), None, "cut at {cut}");
        }
        let mut longer = wire.to_vec();
        longer.push(0);
        assert_eq!(decode_chunk(&longer), None);
        assert_eq!(
            decode_chunk(&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),
            None
        );
        let request = FetchRequest {
            table: [5; 16],
            start: None,
            end: -3,
            after: Some(vec![0, 1]),
            max_bytes: 77,
        };
        let wire = request.encode();
        assert_eq!(FetchRequest::decode(&wire), Some(request));
        for cut in 0..wire.len() {
            assert_eq!(FetchRequest::decode(&wire[..cut]), None);
        }
    }
}
