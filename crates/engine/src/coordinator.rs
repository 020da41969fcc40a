//! The coordinator: a statement's partitions are written to, and read from, their replicas
//! at the request's consistency level.
//!
//! The logic lives here, behind [`ReplicaTransport`], so that it runs with a fake transport
//! in tests; `sluice-cluster` carries the messages over internode and runs the replica side
//! ([`Engine::apply_replica_mutations`], [`Engine::replica_read`],
//! [`Engine::apply_replica_repair`]).
//!
//! Writes: every live replica gets the mutations (the local one applies them, which counts
//! as an acknowledgement); the coordinator answers once blockFor replicas acknowledged.
//! Reads: the local replica's raw partition is compared by digest with blockFor − 1 others;
//! on a mismatch the differing replicas' raw partitions are merged into the local one and the
//! result is written back to them before the statement runs locally (blocking read repair).

use crate::catalog::{invalid, TableDef};
use crate::replica_msg::{self, ReadKind, ReadRequest, RepairRequest};
use crate::{storage_error, Engine};
use bytes::Bytes;
use sluice_protocol::{Consistency, DbError, DetailedError, WriteType};
use sluice_ring::{NodeIndex, Replication, Token, TokenMetadata};
use sluice_storage::Mutation;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use uuid::Uuid;

/// How long a replicated write waits when the request carries no deadline.
pub(crate) const DEFAULT_WRITE_WAIT: Duration = Duration::from_secs(2);
/// How long a replicated read waits when the request carries no deadline.
const DEFAULT_READ_WAIT: Duration = Duration::from_secs(5);

/// A replica as the transport addresses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    /// The node's host id.
    pub host_id: Uuid,
    /// Its internode address.
    pub internode: SocketAddr,
}

impl Replica {
    /// The ring's node `r` as a message target.
    pub(crate) fn at(ring: &TokenMetadata, r: NodeIndex) -> Replica {
        let node = ring.node(r);
        Replica {
            host_id: node.host_id,
            internode: node.internode_address,
        }
    }
}

/// What a replica is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaVerb {
    /// Apply mutations ([`replica_msg::encode_mutations`]); the reply is empty.
    Mutation,
    /// Answer a digest or a raw partition ([`replica_msg::encode_read`]).
    Read,
    /// Merge a raw partition ([`replica_msg::encode_repair`]); the reply is empty.
    Repair,
    /// Truncate a table ([`replica_msg::encode_truncate`]); the reply is empty.
    Truncate,
    /// Run a SELECT, LWT, SERIAL read or transaction as its coordinator
    /// ([`replica_msg::encode_forwarded_statement`]); the reply is its rows, Void or error
    /// ([`replica_msg::encode_forwarded_answer`]).
    Select,
    /// Answer one storage page of a token range ([`replica_msg::encode_scan`]); the reply is
    /// [`replica_msg::encode_scan_page`].
    Scan,
    /// Answer a slice of one partition, made consistent at the read's level first
    /// ([`replica_msg::encode_slice`]); the reply is [`replica_msg::encode_partition_read`].
    Slice,
}

/// Why a replica did not answer with a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaError {
    /// The replica turned the request away (saturated, expired on arrival, unknown table):
    /// it counts as a failed replica at once.
    Refused,
    /// The request could not be sent (queue full, connection down): a failed replica too.
    Unreachable,
    /// No answer by the deadline.
    Timeout,
}

/// The future of one request to a replica: the reply body, or why there is none.
pub type ReplicaFuture = Pin<Box<dyn Future<Output = Result<Bytes, ReplicaError>> + Send>>;

/// Carries the coordinator's requests to other nodes.
pub trait ReplicaTransport: Send + Sync + 'static {
    /// Sends `body` to `to`; the future resolves with its reply, never after `deadline`.
    /// Called on a shard's thread: it must not block.
    fn send(&self, to: Replica, verb: ReplicaVerb, body: Bytes, deadline: Instant)
        -> ReplicaFuture;
}

/// Why a replica refused a request (the replica side's answer, mapped to a status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaRefusal {
    /// The body did not decode.
    Malformed(&'static str),
    /// A table this node does not know (its schema is behind or the table was dropped).
    UnknownTable,
    /// The deadline passed before storage work started.
    Expired,
    /// Storage refused or failed.
    Storage(&'static str),
}

/// What a consistency level needs of a token's replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The level asked for.
    pub consistency: Consistency,
    /// Acknowledgements needed (EACH_QUORUM: the sum over data centers, as drivers see it).
    pub block_for: u32,
    /// LOCAL_ONE / LOCAL_QUORUM on NetworkTopologyStrategy: only this data center counts.
    pub only_dc: Option<u16>,
    /// EACH_QUORUM on NetworkTopologyStrategy: each data center's own quorum.
    pub per_dc: Vec<(u16, u32)>,
}

fn quorum(n: u32) -> u32 {
    n / 2 + 1
}

/// blockFor exactly as Cassandra's `ConsistencyLevel.blockFor`: QUORUM over the sum of the
/// keyspace's factors, LOCAL_* in the coordinator's data center (SimpleStrategy: as the
/// global level), EACH_QUORUM per data center (SimpleStrategy: QUORUM).
pub fn requirement(
    consistency: Consistency,
    replication: &Replication,
    ring: &TokenMetadata,
    local_dc: &str,
    for_write: bool,
) -> Result<Requirement, DetailedError> {
    let total: u32 = match replication {
        Replication::Local => 1,
        Replication::Simple { factor } => *factor,
        Replication::NetworkTopology { factors } => factors.iter().map(|(_, rf)| rf).sum(),
    };
    let nts = matches!(replication, Replication::NetworkTopology { .. });
    let mut req = Requirement {
        consistency,
        block_for: 0,
        only_dc: None,
        per_dc: Vec::new(),
    };
    req.block_for = match consistency {
        Consistency::Any => {
            if !for_write {
                return Err(invalid("ANY ConsistencyLevel is only supported for writes"));
            }
            1
        }
        Consistency::One => 1,
        Consistency::Two => 2,
        Consistency::Three => 3,
        Consistency::Quorum => quorum(total),
        Consistency::All => total,
        Consistency::LocalOne | Consistency::LocalQuorum if nts => {
            req.only_dc = ring.dc_named(local_dc);
            if consistency == Consistency::LocalOne {
                1
            } else {
                quorum(replication.factor_in(local_dc))
            }
        }
        Consistency::LocalOne => 1,
        Consistency::LocalQuorum => quorum(total),
        Consistency::EachQuorum if nts => {
            if let Replication::NetworkTopology { factors } = replication {
                for (dc, rf) in factors {
                    if let Some(i) = ring.dc_named(dc) {
                        req.per_dc.push((i, quorum(*rf)));
                    }
                }
            }
            req.per_dc.iter().map(|(_, n)| n).sum()
        }
        Consistency::EachQuorum => quorum(total),
        // A serial read is a quorum read here (no Paxos round across replicas yet).
        Consistency::Serial if !for_write => quorum(total),
        Consistency::LocalSerial if !for_write => {
            if nts {
                req.only_dc = ring.dc_named(local_dc);
                quorum(replication.factor_in(local_dc))
            } else {
                quorum(total)
            }
        }
        Consistency::Serial | Consistency::LocalSerial => {
            return Err(invalid(
                "You must use conditional updates for serializable writes",
            ))
        }
    };
    Ok(req)
}

impl Requirement {
    /// Whether a replica in `dc` counts toward this level.
    fn counts(&self, dc: u16) -> bool {
        self.only_dc.is_none_or(|only| only == dc)
    }

    /// Adds one acknowledgement per pending replica in `dcs` that the level counts, as
    /// Cassandra's `blockForWrite` does (none for ANY; LOCAL_* count this data center's only;
    /// EACH_QUORUM the pending replica's own data center), so that a write acknowledged while
    /// a node joins or leaves still reaches blockFor replicas of the settled ring.
    pub fn add_pending(&mut self, dcs: impl Iterator<Item = u16>) {
        if self.consistency == Consistency::Any {
            return;
        }
        for dc in dcs {
            if !self.per_dc.is_empty() {
                if let Some(need) = self.per_dc.iter_mut().find(|(d, _)| *d == dc) {
                    need.1 += 1;
                    self.block_for += 1;
                }
            } else if self.counts(dc) {
                self.block_for += 1;
            }
        }
    }

    /// Unavailable when fewer replicas are alive than the level needs (per data center for
    /// EACH_QUORUM, reporting that data center's counts).
    pub fn check_alive(&self, replicas: &[(u16, bool)]) -> Result<(), DbError> {
        let unavailable = |required: u32, alive: u32| DbError::Unavailable {
            consistency: self.consistency,
            required: required as i32,
            alive: alive as i32,
        };
        if !self.per_dc.is_empty() {
            for &(dc, need) in &self.per_dc {
                let alive = replicas.iter().filter(|(d, up)| *d == dc && *up).count() as u32;
                if alive < need {
                    return Err(unavailable(need, alive));
                }
            }
            return Ok(());
        }
        let alive = replicas
            .iter()
            .filter(|(dc, up)| *up && self.counts(*dc))
            .count() as u32;
        if alive < self.block_for {
            return Err(unavailable(self.block_for, alive));
        }
        Ok(())
    }
}

/// Where one target replica stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetState {
    /// Asked, not answered yet.
    Pending,
    /// Acknowledged (or answered).
    Acked,
    /// Refused, unreachable or failed.
    Failed,
}

/// The targets of one partition under one requirement: (data center, state) per replica.
#[derive(Debug, Clone)]
pub struct Tally {
    /// The level's needs.
    pub req: Requirement,
    /// Each target's data center and state.
    pub targets: Vec<(u16, TargetState)>,
}

impl Tally {
    fn count(&self, dc: Option<u16>, state: TargetState) -> u32 {
        self.targets
            .iter()
            .filter(|(d, s)| *s == state && dc.is_none_or(|x| x == *d) && self.req.counts(*d))
            .count() as u32
    }

    /// Acknowledgements that count toward the level.
    pub fn received(&self) -> u32 {
        self.count(None, TargetState::Acked)
    }

    /// Failures among the targets that count.
    pub fn failures(&self) -> u32 {
        self.count(None, TargetState::Failed)
    }

    /// Whether the level is met.
    pub fn met(&self) -> bool {
        if !self.req.per_dc.is_empty() {
            return self
                .req
                .per_dc
                .iter()
                .all(|&(dc, need)| self.count(Some(dc), TargetState::Acked) >= need);
        }
        self.received() >= self.req.block_for
    }

    /// Whether failures made the level impossible (`blockfor + failed > total`).
    pub fn impossible(&self) -> bool {
        let possible = |dc: Option<u16>, need: u32| {
            let total = self
                .targets
                .iter()
                .filter(|(d, _)| dc.is_none_or(|x| x == *d) && self.req.counts(*d))
                .count() as u32;
            need + self.count(dc, TargetState::Failed) <= total
        };
        if !self.req.per_dc.is_empty() {
            return !self
                .req
                .per_dc
                .iter()
                .all(|&(dc, need)| possible(Some(dc), need));
        }
        !possible(None, self.req.block_for)
    }
}

/// The Write_failure error of a tally made impossible.
pub fn write_failure(t: &Tally, write_type: WriteType) -> DetailedError {
    DetailedError::new(
        DbError::ReplicaWriteFailure {
            consistency: t.req.consistency,
            received: t.received() as i32,
            block_for: t.req.block_for as i32,
            failures: t.failures() as i32,
            write_type,
        },
        "Operation failed - replicas refused the write",
    )
}

/// The Write_timeout error of a tally whose deadline passed.
pub fn write_timeout(t: &Tally, write_type: WriteType) -> DetailedError {
    DetailedError::new(
        DbError::WriteTimeout {
            consistency: t.req.consistency,
            received: t.received() as i32,
            block_for: t.req.block_for as i32,
            write_type,
        },
        "Operation timed out - received fewer acknowledgements than required",
    )
}

/// The Read_failure error of a tally made impossible.
pub fn read_failure(t: &Tally, data_present: bool) -> DetailedError {
    DetailedError::new(
        DbError::ReplicaReadFailure {
            consistency: t.req.consistency,
            received: t.received() as i32,
            block_for: t.req.block_for as i32,
            failures: t.failures() as i32,
            data_present,
        },
        "Operation failed - replicas refused the read",
    )
}

/// The Read_timeout error of a tally whose deadline passed.
pub fn read_timeout(t: &Tally, data_present: bool) -> DetailedError {
    DetailedError::new(
        DbError::ReadTimeout {
            consistency: t.req.consistency,
            received: t.received() as i32,
            block_for: t.req.block_for as i32,
            data_present,
        },
        "Operation timed out - received fewer responses than required",
    )
}

fn unavailable(e: DbError) -> DetailedError {
    DetailedError::new(e, "Cannot achieve consistency level")
}

/// The replicas of `token` under `replication` (the ring's natural replicas).
fn replicas_of(ring: &TokenMetadata, replication: &Replication, token: i64) -> Vec<NodeIndex> {
    let mut out = Vec::new();
    sluice_ring::natural_replicas(ring, replication, Token(token), &mut out);
    out
}

/// The pending replicas of `token` (nodes that take it over once the joining and leaving
/// nodes settle), given its natural `replicas`; empty while no node moves.
fn pending_of(
    settled: Option<&TokenMetadata>,
    replication: &Replication,
    token: i64,
    replicas: &[NodeIndex],
) -> Vec<NodeIndex> {
    let mut out = Vec::new();
    if let Some(settled) = settled {
        sluice_ring::pending_replicas(settled, replication, Token(token), replicas, &mut out);
    }
    out
}

/// One replicated write: each mutation's tally, and which mutations each replica holds.
pub(crate) struct WriteFanOut {
    tallies: Vec<Tally>,
    /// (replica, its position in each tally it belongs to: (mutation, target)).
    by_replica: Vec<(NodeIndex, Vec<(usize, usize)>)>,
    /// Replicas known to be down, with the mutations they would hold: they get hints.
    down: Vec<(NodeIndex, Vec<usize>)>,
    /// ANY with no live replica: the target that a stored hint acknowledges, per mutation.
    hint_acks: Vec<(usize, usize)>,
    me: Option<NodeIndex>,
}

impl WriteFanOut {
    fn mark(&mut self, replica: NodeIndex, state: TargetState) {
        if let Some((_, slots)) = self.by_replica.iter().find(|(r, _)| *r == replica) {
            for &(m, t) in slots {
                let slot = &mut self.tallies[m].targets[t].1;
                debug_assert_eq!(*slot, TargetState::Pending, "a replica answers once");
                *slot = state;
            }
        }
    }

    fn met(&self) -> bool {
        self.tallies.iter().all(Tally::met)
    }

    fn impossible(&self) -> Option<&Tally> {
        self.tallies.iter().find(|t| t.impossible())
    }

    /// The tally to report on a timeout: the first one not met.
    fn lagging(&self) -> Option<&Tally> {
        self.tallies.iter().find(|t| !t.met())
    }

    /// The most acknowledgements any one mutation needs.
    pub(crate) fn block_for(&self) -> u32 {
        self.tallies
            .iter()
            .map(|t| t.req.block_for)
            .max()
            .unwrap_or(1)
    }
}

/// The replication of a table's keyspace.
pub(crate) fn replication_of(engine: &Engine, t: &TableDef) -> Replication {
    engine
        .schema()
        .keyspaces
        .get(&t.keyspace)
        .and_then(|ks| Replication::from_map(&ks.replication).ok())
        .unwrap_or(Replication::Local)
}

/// Plans a write's fan-out: `None` when every mutation's only replica is this node (the
/// local write path runs, unchanged), Unavailable when too few replicas are alive.
pub(crate) fn plan_write(
    engine: &Engine,
    tables: &[&TableDef],
    muts: &[Mutation],
    consistency: Consistency,
) -> Result<Option<WriteFanOut>, DetailedError> {
    let rings = engine.rings();
    let ring = &rings.current;
    let me = ring.index_of(engine.node().host_id);
    let mut tallies = Vec::with_capacity(muts.len());
    let mut by_replica: Vec<(NodeIndex, Vec<(usize, usize)>)> = Vec::new();
    let mut down: Vec<(NodeIndex, Vec<usize>)> = Vec::new();
    let mut hint_acks = Vec::new();
    let mut remote = false;
    for (i, m) in muts.iter().enumerate() {
        let Some(t) = tables.iter().find(|t| *t.id.as_bytes() == m.table) else {
            return Err(invalid("Mutation for an unknown table"));
        };
        let replication = replication_of(engine, t);
        if replication == Replication::Local {
            return Ok(None);
        }
        let mut replicas = replicas_of(ring, &replication, m.token);
        let pending = pending_of(rings.settled.as_deref(), &replication, m.token, &replicas);
        let mut req = requirement(
            consistency,
            &replication,
            ring,
            &engine.node().data_center,
            true,
        )?;
        let up_of = |r: NodeIndex| {
            let up = Some(r) == me || engine.is_node_up(ring.node(r).host_id);
            (ring.dc_of(r), up)
        };
        let mut liveness: Vec<(u16, bool)> = replicas.iter().map(|&r| up_of(r)).collect();
        let mut targets = Vec::with_capacity(replicas.len() + pending.len());
        let hinting = engine.hinted_handoff() && engine.hints().is_some();
        let nobody_alive = liveness.iter().all(|&(_, up)| !up);
        let acked_by_hint =
            consistency == Consistency::Any && hinting && nobody_alive && !replicas.is_empty();
        if acked_by_hint {
            // ANY: a stored hint is the acknowledgement (Cassandra's rule).
            hint_acks.push((i, 0));
            targets.push((liveness[0].0, TargetState::Pending));
        } else {
            req.check_alive(&liveness).map_err(unavailable)?;
        }
        if !pending.is_empty() {
            // Pending replicas get the write and raise blockFor by one each; Cassandra then
            // checks the raised level against the live natural and pending replicas.
            liveness.extend(pending.iter().map(|&r| up_of(r)));
            replicas.extend_from_slice(&pending);
            req.add_pending(pending.iter().map(|&r| ring.dc_of(r)));
            if !acked_by_hint {
                req.check_alive(&liveness).map_err(unavailable)?;
            }
        }
        debug_assert_eq!(replicas.len(), liveness.len());
        for (&r, &(dc, up)) in replicas.iter().zip(&liveness) {
            // A replica known to be down gets no message, but a hint when hints are on.
            if !up {
                if hinting {
                    remote = true;
                    match down.iter_mut().find(|(x, _)| *x == r) {
                        Some((_, ms)) => ms.push(i),
                        None => down.push((r, vec![i])),
                    }
                }
                continue;
            }
            remote |= Some(r) != me;
            let slot = (i, targets.len());
            targets.push((dc, TargetState::Pending));
            match by_replica.iter_mut().find(|(x, _)| *x == r) {
                Some((_, slots)) => slots.push(slot),
                None => by_replica.push((r, vec![slot])),
            }
        }
        tallies.push(Tally { req, targets });
    }
    if !remote {
        return Ok(None);
    }
    Ok(Some(WriteFanOut {
        tallies,
        by_replica,
        down,
        hint_acks,
        me,
    }))
}

/// Writes `muts` to their replicas at `consistency` (`Ok(None)` once done); gives them back,
/// `Ok(Some(muts))`, when this node is their only replica and the caller applies them
/// locally as before.
pub(crate) async fn replicate_writes(
    engine: &Engine,
    transport: &std::sync::Arc<dyn ReplicaTransport>,
    entries: &[(&crate::analyze::WritePlan, &crate::exec::Binder<'_>)],
    muts: Vec<Mutation>,
    consistency: Consistency,
    write_type: WriteType,
    ctx: &crate::RequestContext,
) -> Result<Option<Vec<Mutation>>, DetailedError> {
    // A one-node cluster writes locally, as a single node always has (and allocates nothing
    // here).
    if !engine.is_multi_node() {
        return Ok(Some(muts));
    }
    let tables: Vec<&TableDef> = entries.iter().map(|(w, _)| &*w.table).collect();
    let Some(fan) = plan_write(engine, &tables, &muts, consistency)? else {
        return Ok(Some(muts));
    };
    run_write_fan_out(engine, transport, entries, &muts, fan, write_type, ctx).await?;
    Ok(None)
}

/// Whether the partitions of `muts` have different replica sets (natural and pending), so
/// that no one replica applies all of them; false when any table is node-local.
pub(crate) fn replica_sets_differ(
    engine: &Engine,
    tables: &[&TableDef],
    muts: &[Mutation],
) -> bool {
    let rings = engine.rings();
    let mut first: Option<Vec<NodeIndex>> = None;
    for m in muts {
        let Some(t) = tables.iter().find(|t| *t.id.as_bytes() == m.table) else {
            return false;
        };
        let replication = replication_of(engine, t);
        if replication == Replication::Local {
            return false;
        }
        let mut set = replicas_of(&rings.current, &replication, m.token);
        let pending = pending_of(rings.settled.as_deref(), &replication, m.token, &set);
        set.extend_from_slice(&pending);
        set.sort_unstable();
        match &first {
            None => first = Some(set),
            Some(f) if *f != set => return true,
            Some(_) => {}
        }
    }
    false
}

/// Sends a planned write to its replicas (the local part applied here) and waits for the
/// consistency level, the first failure that makes it impossible, or the deadline.
pub(crate) async fn run_write_fan_out(
    engine: &Engine,
    transport: &std::sync::Arc<dyn ReplicaTransport>,
    entries: &[(&crate::analyze::WritePlan, &crate::exec::Binder<'_>)],
    muts: &[Mutation],
    mut fan: WriteFanOut,
    write_type: WriteType,
    ctx: &crate::RequestContext,
) -> Result<(), DetailedError> {
    let deadline = ctx
        .deadline
        .unwrap_or_else(|| Instant::now() + DEFAULT_WRITE_WAIT);
    let ring = engine.ring();
    // The local part is applied first: it validates the write (limits, disk) before any
    // other replica is asked, and its durability is awaited with the replies.
    let mut local_wait = None;
    if let Some(me) = fan.me {
        if let Some((_, slots)) = fan.by_replica.iter().find(|(r, _)| *r == me) {
            let local: Vec<Mutation> = slots.iter().map(|&(m, _)| muts[m].clone()).collect();
            let ticket = crate::write::apply_now(engine, entries, local)?;
            local_wait = Some(Box::pin(crate::write::wait_until_durable(
                engine,
                ticket,
                ctx.ack_barrier,
            )));
        }
    }
    // Replicas count the admitted writes of rate-limited tables in this node's window.
    let rate_window = crate::rate_window_now();
    let mut replies = JoinSet::new();
    for (replica, slots) in &fan.by_replica {
        if Some(*replica) == fan.me {
            continue;
        }
        let to = Replica::at(&ring, *replica);
        let mine: Vec<&Mutation> = slots.iter().map(|&(m, _)| &muts[m]).collect();
        let body = replica_msg::encode_mutations(&mine, rate_window);
        let call = transport.send(to, ReplicaVerb::Mutation, body, deadline);
        let replica = *replica;
        replies.spawn(async move { (replica, call.await) });
    }
    let mut all_hinted = true;
    for (replica, ms) in &fan.down {
        let mine: Vec<&Mutation> = ms.iter().map(|&m| &muts[m]).collect();
        // A hint replayed more than a window later is not counted (the replica's clamp).
        let body = replica_msg::encode_mutations(&mine, rate_window);
        all_hinted &= engine
            .hints()
            .is_some_and(|h| h.store(ring.node(*replica).host_id, body));
    }
    let hint_state = if all_hinted {
        TargetState::Acked
    } else {
        TargetState::Failed
    };
    for &(m, t) in &fan.hint_acks {
        fan.tallies[m].targets[t].1 = hint_state;
    }
    let sleep = tokio::time::sleep_until(deadline.into());
    tokio::pin!(sleep);
    let outcome = loop {
        if fan.met() {
            break Ok(());
        }
        if let Some(t) = fan.impossible() {
            break Err(write_failure(t, write_type));
        }
        tokio::select! {
            done = async { local_wait.as_mut().expect("guarded").await }, if local_wait.is_some() => {
                local_wait = None;
                let state = if done.is_ok() { TargetState::Acked } else { TargetState::Failed };
                if let Some(me) = fan.me {
                    fan.mark(me, state);
                }
            }
            Some(joined) = replies.join_next() => {
                if let Ok((replica, result)) = joined {
                    match result {
                        Ok(_) => fan.mark(replica, TargetState::Acked),
                        Err(ReplicaError::Timeout) => {}
                        Err(_) => fan.mark(replica, TargetState::Failed),
                    }
                }
            }
            _ = &mut sleep => {
                let t = fan.lagging().unwrap_or(&fan.tallies[0]);
                break Err(write_timeout(t, write_type));
            }
        }
    };
    // Every live replica gets the write whatever the consistency level waited for: the calls
    // still outstanding run on (each bounded by the deadline) instead of being aborted.
    replies.detach_all();
    outcome
}

/// Makes this node's copy of one partition consistent at `consistency` before a read runs
/// on it locally: digests from blockFor − 1 other replicas, and on a mismatch blocking read
/// repair. ONE and LOCAL_ONE read locally with no message.
pub(crate) async fn reconcile_partition(
    engine: &Engine,
    transport: &std::sync::Arc<dyn ReplicaTransport>,
    t: &TableDef,
    token: i64,
    partition_key: &Bytes,
    consistency: Consistency,
    ctx: &crate::RequestContext,
) -> Result<(), DetailedError> {
    // A one-node cluster reads locally, as a single node always has.
    if !engine.is_multi_node() {
        return Ok(());
    }
    let ring = engine.ring();
    let replication = replication_of(engine, t);
    if replication == Replication::Local {
        return Ok(());
    }
    let req = requirement(
        consistency,
        &replication,
        &ring,
        &engine.node().data_center,
        false,
    )?;
    let replicas = replicas_of(&ring, &replication, token);
    let me = ring.index_of(engine.node().host_id);
    let Some(me) = me.filter(|m| replicas.contains(m)) else {
        if replicas.is_empty() {
            return Ok(());
        }
        // Reads run on a replica's own storage; a driver routing by token never lands here.
        return Err(DetailedError::new(
            DbError::Overloaded,
            "this node is not a replica of the partition; ask one of its replicas",
        ));
    };
    let liveness: Vec<(NodeIndex, u16, bool)> = replicas
        .iter()
        .map(|&r| {
            let up = r == me || engine.is_node_up(ring.node(r).host_id);
            (r, ring.dc_of(r), up)
        })
        .collect();
    let alive: Vec<(u16, bool)> = liveness.iter().map(|&(_, dc, up)| (dc, up)).collect();
    req.check_alive(&alive).map_err(unavailable)?;
    let (mut chosen, mut tally) = choose_read_targets(&req, me, ring.dc_of(me), &liveness);
    if chosen.len() <= 1 {
        // ONE / LOCAL_ONE on a replica: the local read is the answer.
        return Ok(());
    }
    for target in tally.targets.iter_mut().skip(1) {
        target.1 = TargetState::Pending;
    }
    let deadline = ctx
        .deadline
        .unwrap_or_else(|| Instant::now() + DEFAULT_READ_WAIT);
    let local = engine
        .storage()
        .read_raw_partition(*t.id.as_bytes(), token, partition_key)
        .map_err(read_storage_error)?;
    let local_digest = replica_msg::digest(&local);
    let request = ReadRequest {
        kind: ReadKind::Digest,
        table: *t.id.as_bytes(),
        token,
        partition_key: partition_key.clone(),
    };
    let body = replica_msg::encode_read(&request);
    let mut replies = JoinSet::new();
    for (slot, &(r, _)) in chosen.iter().enumerate().skip(1) {
        let call = transport.send(
            Replica::at(&ring, r),
            ReplicaVerb::Read,
            body.clone(),
            deadline,
        );
        replies.spawn(async move { (slot, call.await) });
    }
    // Live replicas not asked: one replaces a target that fails fast (a peer that died
    // before the failure detector noticed), so the read does not fail for want of asking.
    let mut spares: Vec<(NodeIndex, u16)> = liveness
        .iter()
        .filter(|&&(r, dc, up)| up && tally.req.counts(dc) && !chosen.iter().any(|(x, _)| *x == r))
        .map(|&(r, dc, _)| (r, dc))
        .collect();
    let mut stale: Vec<usize> = Vec::new();
    // Speculative retry: a spare is also asked when the targets are slower than replicas
    // usually are, within a budget of extra requests.
    let sent_at = Instant::now();
    let speculate_at = engine.speculation_point(sent_at, deadline);
    let mut speculated = false;
    engine.count_coordinated_read();
    while !tally.met() {
        if tally.impossible() {
            return Err(read_failure(&tally, true));
        }
        let wake = if speculated || spares.is_empty() {
            deadline
        } else {
            speculate_at.min(deadline)
        };
        let joined = tokio::time::timeout_at(wake.into(), replies.join_next()).await;
        let (slot, result) = match joined {
            Ok(Some(Ok(reply))) => reply,
            Err(_) if wake < deadline => {
                speculated = true;
                if engine.may_speculate() {
                    let spare = spares.remove(0);
                    ask_spare(spare, &mut chosen, &mut tally, &mut replies, |r| {
                        transport.send(
                            Replica::at(&ring, r),
                            ReplicaVerb::Read,
                            body.clone(),
                            deadline,
                        )
                    });
                }
                continue;
            }
            _ => return Err(read_timeout(&tally, true)),
        };
        tally.targets[slot].1 = match result {
            Ok(digest) => {
                engine.note_replica_read_latency(sent_at.elapsed());
                if digest[..] != local_digest[..] {
                    stale.push(slot);
                }
                TargetState::Acked
            }
            Err(ReplicaError::Timeout) => return Err(read_timeout(&tally, true)),
            Err(_) => {
                let failed_dc = chosen[slot].1;
                let same_dc = |dc: u16| tally.req.per_dc.is_empty() || dc == failed_dc;
                if let Some(i) = spares.iter().position(|&(_, dc)| same_dc(dc)) {
                    let spare = spares.remove(i);
                    ask_spare(spare, &mut chosen, &mut tally, &mut replies, |r| {
                        transport.send(
                            Replica::at(&ring, r),
                            ReplicaVerb::Read,
                            body.clone(),
                            deadline,
                        )
                    });
                }
                TargetState::Failed
            }
        };
    }
    // Stored counter cells are per-replica deltas that merge by adding: merging another
    // replica's partition would count its increments twice, so counters are not repaired.
    if stale.is_empty() || t.is_counter() {
        return Ok(());
    }
    let stale: Vec<NodeIndex> = stale.iter().map(|&slot| chosen[slot].0).collect();
    repair_partition(
        engine,
        transport,
        &ring,
        t,
        (token, partition_key),
        &stale,
        &tally,
        deadline,
        ctx.ack_barrier,
    )
    .await
}

/// The replicas a read at `req` asks: this node first, then live replicas (`liveness`:
/// index, data center, up) that help meet the level, with their tally (all acknowledged).
pub(crate) fn choose_read_targets(
    req: &Requirement,
    me: NodeIndex,
    my_dc: u16,
    liveness: &[(NodeIndex, u16, bool)],
) -> (Vec<(NodeIndex, u16)>, Tally) {
    // The targets: this node first, then live replicas that help meet the level.
    let mut chosen: Vec<(NodeIndex, u16)> = Vec::with_capacity(req.block_for as usize);
    let mut tally = Tally {
        req: req.clone(),
        targets: Vec::new(),
    };
    for &(r, dc, up) in std::iter::once(&(me, my_dc, true)).chain(liveness.iter()) {
        if !up || chosen.iter().any(|(x, _)| *x == r) {
            continue;
        }
        let helps = if tally.req.per_dc.is_empty() {
            tally.req.counts(dc)
        } else {
            tally
                .req
                .per_dc
                .iter()
                .any(|&(d, need)| d == dc && tally.count(Some(d), TargetState::Acked) < need)
        };
        if r != me && !helps {
            continue;
        }
        chosen.push((r, dc));
        tally.targets.push((dc, TargetState::Acked));
        if tally.met() {
            break;
        }
    }
    (chosen, tally)
}

/// Blocking read repair of one partition, shared by single-partition reads and scans: the
/// raw partitions of the `stale` replicas are merged into this node's copy by storage's
/// last-write-wins merge, then the merged partition is written back to them, all before the
/// read answers. Errors carry `tally`'s counts.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn repair_partition(
    engine: &Engine,
    transport: &std::sync::Arc<dyn ReplicaTransport>,
    ring: &TokenMetadata,
    t: &TableDef,
    (token, partition_key): (i64, &Bytes),
    stale: &[NodeIndex],
    tally: &Tally,
    deadline: Instant,
    ack_barrier: Option<sluice_storage::AckBarrierHeld>,
) -> Result<(), DetailedError> {
    let request = ReadRequest {
        kind: ReadKind::Data,
        table: *t.id.as_bytes(),
        token,
        partition_key: partition_key.clone(),
    };
    let body = replica_msg::encode_read(&request);
    let mut datas = JoinSet::new();
    for &r in stale {
        let call = transport.send(
            Replica::at(ring, r),
            ReplicaVerb::Read,
            body.clone(),
            deadline,
        );
        datas.spawn(call);
    }
    let layout = &t.layout;
    while let Some(joined) = tokio::time::timeout_at(deadline.into(), datas.join_next())
        .await
        .map_err(|_| read_timeout(tally, true))?
    {
        let reply = match joined {
            Ok(Ok(reply)) => reply,
            Ok(Err(ReplicaError::Timeout)) | Err(_) => return Err(read_timeout(tally, true)),
            Ok(Err(_)) => return Err(read_failure(tally, true)),
        };
        let raw = replica_msg::decode_raw(&reply).map_err(|_| read_failure(tally, true))?;
        let ticket = engine
            .storage()
            .apply_raw_partition(layout, token, partition_key, &raw)
            .map_err(read_storage_error)?;
        crate::write::wait_until_durable(engine, ticket, ack_barrier).await?;
    }
    let merged = engine
        .storage()
        .read_raw_partition(*t.id.as_bytes(), token, partition_key)
        .map_err(read_storage_error)?;
    let body = replica_msg::encode_repair(&RepairRequest {
        table: *t.id.as_bytes(),
        token,
        partition_key: partition_key.clone(),
        raw: merged,
    });
    let mut repairs = JoinSet::new();
    for &r in stale {
        let call = transport.send(
            Replica::at(ring, r),
            ReplicaVerb::Repair,
            body.clone(),
            deadline,
        );
        repairs.spawn(call);
    }
    while let Some(joined) = tokio::time::timeout_at(deadline.into(), repairs.join_next())
        .await
        .map_err(|_| read_timeout(tally, true))?
    {
        match joined {
            Ok(Ok(_)) => {}
            Ok(Err(ReplicaError::Timeout)) | Err(_) => return Err(read_timeout(tally, true)),
            Ok(Err(_)) => return Err(read_failure(tally, true)),
        }
    }
    engine.count_read_repair();
    Ok(())
}

/// What the hint store holds and has done.
pub use crate::hints::HintStats;

/// Adds `spare` to a read's targets and sends it the digest request `send` makes.
fn ask_spare(
    spare: (NodeIndex, u16),
    chosen: &mut Vec<(NodeIndex, u16)>,
    tally: &mut Tally,
    replies: &mut JoinSet<(usize, Result<Bytes, ReplicaError>)>,
    send: impl FnOnce(NodeIndex) -> ReplicaFuture,
) {
    chosen.push(spare);
    tally.targets.push((spare.1, TargetState::Pending));
    let slot = chosen.len() - 1;
    debug_assert_eq!(tally.targets.len(), chosen.len());
    let call = send(spare.0);
    replies.spawn(async move { (slot, call.await) });
}

/// Extra (speculative) read requests allowed per ten coordinated reads, plus a small burst.
const SPECULATION_PER_TEN_READS: u64 = 1;
const SPECULATION_BURST: u64 = 10;
/// The earliest a read speculates, whatever replicas' recent latency.
const MIN_SPECULATION_DELAY: Duration = Duration::from_millis(2);

/// Replica read latency and the speculation budget of one coordinator.
#[derive(Debug, Default)]
pub(crate) struct Speculation {
    /// Smoothed digest round trip, in nanoseconds (0 before the first).
    latency_nanos: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicU64,
    speculated: std::sync::atomic::AtomicU64,
}

impl Speculation {
    /// When a read sent at `sent` asks a spare: twice the smoothed round trip (at least
    /// `MIN_SPECULATION_DELAY`), never later than half the time to the deadline (Scylla's cap).
    pub(crate) fn point(&self, sent: Instant, deadline: Instant) -> Instant {
        use std::sync::atomic::Ordering::Relaxed;
        let half = deadline.saturating_duration_since(sent) / 2;
        let nanos = self.latency_nanos.load(Relaxed);
        let delay = if nanos == 0 {
            half
        } else {
            Duration::from_nanos(nanos.saturating_mul(2))
                .max(MIN_SPECULATION_DELAY)
                .min(half)
        };
        sent + delay
    }

    pub(crate) fn note_latency(&self, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let sample = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let old = self.latency_nanos.load(Relaxed);
        // An eighth of each new sample: races between shards only lose a sample.
        let next = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.latency_nanos.store(next.max(1), Relaxed);
    }

    pub(crate) fn count_read(&self) {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Takes one speculation from the budget (about one per ten reads), if any is left.
    pub(crate) fn take(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let reads = self.reads.load(Relaxed);
        let allowed = reads * SPECULATION_PER_TEN_READS / 10 + SPECULATION_BURST;
        self.speculated
            .fetch_update(Relaxed, Relaxed, |n| (n < allowed).then_some(n + 1))
            .is_ok()
    }

    pub(crate) fn speculated(&self) -> u64 {
        self.speculated.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A storage error on a replicated read's path: an oversized partition is a Read_failure.
fn read_storage_error(e: sluice_storage::StorageError) -> DetailedError {
    match e {
        sluice_storage::StorageError::TooLarge(m) => DetailedError::new(DbError::ReadFailure, m),
        other => storage_error(other),
    }
}
