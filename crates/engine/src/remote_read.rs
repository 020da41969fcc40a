//! Reads that this node cannot answer from its own storage alone.
//!
//! A single-partition SELECT on a node that is not a replica of the partition is forwarded,
//! whole and bound, to a live replica (an LWT, SERIAL read or transaction to a live replica of
//! every partition it reads), which runs it as the coordinator (digests, read repair,
//! paging) and answers its rows or its error: the client sees exactly what a replica
//! coordinator would have answered. A scan (no partition key) walks the token ring in order
//! and reads each run of ranges from this node when it is a replica of them, else from one
//! live replica, as storage pages; filtering, aggregates and paging stay here, so a page
//! resumes from its token on whichever node holds the next range.

use crate::catalog::{invalid, TableDef};
use crate::coordinator::{
    replication_of, requirement, Replica, ReplicaError, ReplicaTransport, ReplicaVerb,
};
use crate::replica_msg::{self, ForwardedResult, ForwardedStatement, ScanRequest};
use crate::{storage_error, Engine, Prepared, RequestContext};
use bytes::Bytes;
use sluice_protocol::{
    Consistency, DbError, DetailedError, QueryParameters, ResultMessage, Rows, RowsMetadata, Value,
};
use sluice_ring::{NodeIndex, Replication, Token, TokenMetadata};
use sluice_storage::{ScanPage, ScanStart};
use std::ops::Bound;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn replica_at(ring: &TokenMetadata, r: NodeIndex) -> Replica {
    let node = ring.node(r);
    Replica {
        host_id: node.host_id,
        internode: node.internode_address,
    }
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
            replica_at(ring, target),
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
/// ending where the run ends. Each range's replicas must be alive at `consistency`; the
/// range is read from one of them.
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
        let mut source_of = |i: usize| -> Result<Source, DetailedError> {
            let replicas = replicas_of(&ring, &replication, tokens[i % n].0);
            block_for = check_available(engine, &ring, &replication, &replicas, consistency)?;
            if me.is_some_and(|m| replicas.contains(&m)) {
                return Ok(Source::Local);
            }
            pick_live(engine, &ring, &replicas, &tried)
                .map(Source::Remote)
                .ok_or_else(|| remote_failure(consistency, block_for, tried.len()))
        };
        let source = source_of(first)?;
        // The run: the following ranges read from the same place, up to the scan's end.
        let mut last = first;
        while last < n && tokens[last].0 < to && source_of(last + 1)? == source {
            last += 1;
        }
        let run_end = if last == n { i64::MAX } else { tokens[last].0 };
        let (piece_end, final_piece) = if to <= run_end {
            (end, true)
        } else {
            (Bound::Included(run_end), false)
        };
        let page = match source {
            Source::Local => local(piece_end),
            Source::Remote(r) => {
                let body = replica_msg::encode_scan(&ScanRequest {
                    table: *t.id.as_bytes(),
                    start: start.clone(),
                    end: piece_end,
                    row_limit: (want as u32).clamp(1, MAX_SCAN_ROWS),
                    now_secs,
                });
                let call = transport.send(replica_at(&ring, r), ReplicaVerb::Scan, body, deadline);
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

/// Replica side of a remote scan: one storage page of the range asked for, with fewer rows
/// when the page would not fit a frame.
pub(crate) fn serve_scan(
    engine: &Engine,
    t: &TableDef,
    req: &ScanRequest,
) -> Result<Bytes, DetailedError> {
    let mut limit = req.row_limit.clamp(1, MAX_SCAN_ROWS) as usize;
    loop {
        let page = engine
            .storage()
            .scan(&t.layout, &req.start, req.end, limit, req.now_secs)
            .map_err(storage_error)?;
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
