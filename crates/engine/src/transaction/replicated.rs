//! Transactions and LWT across replicas, through the cluster's transaction log.
//!
//! On a multi-node cluster a transaction (or an LWT) is evaluated by its coordinator on its
//! own replica, read at a log index `read_at` it has applied (after a read barrier), and its
//! write set is proposed to the log with the partitions it read. Every node validates it in
//! log order (any read partition written by a transaction committed after `read_at` makes it
//! a conflict, and the coordinator reads and evaluates again) and writes the committed
//! mutations it replicates, with the timestamp the log assigned. The cluster side is reached
//! through [`TxnLog`]; the log reaches the engine through [`Engine::apply_logged_commit`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use sluice_protocol::{DbError, DetailedError};
use sluice_ring::Replication;
use sluice_storage::Mutation;

use crate::catalog::TableDef;
use crate::Engine;

/// A boxed future of the transaction log.
pub type TxnLogFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One partition as the log names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoggedPartition {
    /// The table's id.
    pub table: [u8; 16],
    /// The partition's token.
    pub token: i64,
    /// [`key_hash`] of the serialized partition key.
    pub key_hash: u64,
}

/// A transaction as proposed to the log.
#[derive(Clone, Debug)]
pub struct LoggedTxn {
    /// The log index its reads reflect (every commit up to it, perhaps some after).
    pub read_at: u64,
    /// The timestamp its mutations carry; the commit moves them to the log's.
    pub provisional: i64,
    /// The partitions it read.
    pub reads: Vec<LoggedPartition>,
    /// The partitions it writes.
    pub writes: Vec<LoggedPartition>,
    /// Its mutations, encoded as a replica MUTATION body.
    pub mutations: Bytes,
    /// Its mutations keep their timestamps (a logged batch's): the log moves none of them.
    pub keeps_timestamps: bool,
}

/// What the log decided for a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoggedDecision {
    /// Committed with this write timestamp.
    Committed {
        /// The timestamp the log assigned.
        timestamp: i64,
    },
    /// A partition it read was written after its read: nothing was written.
    Conflict,
}

/// Why the log did not decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnLogError {
    /// The group could not commit in time, or has no leader; the proposal may still commit.
    Unavailable(&'static str),
    /// The deadline passed; the proposal may still commit.
    Timeout,
    /// The transaction is larger than one log command.
    TooLarge,
}

/// The cluster's transaction log, as the engine uses it.
pub trait TxnLog: Send + Sync {
    /// A linearizable read barrier: once it returns `r`, this node has applied every commit
    /// up to `r`, which includes everything committed before the call.
    fn read_barrier(&self, deadline: Instant) -> TxnLogFuture<Result<u64, TxnLogError>>;

    /// The last log index this node has applied (its storage has every commit up to it).
    fn last_applied(&self) -> u64;

    /// Proposes `txn` (batched with this node's other ready transactions) and returns the
    /// log's decision once this node applied it.
    fn submit(
        &self,
        txn: LoggedTxn,
        deadline: Instant,
    ) -> TxnLogFuture<Result<LoggedDecision, TxnLogError>>;

    /// The largest encoded write set one transaction may carry.
    fn max_txn_bytes(&self) -> usize;
}

/// A 64-bit FNV-1a hash of a serialized partition key: deterministic on every node.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The partition of a mutation, as the log names it.
pub(crate) fn partition_of(m: &Mutation) -> LoggedPartition {
    LoggedPartition {
        table: m.table,
        token: m.token,
        key_hash: key_hash(&m.partition_key),
    }
}

/// Moves every timestamp of `m` by `delta` µs (the log's timestamp minus the provisional one).
fn shift_timestamps(m: &mut Mutation, delta: i64) {
    let shift = |ts: &mut i64| *ts = ts.saturating_add(delta);
    if let Some(d) = &mut m.partition_deletion {
        shift(d);
    }
    for rd in &mut m.range_deletions {
        shift(&mut rd.timestamp);
    }
    for row in m.static_row.iter_mut().chain(m.rows.iter_mut()) {
        if let Some(l) = &mut row.liveness {
            shift(&mut l.timestamp);
        }
        if let Some(d) = &mut row.deletion {
            shift(d);
        }
        for (_, ts) in &mut row.collection_deletions {
            shift(ts);
        }
        for c in &mut row.cells {
            shift(&mut c.timestamp);
        }
    }
}

/// The error of a transaction or LWT the log could not decide in time: Write_timeout with
/// write type CAS (what Cassandra answers for contention and Paxos timeouts).
pub(crate) fn cas_timeout(consistency: sluice_protocol::Consistency) -> DetailedError {
    crate::exec::write_timeout(consistency, sluice_protocol::WriteType::Cas)
}

/// Why a node cannot coordinate a transaction that reads a partition.
fn not_a_replica() -> DetailedError {
    DetailedError::new(
        DbError::Overloaded,
        "this node is not a replica of a partition the transaction reads; ask one of its replicas",
    )
}

fn missed_commits() -> DetailedError {
    DetailedError::new(
        DbError::Overloaded,
        "this node installed a metadata snapshot and may lack transaction writes; ask another replica",
    )
}

impl Engine {
    /// Routes this node's transactions and LWT on replicated tables through `log`. Set once;
    /// later calls are ignored and answer false.
    pub fn set_txn_log(&self, log: Arc<dyn TxnLog>) -> bool {
        self.txn_log.set(log).is_ok()
    }

    /// The transaction log when transactions on `tables` go through it: a multi-node cluster
    /// with a log, and at least one table replicated (not a node-local keyspace).
    pub(crate) fn txn_log_for<'t>(
        &self,
        tables: impl IntoIterator<Item = &'t TableDef>,
    ) -> Option<&Arc<dyn TxnLog>> {
        let log = self.txn_log.get()?;
        if !self.is_multi_node() {
            return None;
        }
        tables
            .into_iter()
            .any(|t| crate::coordinator::replication_of(self, t) != Replication::Local)
            .then_some(log)
    }

    /// Whether this node replicates `token` of `t` (every partition of a node-local table).
    fn replicates(&self, t: &TableDef, token: i64) -> bool {
        let replication = crate::coordinator::replication_of(self, t);
        if replication == Replication::Local {
            return true;
        }
        let ring = self.ring();
        let Some(me) = ring.index_of(self.node().host_id) else {
            return false;
        };
        let mut replicas = Vec::new();
        sluice_ring::natural_replicas(
            &ring,
            &replication,
            sluice_ring::Token(token),
            &mut replicas,
        );
        replicas.contains(&me)
    }

    /// Checks that this node can read the partitions `reads` for a transaction: it
    /// replicates them and its storage has every commit of the log.
    pub(crate) fn check_txn_reads(&self, reads: &[(&TableDef, i64)]) -> Result<(), DetailedError> {
        if self.txn_commits_missed.load(Ordering::Acquire) {
            return Err(missed_commits());
        }
        if reads.iter().all(|(t, token)| self.replicates(t, *token)) {
            Ok(())
        } else {
            Err(not_a_replica())
        }
    }

    /// Writes the parts of a committed logged transaction that this node replicates, with
    /// the log's timestamp. Called in log order on the metadata state machine's task; a
    /// replay after a restart writes the same cells with the same timestamps again.
    pub fn apply_logged_commit(&self, timestamp: i64, provisional: i64, mutations: &[u8]) {
        let body = Bytes::copy_from_slice(mutations);
        let muts = match crate::replica_msg::decode_mutations(&body) {
            Ok((_, muts)) => muts,
            Err(e) => {
                tracing::error!(
                    error = e.0,
                    "a committed transaction's writes do not decode"
                );
                return;
            }
        };
        let delta = timestamp.saturating_sub(provisional);
        let mut tables: Vec<Arc<TableDef>> = Vec::new();
        let mut mine = Vec::with_capacity(muts.len());
        for mut m in muts {
            let t = match tables.iter().find(|t| *t.id.as_bytes() == m.table) {
                Some(t) => Arc::clone(t),
                None => match self.table_by_id(&m.table) {
                    Some(t) => {
                        tables.push(Arc::clone(&t));
                        t
                    }
                    // Dropped since: its data is gone on every node.
                    None => continue,
                },
            };
            if self.replicates(&t, m.token) {
                shift_timestamps(&mut m, delta);
                mine.push(m);
            }
        }
        if mine.is_empty() {
            return;
        }
        let batch: Vec<(&sluice_storage::TableLayout, Mutation)> = mine
            .into_iter()
            .map(|m| {
                let t = tables.iter().find(|t| *t.id.as_bytes() == m.table);
                (&t.expect("every table was found above").layout, m)
            })
            .collect();
        self.note_write_timestamp(timestamp);
        // Odd while the commit is being written: its parts in different stores become visible
        // one after the other, and an evaluation that overlaps them reads again.
        let before = self.txn_apply_seq.fetch_add(1, Ordering::AcqRel);
        debug_assert!(
            before.is_multiple_of(2),
            "one logged commit is written at a time"
        );
        let applied = self.storage.apply(&batch);
        let after = self.txn_apply_seq.fetch_add(1, Ordering::AcqRel);
        debug_assert_eq!(after, before + 1);
        if let Err(e) = applied {
            // The log stays the truth: a restart replays it from the last snapshot.
            tracing::error!(error = %e, "a committed transaction's writes were not stored");
            self.txn_commits_missed.store(true, Ordering::Release);
        }
    }

    /// Makes every logged commit written so far durable (before a snapshot covers them).
    pub fn make_logged_commits_durable(&self) {
        if let Err(e) = self.storage.sync_all() {
            tracing::error!(error = %e, "transaction writes not made durable before a snapshot");
        }
    }

    /// Notes that a snapshot from another node replaced the log up to `index`: this node's
    /// storage may lack commits before it, so it coordinates no transaction read any more.
    pub fn note_logged_commits_skipped(&self, index: u64) {
        tracing::warn!(
            index,
            "installed a metadata snapshot: transaction writes before it may be missing here"
        );
        self.txn_commits_missed.store(true, Ordering::Release);
    }

    /// Transactions this coordinator proposed and the log found in conflict.
    pub fn txn_log_conflicts(&self) -> u64 {
        self.txn_log_conflicts.load(Ordering::Relaxed)
    }

    /// Transactions and writes this coordinator committed through the log.
    pub fn txn_log_commits(&self) -> u64 {
        self.txn_log_commits.load(Ordering::Relaxed)
    }
}

/// Before a SERIAL or LOCAL_SERIAL read of a logged table on a cluster: a read barrier, so
/// that this replica has applied every transaction committed before the read began, and the
/// check that it replicates the partitions read and lacks no commit.
pub(crate) async fn serial_read_barrier(
    engine: &Engine,
    t: &TableDef,
    b: &crate::exec::Binder<'_>,
    where_: &crate::analyze::Where,
    consistency: sluice_protocol::Consistency,
    ctx: &crate::RequestContext,
) -> Result<(), DetailedError> {
    let Some(log) = engine.txn_log_for(std::iter::once(t)) else {
        return Ok(());
    };
    if t.is_virtual() || !where_.pk_complete() {
        return Ok(());
    }
    let keys = crate::exec::partition_keys(b, t, where_)?;
    let parts: Vec<(&TableDef, i64)> = keys.iter().map(|pk| (t, pk.token)).collect();
    engine.check_txn_reads(&parts)?;
    let deadline = ctx
        .deadline
        .unwrap_or_else(|| Instant::now() + std::time::Duration::from_secs(2));
    match log.read_barrier(deadline).await {
        Ok(_) => Ok(()),
        Err(_) => Err(crate::exec::read_timeout(consistency)),
    }
}

/// Reads at a log index and proposes until the log commits, or the deadline passes (a
/// conflict reads and evaluates again). `evaluate` reads and evaluates on this node's
/// storage and answers the write set (nothing to propose when empty) with the result to
/// answer once committed.
pub(crate) async fn read_and_commit<T>(
    engine: &Engine,
    log: &Arc<dyn TxnLog>,
    deadline: Instant,
    timeout: impl Fn() -> DetailedError,
    mut evaluate: impl FnMut() -> Result<Evaluated<T>, DetailedError>,
) -> Result<T, DetailedError> {
    let map = |e: TxnLogError| match e {
        TxnLogError::TooLarge => crate::catalog::invalid(
            "The transaction's writes are larger than one transaction log entry",
        ),
        TxnLogError::Timeout | TxnLogError::Unavailable(_) => timeout(),
    };
    loop {
        if Instant::now() >= deadline {
            return Err(timeout());
        }
        let barrier = log.read_barrier(deadline).await.map_err(map)?;
        let mut spins = 0u32;
        let (read_at, evaluated) = loop {
            let before = engine.txn_apply_seq.load(Ordering::Acquire);
            if before.is_multiple_of(2) {
                // Everything applied here is in storage: reads reflect at least this index.
                let read_at = barrier.max(log.last_applied());
                let evaluated = evaluate()?;
                // No logged commit was written while it read: what it read is the state after
                // a prefix of the log, never part of a commit. The fence keeps the reads
                // before the second look at the sequence.
                std::sync::atomic::fence(Ordering::SeqCst);
                if engine.txn_apply_seq.load(Ordering::Acquire) == before {
                    break (read_at, evaluated);
                }
            }
            if Instant::now() >= deadline {
                return Err(timeout());
            }
            spins += 1;
            if spins < 16 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
            }
        };
        if evaluated.mutations.is_empty() {
            return Ok(evaluated.result);
        }
        let refs: Vec<&Mutation> = evaluated.mutations.iter().collect();
        let body = crate::replica_msg::encode_mutations(&refs, 0);
        if body.len() > log.max_txn_bytes() {
            return Err(map(TxnLogError::TooLarge));
        }
        let mut writes: Vec<LoggedPartition> =
            evaluated.mutations.iter().map(partition_of).collect();
        writes.sort_by_key(|p| (p.table, p.token, p.key_hash));
        writes.dedup();
        let txn = LoggedTxn {
            read_at,
            provisional: evaluated.provisional,
            reads: evaluated.reads,
            writes,
            mutations: body,
            keeps_timestamps: false,
        };
        match log.submit(txn, deadline).await.map_err(map)? {
            LoggedDecision::Committed { timestamp } => {
                engine.note_write_timestamp(timestamp);
                engine.txn_log_commits.fetch_add(1, Ordering::Relaxed);
                return Ok(evaluated.result);
            }
            LoggedDecision::Conflict => {
                engine.txn_log_conflicts.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Commits a write that read nothing (a plain write to a `transactional_mode = 'full'`
/// table) through the log: no read barrier, and it cannot conflict.
pub(crate) async fn commit_blind(
    engine: &Engine,
    log: &Arc<dyn TxnLog>,
    mutations: Vec<Mutation>,
    provisional: i64,
    deadline: Instant,
    timeout: impl Fn() -> DetailedError,
) -> Result<(), DetailedError> {
    let refs: Vec<&Mutation> = mutations.iter().collect();
    let body = crate::replica_msg::encode_mutations(&refs, 0);
    if body.len() > log.max_txn_bytes() {
        return Err(crate::catalog::invalid(
            "The write is larger than one transaction log entry",
        ));
    }
    let mut writes: Vec<LoggedPartition> = mutations.iter().map(partition_of).collect();
    writes.sort_by_key(|p| (p.table, p.token, p.key_hash));
    writes.dedup();
    let txn = LoggedTxn {
        read_at: log.last_applied(),
        provisional,
        reads: Vec::new(),
        writes,
        mutations: body,
        keeps_timestamps: false,
    };
    match log.submit(txn, deadline).await {
        Ok(LoggedDecision::Committed { timestamp }) => {
            engine.note_write_timestamp(timestamp);
            engine.txn_log_commits.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        // A write that read nothing never conflicts; answer as the deadline would.
        Ok(LoggedDecision::Conflict) | Err(_) => Err(timeout()),
    }
}

/// What one evaluation at a log index produced.
pub(crate) struct Evaluated<T> {
    /// The partitions read.
    pub(crate) reads: Vec<LoggedPartition>,
    /// The writes to propose (none: nothing to commit).
    pub(crate) mutations: Vec<Mutation>,
    /// The timestamp the mutations carry.
    pub(crate) provisional: i64,
    /// The answer once committed.
    pub(crate) result: T,
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_storage::{CellValue, CellWrite, Liveness, RowMutation};

    #[test]
    fn key_hash_is_fnv1a() {
        assert_eq!(key_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(key_hash(b"ab"), key_hash(b"ba"));
    }

    #[test]
    fn every_timestamp_moves_and_offsets_are_kept() {
        let mut m = Mutation {
            table: [1; 16],
            token: 5,
            partition_key: Bytes::from_static(b"k"),
            partition_deletion: Some(10),
            range_deletions: Vec::new(),
            static_row: None,
            rows: vec![RowMutation {
                clustering: Vec::new(),
                liveness: Some(Liveness {
                    timestamp: 10,
                    expiry: None,
                }),
                deletion: Some(9),
                collection_deletions: vec![(3, 9)],
                cells: vec![CellWrite {
                    column: 2,
                    path: None,
                    value: CellValue::Live(Bytes::from_static(b"v")),
                    timestamp: 10,
                    expiry: None,
                }],
            }],
        };
        shift_timestamps(&mut m, 1000);
        assert_eq!(m.partition_deletion, Some(1010));
        let row = &m.rows[0];
        assert_eq!(row.liveness.as_ref().unwrap().timestamp, 1010);
        assert_eq!(row.deletion, Some(1009));
        assert_eq!(row.collection_deletions, vec![(3, 1009)]);
        assert_eq!(row.cells[0].timestamp, 1010);
    }
}
