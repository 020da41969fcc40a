//! Reads that this node cannot answer from its own storage alone.
//!
//! A single-partition SELECT on a node that is not a replica of the partition is forwarded,
//! whole and bound, to a live replica (an LWT, SERIAL read or transaction to a live replica of
//! every partition it reads), which runs it as the coordinator (digests, read repair,
//! paging) and answers its rows or its error: the client sees exactly what a replica
//! coordinator would have answered. The partitions of a multi-partition IN that this node
//! does not hold are read slice by slice from one of their replicas, which reconciles its
//! copy at the level first. A scan (no partition key) walks the token ring in order and reads
//! each run of ranges from this node when it is a replica of them, else from one live
//! replica, as storage pages; at a level above one, the pages of blockFor replicas are
//! reconciled. Filtering, aggregates and paging stay here, so a page resumes from its token
//! on whichever node holds the next range.

use crate::catalog::{invalid, TableDef};
use crate::coordinator::{
    choose_read_targets, read_failure, read_timeout, reconcile_partition, repair_partition,
    replication_of, requirement, Replica, ReplicaError, ReplicaTransport, ReplicaVerb, Requirement,
    Tally, TargetState,
};
use crate::replica_msg::{self, ForwardedResult, ForwardedStatement, ScanRequest, SliceRequest};
use crate::{storage_error, Engine, Prepared, RequestContext};
use bytes::Bytes;
use sluice_protocol::{
    Consistency, DbError, DetailedError, QueryParameters, ResultMessage, Rows, RowsMetadata, Value,
};
use sluice_ring::{NodeIndex, Replication, Token, TokenMetadata};
use sluice_storage::{
    ClusteringSlice, PartitionRead, ScanPage, ScanStart, StorageError, TableLayout,
};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How long a remote read waits when the request carries no deadline.
const DEFAULT_REMOTE_READ_WAIT: Duration = Duration::from_secs(5);

/// The part of a forwarded request's budget the replica leaves for its answer's trip back,
/// so that its own timeout (with its counts) reaches the client rather than this node's.
const FORWARD_REPLY_MARGIN: Duration = Duration::from_millis(20);

/// Most rows one remote scan request may ask for (a storage page's worth).
pub(crate) const MAX_SCAN_ROWS: u32 = 1000;

/// The largest encoded scan page a replica sends; a bigger one is read again with fewer rows
/// (internode frames are at most 16 MiB).
const MAX_SCAN_REPLY_BYTES: usize = 8 << 20;

/// The largest forwarded answer a replica sends (internode frames are at most 16 MiB).
const MAX_FORWARDED_REPLY_BYTES: usize = 15 << 20;

fn replicas_of(ring: &TokenMetadata, replication: &Replication, token: i64) -> Vec<NodeIndex> {
    let mut out = Vec::new();
    sluice_ring::natural_replicas(ring, replication, Token(token), &mut out);
    out
}

/// Whether this node can read `token` of `t` from its own storage: a one-node cluster, a
/// local-only keyspace, or a node that is one of the token's replicas.
pub(crate) fn reads_locally(engine: &Engine, t: &TableDef, token: i64) -> bool {
    if !engine.is_multi_node() || engine.replica_transport().is_none() {
        return true;
    }
    let replication = replication_of(engine, t);
    if replication == Replication::Local {
        return true;
    }
    let ring = engine.ring();
    let replicas = replicas_of(&ring, &replication, token);
    match ring.index_of(engine.node().host_id) {
        Some(me) => replicas.is_empty() || replicas.contains(&me),
        None => replicas.is_empty(),
    }
}

/// A live replica among `replicas` not in `tried`: one in this node's data center first.
fn pick_live(
    engine: &Engine,
    ring: &TokenMetadata,
    replicas: &[NodeIndex],
    tried: &[NodeIndex],
) -> Option<NodeIndex> {
    let my_dc = ring.dc_named(&engine.node().data_center);
    let live = |r: &&NodeIndex| !tried.contains(r) && engine.is_node_up(ring.node(**r).host_id);
    replicas
        .iter()
        .filter(live)
        .find(|r| Some(ring.dc_of(**r)) == my_dc)
        .or_else(|| replicas.iter().find(live))
        .copied()
}

/// Unavailable when fewer of `replicas` are alive than `consistency` needs.
fn check_available(
    engine: &Engine,
    ring: &TokenMetadata,
    replication: &Replication,
    replicas: &[NodeIndex],
    consistency: Consistency,
) -> Result<u32, DetailedError> {
    let req = requirement(
        consistency,
        replication,
        ring,
        &engine.node().data_center,
        false,
    )?;
    let me = ring.index_of(engine.node().host_id);
    let alive: Vec<(u16, bool)> = replicas
        .iter()
        .map(|&r| {
            let up = Some(r) == me || engine.is_node_up(ring.node(r).host_id);
            (ring.dc_of(r), up)
        })
        .collect();
    req.check_alive(&alive)
        .map_err(|e| DetailedError::new(e, "Cannot achieve consistency level"))?;
    Ok(req.block_for)
}

/// The timeout of a remote read that got no answer.
fn remote_timeout(consistency: Consistency, block_for: u32) -> DetailedError {
    DetailedError::new(
        DbError::ReadTimeout {
            consistency,
            received: 0,
            block_for: block_for as i32,
            data_present: false,
        },
        "Operation timed out - the replica asked did not answer in time",
    )
}

/// The failure of a remote read every live replica refused.
fn remote_failure(consistency: Consistency, block_for: u32, failures: usize) -> DetailedError {
    DetailedError::new(
        DbError::ReplicaReadFailure {
            consistency,
            received: 0,
            block_for: block_for as i32,
            failures: failures as i32,
            data_present: false,
        },
        "Operation failed - the replicas asked refused the read",
    )
}

/// Runs a single-partition SELECT on a live replica of `token` and answers what it answered.
/// A replica that refuses or cannot be reached is replaced by the next live one; silence
/// until the deadline is a Read_timeout.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward_select(
    engine: &Engine,
    transport: &Arc<dyn ReplicaTransport>,
    p: &Prepared,
    t: &TableDef,
    token: i64,
    values: &[Value],
    params: &QueryParameters,
    ctx: &RequestContext,
) -> Result<ResultMessage, DetailedError> {
    let ring = engine.ring();
    let replication = replication_of(engine, t);
    let replicas = replicas_of(&ring, &replication, token);
    let block_for = check_available(engine, &ring, &replication, &replicas, params.consistency)?;
    forward_to(
        engine,
        transport,
        &ring,
        &replicas,
        p,
        values,
        params,
        ctx,
        || remote_timeout(params.consistency, block_for),
        |tried| remote_failure(params.consistency, block_for, tried),
    )
    .await
}

/// Whether an LWT, SERIAL read or transaction reading `reads` must be coordinated by another
/// node: this node is not a replica of one of them (the transaction log then refuses it here).
pub(crate) fn txn_needs_forwarding(engine: &Engine, reads: &[(&TableDef, i64)]) -> bool {
    reads
        .iter()
        .any(|(t, token)| !reads_locally(engine, t, *token))
}

/// Why a statement cannot be forwarded: its partitions have no replica in common.
fn no_common_replica() -> DetailedError {
    invalid(
        "the partitions this transaction reads have no replica in common, and a transaction, \
         LWT or SERIAL read is coordinated by a replica of every partition it reads",
    )
}

/// Why a forwarded LWT, SERIAL read or transaction got no answer: every live common replica
/// refused it (drivers try the next host).
fn txn_forward_refused() -> DetailedError {
    DetailedError::new(
        DbError::Overloaded,
        "the replicas of the partitions this statement reads refused it; ask one of them",
    )
}

/// Runs an LWT, SERIAL read or transaction on a live node that replicates every partition in
/// `reads` and answers what it answered. `timeout` is the error of silence to the deadline.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward_txn(
    engine: &Engine,
    transport: &Arc<dyn ReplicaTransport>,
    p: &Prepared,
    reads: &[(&TableDef, i64)],
    values: &[Value],
    params: &QueryParameters,
    ctx: &RequestContext,
    timeout: fn(Consistency) -> DetailedError,
) -> Result<ResultMessage, DetailedError> {
    let ring = engine.ring();
    let mut common: Option<Vec<NodeIndex>> = None;
    for (t, token) in reads {
        let replicas = replicas_of(&ring, &replication_of(engine, t), *token);
        common = Some(match common {
            None => replicas,
            Some(mut c) => {
                c.retain(|r| replicas.contains(r));
                c
            }
        });
    }
    let common = common.unwrap_or_default();
    if common.is_empty() {
        return Err(no_common_replica());
    }
    let alive = common
        .iter()
        .filter(|r| engine.is_node_up(ring.node(**r).host_id))
        .count();
    if alive == 0 {
        return Err(DetailedError::new(
            DbError::Unavailable {
                consistency: params.consistency,
                required: 1,
                alive: 0,
            },
            "Cannot achieve consistency level: no replica of every partition read is alive",
        ));
    }
    forward_to(
        engine,
        transport,
        &ring,
        &common,
        p,
        values,
        params,
        ctx,
        || timeout(params.consistency),
        |_| txn_forward_refused(),
    )
    .await
}

/// Sends the bound statement to live ones of `replicas` (this data centre first) until one
/// answers, and answers its rows, Void or error. Silence until the deadline is `timeout()`;
/// every live replica refusing or unreachable is `failure(replicas tried)`.
#[allow(clippy::too_many_arguments)]
async fn forward_to(
    engine: &Engine,
    transport: &Arc<dyn ReplicaTransport>,
    ring: &TokenMetadata,
    replicas: &[NodeIndex],
    p: &Prepared,
    values: &[Value],
    params: &QueryParameters,
    ctx: &RequestContext,
    timeout: impl Fn() -> DetailedError,
    failure: impl Fn(usize) -> DetailedError,
) -> Result<ResultMessage, DetailedError> {
    let deadline = ctx
        .deadline
        .unwrap_or_else(|| Instant::now() + DEFAULT_REMOTE_READ_WAIT);
    let body = replica_msg::encode_forwarded_statement(&ForwardedStatement {
        keyspace: p.keyspace.clone(),
        query: p.query.clone(),
        consistency: params.consistency,
        serial_consistency: params.serial_consistency,
        default_timestamp: params.default_timestamp,
        now_micros: ctx.now_micros,
        page_size: params.page_size,
        paging_state: params.paging_state.clone(),
        skip_metadata: params.skip_metadata,
        values: values.to_vec(),
    });
    let mut tried: Vec<NodeIndex> = Vec::with_capacity(replicas.len());
    while let Some(target) = pick_live(engine, ring, replicas, &tried) {
        tried.push(target);
        let call = transport.send(
            Replica::at(ring, target),
            ReplicaVerb::Select,
            body.clone(),
            deadline,
        );
        match call.await {
            Ok(reply) => {
                let answer = replica_msg::decode_forwarded_answer(&reply)
                    .map_err(|_| failure(tried.len()))?;
                return Ok(match answer? {
                    ForwardedResult::Rows(rows) => ResultMessage::Rows(Rows {
                        metadata: RowsMetadata {
                            columns: p.result_columns.clone(),
                            column_count: rows.column_count as usize,
                            paging_state: rows.paging_state,
                            no_metadata: params.skip_metadata,
                        },
                        row_count: rows.row_count,
                        body: rows.body,
                    }),
                    ForwardedResult::Void => ResultMessage::Void,
                });
            }
            Err(ReplicaError::Timeout) => return Err(timeout()),
            Err(_) => continue,
        }
    }
    Err(failure(tried.len()))
}

/// The deadline a forwarded statement runs under on the replica: a little before the
/// coordinator's, so that the replica's own answer travels back in time.
pub(crate) fn forwarded_deadline(message_deadline: Instant) -> Instant {
    let now = Instant::now();
    let remaining = message_deadline.saturating_duration_since(now);
    now + remaining.saturating_sub(FORWARD_REPLY_MARGIN.min(remaining / 10))
}

/// Whether an encoded forwarded answer fits an internode frame.
pub(crate) fn forwarded_answer_fits(body: &Bytes) -> bool {
    body.len() <= MAX_FORWARDED_REPLY_BYTES
}

/// The smallest token a scan starting at `start` may return, or `None` when nothing can
/// follow it.
fn first_token(start: &ScanStart) -> Option<i64> {
    match start {
        ScanStart::Token(Bound::Unbounded) => Some(i64::MIN),
        ScanStart::Token(Bound::Included(t)) => Some(*t),
        ScanStart::Token(Bound::Excluded(t)) => t.checked_add(1),
        ScanStart::Resume { token, .. } => Some(*token),
    }
}

/// The largest token an end bound admits, or `None` when it admits none.
fn last_token(end: Bound<i64>) -> Option<i64> {
    match end {
        Bound::Unbounded => Some(i64::MAX),
        Bound::Included(t) => Some(t),
        Bound::Excluded(t) => t.checked_sub(1),
    }
}

/// Where one run of ring ranges is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Local,
    Remote(NodeIndex),
}

/// One storage page of a scan from `start` to `end`, read where the data lives: the run of
/// ring ranges from `start`'s range that this node holds (or that one live replica holds),
/// ending where the run ends. Each range's replicas must be alive at `consistency`. At ONE
/// the run is read from one replica; at a level that needs more, from blockFor live
/// replicas whose pages are reconciled ([`reconciled_page`]) on this node when it is one of
/// them, else on the replica asked.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn scan_page(
    engine: &Engine,
    t: &TableDef,
    start: &ScanStart,
    end: Bound<i64>,
    want: usize,
    now_secs: u32,
    consistency: Consistency,
    deadline: Option<Instant>,
) -> Result<ScanPage, DetailedError> {
    scan_page_from(
        engine,
        t,
        start,
        end,
        (want, now_secs),
        consistency,
        deadline,
        false,
    )
    .await
}

/// [`scan_page`]; `serving`: this node reconciles a page for another node, so the run must
/// start on a range it replicates (it never passes the scan on).
#[allow(clippy::too_many_arguments)]
async fn scan_page_from(
    engine: &Engine,
    t: &TableDef,
    start: &ScanStart,
    end: Bound<i64>,
    (want, now_secs): (usize, u32),
    consistency: Consistency,
    deadline: Option<Instant>,
    serving: bool,
) -> Result<ScanPage, DetailedError> {
    let local = |end: Bound<i64>| {
        engine
            .storage()
            .scan(&t.layout, start, end, want, now_secs)
            .map_err(storage_error)
    };
    if !engine.is_multi_node() {
        return local(end);
    }
    let Some(transport) = engine.replica_transport() else {
        return local(end);
    };
    let replication = replication_of(engine, t);
    let ring = engine.ring();
    if replication == Replication::Local || ring.is_empty() {
        return local(end);
    }
    let (Some(from), Some(to)) = (first_token(start), last_token(end)) else {
        return Ok(ScanPage::default());
    };
    if from > to {
        return Ok(ScanPage::default());
    }
    let req = requirement(
        consistency,
        &replication,
        &ring,
        &engine.node().data_center,
        false,
    )?;
    let me = ring.index_of(engine.node().host_id);
    let tokens = ring.tokens();
    let n = tokens.len();
    // Range `i` is (tokens[i - 1], tokens[i]]; range `n` is the wrap past the last token,
    // placed like range 0.
    let first = tokens.partition_point(|x| x.0 < from);
    let deadline = deadline.unwrap_or_else(|| Instant::now() + DEFAULT_REMOTE_READ_WAIT);
    let mut tried: Vec<NodeIndex> = Vec::new();
    loop {
        let mut block_for = 1;
        let mut source_of = |i: usize| -> Result<(Source, Vec<NodeIndex>), DetailedError> {
            let replicas = replicas_of(&ring, &replication, tokens[i % n].0);
            block_for = check_available(engine, &ring, &replication, &replicas, consistency)?;
            if me.is_some_and(|m| replicas.contains(&m)) {
                return Ok((Source::Local, replicas));
            }
            pick_live(engine, &ring, &replicas, &tried)
                .map(|r| (Source::Remote(r), replicas))
                .ok_or_else(|| remote_failure(consistency, block_for, tried.len()))
        };
        let (source, first_replicas) = source_of(first)?;
        if serving && source != Source::Local {
            return Err(invalid(
                "this node no longer replicates the range it was asked to reconcile",
            ));
        }
        // A level above one reads a local run from this node and blockFor - 1 live others,
        // the same targets a single-partition read of the run's first range asks.
        let peers: Vec<(NodeIndex, u16)> = match me {
            Some(m) if source == Source::Local && req.block_for > 1 => {
                let liveness: Vec<(NodeIndex, u16, bool)> = first_replicas
                    .iter()
                    .map(|&r| {
                        let up = r == m
                            || (engine.is_node_up(ring.node(r).host_id) && !tried.contains(&r));
                        (r, ring.dc_of(r), up)
                    })
                    .collect();
                let (chosen, tally) = choose_read_targets(&req, m, ring.dc_of(m), &liveness);
                if !tally.met() {
                    return Err(DetailedError::new(
                        DbError::ReplicaReadFailure {
                            consistency,
                            received: tally.received() as i32,
                            block_for: req.block_for as i32,
                            failures: tried.len() as i32,
                            data_present: true,
                        },
                        "Operation failed - replicas refused the scan",
                    ));
                }
                chosen[1..].to_vec()
            }
            _ => Vec::new(),
        };
        // The run: the following ranges read from the same place (and, reconciled, with the
        // same peers among their replicas), up to the scan's end.
        let mut last = first;
        while last < n && tokens[last].0 < to {
            let (next_source, replicas) = source_of(last + 1)?;
            if next_source != source || !peers.iter().all(|(p, _)| replicas.contains(p)) {
                break;
            }
            last += 1;
        }
        let run_end = if last == n { i64::MAX } else { tokens[last].0 };
        let (piece_end, final_piece) = if to <= run_end {
            (end, true)
        } else {
            (Bound::Included(run_end), false)
        };
        let page = match source {
            Source::Local if peers.is_empty() => local(piece_end),
            Source::Local => {
                let Some(m) = me else {
                    return Err(invalid("a local run without this node in the ring"));
                };
                let targets = ScanTargets {
                    ring: &ring,
                    req: &req,
                    me: m,
                    peers: &peers,
                };
                let piece = (start, piece_end, want, now_secs);
                match reconciled_page(engine, transport, t, &targets, piece, deadline).await {
                    Ok(page) => Ok(page),
                    Err(PeerScanError::Failed(r)) => {
                        tried.push(r);
                        continue;
                    }
                    Err(PeerScanError::Error(e)) => Err(e),
                }
            }
            Source::Remote(r) => {
                let body = replica_msg::encode_scan(&ScanRequest {
                    table: *t.id.as_bytes(),
                    start: start.clone(),
                    end: piece_end,
                    row_limit: (want as u32).clamp(1, MAX_SCAN_ROWS),
                    now_secs,
                    consistency,
                });
                let call = transport.send(Replica::at(&ring, r), ReplicaVerb::Scan, body, deadline);
                match call.await {
                    Ok(reply) => replica_msg::decode_scan_page(&reply)
                        .map_err(|_| remote_failure(consistency, block_for, 1)),
                    Err(ReplicaError::Timeout) => Err(remote_timeout(consistency, block_for)),
                    Err(_) => {
                        tried.push(r);
                        continue;
                    }
                }
            }
        };
        let mut page = page?;
        if page.next.is_none() && !final_piece {
            page.next = Some(ScanStart::Token(Bound::Excluded(run_end)));
        }
        return Ok(page);
    }
}

/// The replicas a reconciled scan page reads: this node and `peers`, under `req`.
struct ScanTargets<'a> {
    ring: &'a TokenMetadata,
    req: &'a Requirement,
    me: NodeIndex,
    peers: &'a [(NodeIndex, u16)],
}

/// Why a reconciled scan page has no answer.
enum PeerScanError {
    /// This peer refused or could not be reached: the page is read again without it.
    Failed(NodeIndex),
    /// The scan's answer (a timeout, a storage error).
    Error(DetailedError),
}

impl From<DetailedError> for PeerScanError {
    fn from(e: DetailedError) -> Self {
        PeerScanError::Error(e)
    }
}

/// One scan page read from this node and every peer at once, reconciled as Cassandra's range
/// reads are: the pages are compared over the positions every one of them covers, each
/// partition that differs is merged and written back by the single-partition read repair
/// ([`repair_partition`], storage's last-write-wins merge), and the page answered is this
/// node's storage read again, cut where the shortest page ended so that the next page
/// starts where every replica is compared again.
async fn reconciled_page(
    engine: &Engine,
    transport: &Arc<dyn ReplicaTransport>,
    t: &TableDef,
    targets: &ScanTargets<'_>,
    (start, end, want, now_secs): (&ScanStart, Bound<i64>, usize, u32),
    deadline: Instant,
) -> Result<ScanPage, PeerScanError> {
    let ring = targets.ring;
    let mut tally = Tally {
        req: targets.req.clone(),
        targets: std::iter::once((ring.dc_of(targets.me), TargetState::Acked))
            .chain(
                targets
                    .peers
                    .iter()
                    .map(|&(_, dc)| (dc, TargetState::Pending)),
            )
            .collect(),
    };
    let body = replica_msg::encode_scan(&ScanRequest {
        table: *t.id.as_bytes(),
        start: start.clone(),
        end,
        row_limit: (want as u32).clamp(1, MAX_SCAN_ROWS),
        now_secs,
        consistency: Consistency::One,
    });
    let mut replies = JoinSet::new();
    for (slot, &(r, _)) in targets.peers.iter().enumerate() {
        let call = transport.send(
            Replica::at(ring, r),
            ReplicaVerb::Scan,
            body.clone(),
            deadline,
        );
        replies.spawn(async move { (slot, call.await) });
    }
    let layout = &t.layout;
    let read_local = || {
        engine
            .storage()
            .scan(layout, start, end, want, now_secs)
            .map_err(storage_error)
    };
    let local = read_local()?;
    let mut pages: Vec<ScanPage> = vec![ScanPage::default(); targets.peers.len()];
    while let Some(joined) = tokio::time::timeout_at(deadline.into(), replies.join_next())
        .await
        .map_err(|_| read_timeout(&tally, true))?
    {
        let Ok((slot, result)) = joined else {
            return Err(read_failure(&tally, true).into());
        };
        let peer = targets.peers[slot].0;
        match result {
            Ok(reply) => {
                pages[slot] = replica_msg::decode_scan_page(&reply)
                    .map_err(|_| PeerScanError::Failed(peer))?;
                tally.targets[slot + 1].1 = TargetState::Acked;
            }
            Err(ReplicaError::Timeout) => return Err(read_timeout(&tally, true).into()),
            Err(_) => return Err(PeerScanError::Failed(peer)),
        }
    }
    // The cut: the earliest position where one of the pages stopped short of `end`.
    let mut cut: Option<(Vec<u8>, ScanStart)> = None;
    for next in std::iter::once(&local)
        .chain(&pages)
        .filter_map(|p| p.next.as_ref())
    {
        let Some(key) = resume_key(layout, next).map_err(storage_error)? else {
            continue;
        };
        if cut.as_ref().is_none_or(|(k, _)| key < *k) {
            cut = Some((key, next.clone()));
        }
    }
    let cut = cut.as_ref().map(|(k, s)| (k.as_slice(), s));
    // Each partition as each target holds it before the cut, by its storage key.
    let mut views: std::collections::BTreeMap<Vec<u8>, HeldBy> = std::collections::BTreeMap::new();
    let targets_n = pages.len() + 1;
    // The peers' pages are not needed after this; this node's may be the answer.
    for (i, page) in std::iter::once(local.clone()).chain(pages).enumerate() {
        let page = cut_page(layout, page, start, cut).map_err(storage_error)?;
        for p in page.partitions {
            let key = sluice_storage::keycodec::partition_prefix(p.token, &p.partition_key);
            let entry = views
                .entry(key)
                .or_insert_with(|| (p.token, p.partition_key.clone(), vec![None; targets_n]));
            let mut read = p.read;
            read.more = false;
            entry.2[i] = Some(read);
        }
    }
    let mut repaired = false;
    // Stored counter cells are per-replica deltas: they are compared but never merged (as on
    // the single-partition path).
    if !t.is_counter() {
        let mut stale: Vec<NodeIndex> = Vec::with_capacity(targets.peers.len());
        for (token, partition_key, held) in views.values() {
            stale.clear();
            stale.extend(
                held.iter()
                    .skip(1)
                    .zip(targets.peers)
                    .filter(|(h, _)| **h != held[0])
                    .map(|(_, &(r, _))| r),
            );
            if stale.is_empty() {
                continue;
            }
            repair_partition(
                engine,
                transport,
                ring,
                t,
                (*token, partition_key),
                &stale,
                &tally,
                deadline,
                None,
            )
            .await?;
            repaired = true;
        }
    }
    let page = if repaired { read_local()? } else { local };
    Ok(cut_page(layout, page, start, cut).map_err(storage_error)?)
}

/// One partition of a reconciled page: token, key, and its rows as each target holds them.
type HeldBy = (i64, Bytes, Vec<Option<PartitionRead>>);

/// The storage key a scan starting at `start` reads from (entries sort by these bytes), or
/// `None` when nothing can follow it.
fn resume_key(layout: &TableLayout, start: &ScanStart) -> Result<Option<Vec<u8>>, StorageError> {
    use sluice_storage::keycodec;
    Ok(match start {
        ScanStart::Token(Bound::Unbounded) => Some(Vec::new()),
        ScanStart::Token(Bound::Included(t)) => Some(keycodec::token_bytes(*t).to_vec()),
        ScanStart::Token(Bound::Excluded(t)) => t
            .checked_add(1)
            .map(|next| keycodec::token_bytes(next).to_vec()),
        ScanStart::Resume {
            token,
            partition_key,
            after,
        } => {
            let mut key = keycodec::partition_prefix(*token, partition_key);
            key.push(keycodec::KIND_ROW);
            if let Some(clustering) = after {
                keycodec::encode_clustering(&layout.clustering, clustering, &mut key)?;
                key.push(0x00);
            }
            Some(key)
        }
    })
}

/// `page` without what lies at or after `cut` (a storage key, and the scan start it came
/// from, which becomes the page's `next`); unchanged when it stopped before the cut. A
/// partition cut short is marked as having more; the partition `start` resumes, left with no
/// row, is dropped (storage returns it only while it has rows).
fn cut_page(
    layout: &TableLayout,
    page: ScanPage,
    start: &ScanStart,
    cut: Option<(&[u8], &ScanStart)>,
) -> Result<ScanPage, StorageError> {
    use sluice_storage::keycodec;
    let Some((cut_key, cut_start)) = cut else {
        return Ok(page);
    };
    if let Some(next) = &page.next {
        if resume_key(layout, next)?.is_some_and(|k| k.as_slice() <= cut_key) {
            return Ok(page);
        }
    }
    let resumed = match start {
        ScanStart::Resume {
            token,
            partition_key,
            ..
        } => Some((*token, partition_key)),
        ScanStart::Token(_) => None,
    };
    let mut out = ScanPage {
        partitions: Vec::with_capacity(page.partitions.len()),
        next: Some(cut_start.clone()),
    };
    for mut p in page.partitions {
        let mut key = keycodec::partition_prefix(p.token, &p.partition_key);
        if key.as_slice() >= cut_key {
            break;
        }
        key.push(keycodec::KIND_ROW);
        let base = key.len();
        let mut kept = 0;
        for row in &p.read.rows {
            key.truncate(base);
            keycodec::encode_clustering(&layout.clustering, &row.clustering, &mut key)?;
            if key.as_slice() >= cut_key {
                break;
            }
            kept += 1;
        }
        if kept < p.read.rows.len() {
            p.read.rows.truncate(kept);
            p.read.more = true;
        }
        let is_resumed = resumed.is_some_and(|(t, k)| t == p.token && *k == p.partition_key);
        if p.read.rows.is_empty() && (p.read.static_row.is_none() || is_resumed) {
            continue;
        }
        out.partitions.push(p);
    }
    Ok(out)
}

/// One slice of a partition for a read coordinated here: from storage when this node holds
/// the partition, else from a live replica (this data center first) that makes its copy
/// consistent at `consistency` first, as a forwarded read would. A replica that refuses or
/// cannot be reached is replaced by the next; silence to the deadline is a Read_timeout.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn read_partition_slice(
    engine: &Engine,
    t: &TableDef,
    (token, partition_key): (i64, &Bytes),
    slice: &ClusteringSlice,
    after: Option<&[Bytes]>,
    want: usize,
    now_secs: u32,
    (consistency, deadline): (Consistency, Option<Instant>),
) -> Result<PartitionRead, DetailedError> {
    let local = || {
        engine
            .storage()
            .read_partition(
                &t.layout,
                token,
                partition_key,
                slice,
                after,
                want,
                now_secs,
            )
            .map_err(storage_error)
    };
    let Some(transport) = engine.replica_transport() else {
        return local();
    };
    if reads_locally(engine, t, token) {
        return local();
    }
    let ring = engine.ring();
    let replication = replication_of(engine, t);
    let replicas = replicas_of(&ring, &replication, token);
    let block_for = check_available(engine, &ring, &replication, &replicas, consistency)?;
    let deadline = deadline.unwrap_or_else(|| Instant::now() + DEFAULT_REMOTE_READ_WAIT);
    let body = replica_msg::encode_slice(&SliceRequest {
        table: *t.id.as_bytes(),
        token,
        partition_key: partition_key.clone(),
        slice: slice.clone(),
        after: after.map(<[Bytes]>::to_vec),
        row_limit: (want as u32).clamp(1, MAX_SCAN_ROWS),
        now_secs,
        consistency,
    });
    let mut tried: Vec<NodeIndex> = Vec::with_capacity(replicas.len());
    while let Some(target) = pick_live(engine, &ring, &replicas, &tried) {
        tried.push(target);
        let call = transport.send(
            Replica::at(&ring, target),
            ReplicaVerb::Slice,
            body.clone(),
            deadline,
        );
        match call.await {
            Ok(reply) => {
                return replica_msg::decode_partition_read(&reply)
                    .map_err(|_| remote_failure(consistency, block_for, tried.len()))
            }
            Err(ReplicaError::Timeout) => return Err(remote_timeout(consistency, block_for)),
            Err(_) => continue,
        }
    }
    Err(remote_failure(consistency, block_for, tried.len()))
}

/// Replica side of a partition slice: the partition made consistent at the read's level
/// here, then read, with fewer rows when the answer would not fit a frame.
pub(crate) async fn serve_slice(
    engine: &Engine,
    t: &TableDef,
    req: &SliceRequest,
    deadline: Instant,
) -> Result<Bytes, DetailedError> {
    if !reads_locally(engine, t, req.token) {
        return Err(invalid("this node is not a replica of the partition"));
    }
    if let Some(transport) = engine.replica_transport() {
        let ctx = RequestContext {
            deadline: Some(forwarded_deadline(deadline)),
            now_micros: i64::from(req.now_secs) * 1_000_000,
            ack_barrier: None,
        };
        reconcile_partition(
            engine,
            transport,
            t,
            req.token,
            &req.partition_key,
            req.consistency,
            &ctx,
        )
        .await?;
    }
    let mut limit = req.row_limit.clamp(1, MAX_SCAN_ROWS) as usize;
    loop {
        let read = engine
            .storage()
            .read_partition(
                &t.layout,
                req.token,
                &req.partition_key,
                &req.slice,
                req.after.as_deref(),
                limit,
                req.now_secs,
            )
            .map_err(storage_error)?;
        let body = replica_msg::encode_partition_read(&read);
        if body.len() <= MAX_SCAN_REPLY_BYTES {
            return Ok(body);
        }
        if limit == 1 {
            return Err(invalid("A row is too large to send between nodes"));
        }
        limit = (limit / 4).max(1);
    }
}

/// Replica side of a remote scan: one storage page of the range asked for, with fewer rows
/// when the page would not fit a frame. A level above one is reconciled here, with this node
/// as the page's coordinator.
pub(crate) async fn serve_scan(
    engine: &Engine,
    t: &TableDef,
    req: &ScanRequest,
    deadline: Instant,
) -> Result<Bytes, DetailedError> {
    let mut limit = req.row_limit.clamp(1, MAX_SCAN_ROWS) as usize;
    let reconcile = !matches!(req.consistency, Consistency::One | Consistency::LocalOne);
    loop {
        let page = if reconcile {
            scan_page_from(
                engine,
                t,
                &req.start,
                req.end,
                (limit, req.now_secs),
                req.consistency,
                Some(forwarded_deadline(deadline)),
                true,
            )
            .await?
        } else {
            engine
                .storage()
                .scan(&t.layout, &req.start, req.end, limit, req.now_secs)
                .map_err(storage_error)?
        };
        let body = replica_msg::encode_scan_page(&page);
        if body.len() <= MAX_SCAN_REPLY_BYTES {
            return Ok(body);
        }
        if limit == 1 {
            return Err(invalid("A row is too large to send between nodes"));
        }
        limit = (limit / 4).max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::{Order, ReadRow, ScannedPartition};
    use sluice_types::{CqlType, NativeType};

    fn layout() -> TableLayout {
        TableLayout {
            id: [1; 16],
            clustering: vec![(CqlType::Native(NativeType::Int), Order::Asc)],
            regular: None,
            gc_grace_seconds: 0,
        }
    }

    fn row(ck: i32) -> ReadRow {
        ReadRow {
            clustering: vec![Bytes::copy_from_slice(&ck.to_be_bytes())],
            cells: Vec::new(),
            has_liveness: true,
        }
    }

    fn partition(token: i64, with_static: bool, cks: &[i32]) -> ScannedPartition {
        ScannedPartition {
            token,
            partition_key: Bytes::copy_from_slice(&token.to_be_bytes()),
            read: PartitionRead {
                static_row: with_static.then(|| ReadRow {
                    clustering: Vec::new(),
                    cells: Vec::new(),
                    has_liveness: false,
                }),
                rows: cks.iter().map(|&ck| row(ck)).collect(),
                more: false,
            },
        }
    }

    fn resume(token: i64, after: Option<i32>) -> ScanStart {
        ScanStart::Resume {
            token,
            partition_key: Bytes::copy_from_slice(&token.to_be_bytes()),
            after: after.map(|ck| vec![Bytes::copy_from_slice(&ck.to_be_bytes())]),
        }
    }

    /// Cuts a page of (static + rows 1..=3 at token -5) and (rows 1, 2 at token 7).
    fn cut_at(start: &ScanStart, cut: &ScanStart) -> ScanPage {
        let l = layout();
        let page = ScanPage {
            partitions: vec![
                partition(-5, true, &[1, 2, 3]),
                partition(7, false, &[1, 2]),
            ],
            next: None,
        };
        let key = resume_key(&l, cut).unwrap().unwrap();
        cut_page(&l, page, start, Some((&key, cut))).unwrap()
    }

    fn shape(page: &ScanPage) -> Vec<(i64, bool, usize, bool)> {
        page.partitions
            .iter()
            .map(|p| {
                let r = &p.read;
                (p.token, r.static_row.is_some(), r.rows.len(), r.more)
            })
            .collect()
    }

    #[test]
    fn a_page_is_cut_where_the_shortest_replica_page_stopped() {
        let from_start = ScanStart::Token(Bound::Unbounded);
        // Within a partition: the rows up to the cut's clustering key, marked as having more.
        let page = cut_at(&from_start, &resume(-5, Some(2)));
        assert_eq!(shape(&page), vec![(-5, true, 2, true)]);
        assert_eq!(page.next, Some(resume(-5, Some(2))));
        // After a counted static row: that partition's static row alone.
        let page = cut_at(&from_start, &resume(-5, None));
        assert_eq!(shape(&page), vec![(-5, true, 0, true)]);
        // At a later partition: the earlier one whole.
        let page = cut_at(&from_start, &resume(7, Some(1)));
        assert_eq!(
            shape(&page),
            vec![(-5, true, 3, false), (7, false, 1, true)]
        );
        // A resumed partition left without rows is dropped, as storage drops it.
        let page = cut_at(&resume(-5, Some(0)), &resume(-5, Some(0)));
        assert!(page.partitions.is_empty());
        // A page that stopped before the cut is left as it is.
        let l = layout();
        let stopped = ScanPage {
            partitions: vec![partition(-5, false, &[1])],
            next: Some(resume(-5, Some(1))),
        };
        let cut = resume(7, None);
        let key = resume_key(&l, &cut).unwrap().unwrap();
        let out = cut_page(&l, stopped.clone(), &from_start, Some((&key, &cut))).unwrap();
        assert_eq!(out, stopped);
        // Token bounds order before every partition of their token.
        let at_7 = resume_key(&l, &ScanStart::Token(Bound::Included(7))).unwrap();
        assert!(at_7 < resume_key(&l, &resume(7, None)).unwrap());
        assert_eq!(
            resume_key(&l, &ScanStart::Token(Bound::Excluded(i64::MAX))).unwrap(),
            None
        );
    }
}
