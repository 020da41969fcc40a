//! The transaction log on the metadata Raft group: LWT and multi-partition transactions
//! across replicas, validated deterministically when applied.
//!
//! A coordinator reads the partitions a transaction reads at a read barrier `read_at`,
//! evaluates it, and proposes its write set (a [`TxnBatch`] may carry several transactions of
//! one node). Every node applies the batch in log order: a transaction any of whose read
//! partitions was written by a committed transaction after `read_at` is a conflict (the
//! coordinator re-reads and retries); the others commit, each with a timestamp taken from the
//! log (monotonic), and their writes go to the engine through [`TxnFollower`], which writes
//! the parts this node replicates.
//!
//! Which partitions were written when is kept in a [`WriteTable`] with a byte budget: evicting
//! the oldest entry raises a low-water mark, and a read older than the mark counts as a
//! conflict, so eviction is the same on every node and never lets a stale read commit.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sluice_meta::MetaError;

/// The first byte of a transaction command.
pub const TXN_TAG: u8 = 3;

/// The encoding version after the tag (and of the snapshot).
const TXN_VERSION: u8 = 1;

/// The command version whose transactions carry a flags byte: only commands with a logged
/// batch use it, so every other command keeps the first version's bytes.
const TXN_FLAGS_VERSION: u8 = 2;

/// Flag: the transaction keeps the timestamps it carries.
const FLAG_KEEPS_TIMESTAMPS: u8 = 1;

/// The default byte budget of the write table (about 100,000 partitions).
pub const DEFAULT_WRITE_TABLE_BYTES: usize = 8 << 20;

/// Most transactions in one batch.
pub const MAX_BATCH_TRANSACTIONS: usize = 1024;

/// Most partitions one transaction reads or writes.
pub const MAX_PARTITIONS: usize = 4096;

/// One partition of one table, as the log names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionRef {
    /// The table's id.
    pub table: [u8; 16],
    /// The partition's token.
    pub token: i64,
    /// A hash of the partition key's bytes, so that two keys with one token stay apart.
    pub key_hash: u64,
}

/// What a table entry costs: the ordered entry and the map entry, with the map's overhead.
pub const WRITE_TABLE_ENTRY_BYTES: usize =
    std::mem::size_of::<(u64, PartitionRef)>() + std::mem::size_of::<(PartitionRef, u64)>() + 16;

/// Partition → log index of the last committed transaction write, byte-bounded.
#[derive(Debug)]
pub struct WriteTable {
    max_entries: usize,
    last_write: HashMap<PartitionRef, u64>,
    /// Writes in log order, for eviction; an entry superseded by a later write of the same
    /// partition stays until evicted (and is counted).
    order: VecDeque<(u64, PartitionRef)>,
    /// Every write at or below this index may have been forgotten.
    low_water: u64,
}

impl WriteTable {
    /// An empty table within `max_bytes` (at least one entry).
    pub fn new(max_bytes: usize) -> WriteTable {
        WriteTable {
            max_entries: (max_bytes / WRITE_TABLE_ENTRY_BYTES).max(1),
            last_write: HashMap::new(),
            order: VecDeque::new(),
            low_water: 0,
        }
    }

    /// Whether a transaction that read `reads` at `read_at` must not commit now.
    pub fn conflicts(&self, read_at: u64, reads: &[PartitionRef]) -> bool {
        if reads.is_empty() {
            return false;
        }
        if read_at < self.low_water {
            return true;
        }
        reads
            .iter()
            .any(|p| self.last_write.get(p).is_some_and(|&at| at > read_at))
    }

    /// Records that a transaction committed at `index` wrote `writes`.
    pub fn record(&mut self, index: u64, writes: &[PartitionRef]) {
        for p in writes {
            debug_assert!(self.last_write.get(p).is_none_or(|&at| at <= index));
            self.last_write.insert(*p, index);
            self.order.push_back((index, *p));
            while self.order.len() > self.max_entries {
                self.evict_oldest();
            }
        }
        debug_assert!(self.order.len() <= self.max_entries);
        debug_assert!(self.last_write.len() <= self.order.len());
    }

    fn evict_oldest(&mut self) {
        let Some((at, p)) = self.order.pop_front() else {
            return;
        };
        if self.last_write.get(&p) == Some(&at) {
            self.last_write.remove(&p);
        }
        self.low_water = self.low_water.max(at);
    }

    /// The bytes the table accounts for (never above its budget).
    pub fn bytes(&self) -> usize {
        self.order.len() * WRITE_TABLE_ENTRY_BYTES
    }

    /// The low-water mark: reads older than it conflict.
    pub fn low_water(&self) -> u64 {
        self.low_water
    }

    /// How many partitions have a remembered write.
    pub fn partitions(&self) -> usize {
        self.last_write.len()
    }
}

/// One transaction as proposed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnProposal {
    /// The log index the coordinator read at (its read barrier).
    pub read_at: u64,
    /// The timestamp the write set was built with; the commit moves it to the log's.
    pub provisional: i64,
    /// The partitions it read.
    pub reads: Vec<PartitionRef>,
    /// The partitions it writes.
    pub writes: Vec<PartitionRef>,
    /// The write set, opaque here (the engine's encoding of mutations).
    pub mutations: Vec<u8>,
    /// Its writes keep the timestamps they carry (a logged batch's, which users may set):
    /// the log neither moves them nor advances its own clock by them.
    pub keeps_timestamps: bool,
}

/// Several transactions of one node, proposed as one command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnBatch {
    /// The transactions, validated and committed in this order.
    pub transactions: Vec<TxnProposal>,
}

/// What one transaction of a batch became.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnOutcome {
    /// Committed: its writes carry `timestamp`.
    Committed {
        /// The write timestamp the log assigned.
        timestamp: i64,
    },
    /// A partition it read was written after its read: nothing was written.
    Conflict,
}

/// Why a transaction command could not be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnLogError {
    /// The command or answer could not be decoded.
    Malformed,
}

/// The answer to a batch: one outcome per transaction, or a refusal of the whole command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnResponse {
    /// The outcomes, in the batch's order.
    Outcomes(Vec<TxnOutcome>),
    /// The command was refused; nothing changed.
    Rejected(TxnLogError),
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], TxnLogError> {
        if self.0.len() < n {
            return Err(TxnLogError::Malformed);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, TxnLogError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, TxnLogError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self) -> Result<u32, TxnLogError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, TxnLogError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, TxnLogError> {
        Ok(self.u64()? as i64)
    }
    fn partitions(&mut self) -> Result<Vec<PartitionRef>, TxnLogError> {
        let n = usize::from(self.u16()?);
        if n > MAX_PARTITIONS || n * 32 > self.0.len() {
            return Err(TxnLogError::Malformed);
        }
        (0..n)
            .map(|_| {
                Ok(PartitionRef {
                    table: self.take(16)?.try_into().expect("16 bytes"),
                    token: self.i64()?,
                    key_hash: self.u64()?,
                })
            })
            .collect()
    }
}

fn put_partitions(out: &mut Vec<u8>, partitions: &[PartitionRef]) {
    // Callers bound the count by MAX_PARTITIONS (checked in `encode`).
    out.extend_from_slice(&(partitions.len() as u16).to_be_bytes());
    for p in partitions {
        out.extend_from_slice(&p.table);
        out.extend_from_slice(&p.token.to_be_bytes());
        out.extend_from_slice(&p.key_hash.to_be_bytes());
    }
}

impl TxnBatch {
    /// The encoded size of this batch.
    pub fn encoded_len(&self) -> usize {
        let flags = if self.has_flags() {
            self.transactions.len()
        } else {
            0
        };
        4 + flags
            + self
                .transactions
                .iter()
                .map(TxnProposal::unflagged_len)
                .sum::<usize>()
    }

    /// Whether a transaction needs the flagged encoding.
    fn has_flags(&self) -> bool {
        self.transactions.iter().any(|t| t.keeps_timestamps)
    }

    /// Encodes the batch as a command; `None` when it is over the format's bounds.
    pub fn encode(&self) -> Option<Vec<u8>> {
        if self.transactions.len() > MAX_BATCH_TRANSACTIONS
            || self.transactions.iter().any(|t| {
                t.reads.len() > MAX_PARTITIONS
                    || t.writes.len() > MAX_PARTITIONS
                    || u32::try_from(t.mutations.len()).is_err()
            })
        {
            return None;
        }
        let flagged = self.has_flags();
        let mut out = Vec::with_capacity(self.encoded_len());
        out.push(TXN_TAG);
        out.push(if flagged {
            TXN_FLAGS_VERSION
        } else {
            TXN_VERSION
        });
        out.extend_from_slice(&(self.transactions.len() as u16).to_be_bytes());
        for t in &self.transactions {
            out.extend_from_slice(&t.read_at.to_be_bytes());
            out.extend_from_slice(&t.provisional.to_be_bytes());
            if flagged {
                out.push(if t.keeps_timestamps {
                    FLAG_KEEPS_TIMESTAMPS
                } else {
                    0
                });
            }
            put_partitions(&mut out, &t.reads);
            put_partitions(&mut out, &t.writes);
            out.extend_from_slice(&(t.mutations.len() as u32).to_be_bytes());
            out.extend_from_slice(&t.mutations);
        }
        debug_assert_eq!(out.len(), self.encoded_len());
        Some(out)
    }

    /// Decodes a command that [`TxnBatch::encode`] made.
    pub fn decode(bytes: &[u8]) -> Result<TxnBatch, TxnLogError> {
        let mut r = Reader(bytes);
        if r.u8()? != TXN_TAG {
            return Err(TxnLogError::Malformed);
        }
        let flagged = match r.u8()? {
            TXN_VERSION => false,
            TXN_FLAGS_VERSION => true,
            _ => return Err(TxnLogError::Malformed),
        };
        let n = usize::from(r.u16()?);
        if n == 0 || n > MAX_BATCH_TRANSACTIONS {
            return Err(TxnLogError::Malformed);
        }
        let mut transactions = Vec::with_capacity(n.min(bytes.len() / 24));
        for _ in 0..n {
            let read_at = r.u64()?;
            let provisional = r.i64()?;
            let keeps_timestamps = if flagged {
                match r.u8()? {
                    0 => false,
                    FLAG_KEEPS_TIMESTAMPS => true,
                    _ => return Err(TxnLogError::Malformed),
                }
            } else {
                false
            };
            let reads = r.partitions()?;
            let writes = r.partitions()?;
            let len = r.u32()? as usize;
            let mutations = r.take(len)?.to_vec();
            transactions.push(TxnProposal {
                read_at,
                provisional,
                reads,
                writes,
                mutations,
                keeps_timestamps,
            });
        }
        if !r.0.is_empty() {
            return Err(TxnLogError::Malformed);
        }
        Ok(TxnBatch { transactions })
    }
}

impl TxnProposal {
    /// The most this transaction adds to a batch's encoding (with the flags byte).
    pub fn encoded_len(&self) -> usize {
        self.unflagged_len() + 1
    }

    /// Its size in a batch of the first version, without the flags byte.
    fn unflagged_len(&self) -> usize {
        16 + 2 + 32 * self.reads.len() + 2 + 32 * self.writes.len() + 4 + self.mutations.len()
    }
}

impl TxnResponse {
    /// Encodes the answer.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            TxnResponse::Rejected(TxnLogError::Malformed) => vec![0xFF],
            TxnResponse::Outcomes(outcomes) => {
                let mut out = Vec::with_capacity(1 + 9 * outcomes.len());
                out.push(0);
                for o in outcomes {
                    match o {
                        TxnOutcome::Committed { timestamp } => {
                            out.push(1);
                            out.extend_from_slice(&timestamp.to_be_bytes());
                        }
                        TxnOutcome::Conflict => out.push(2),
                    }
                }
                out
            }
        }
    }

    /// Decodes an answer that [`TxnResponse::encode`] made.
    pub fn decode(bytes: &[u8]) -> Result<TxnResponse, TxnLogError> {
        let mut r = Reader(bytes);
        match r.u8()? {
            0xFF if r.0.is_empty() => return Ok(TxnResponse::Rejected(TxnLogError::Malformed)),
            0 => {}
            _ => return Err(TxnLogError::Malformed),
        }
        let mut outcomes = Vec::new();
        while !r.0.is_empty() {
            outcomes.push(match r.u8()? {
                1 => TxnOutcome::Committed {
                    timestamp: r.i64()?,
                },
                2 => TxnOutcome::Conflict,
                _ => return Err(TxnLogError::Malformed),
            });
        }
        Ok(TxnResponse::Outcomes(outcomes))
    }
}

/// A committed transaction's writes, as handed to the follower.
#[derive(Clone, Copy, Debug)]
pub struct TxnCommit<'a> {
    /// The log index of the batch.
    pub index: u64,
    /// The timestamp the log assigned.
    pub timestamp: i64,
    /// The timestamp the write set was built with (every timestamp moves by the difference).
    pub provisional: i64,
    /// The write set, in the engine's encoding.
    pub mutations: &'a [u8],
}

/// What writes committed transactions to this node's storage (the engine). Called on the
/// metadata state machine's task with its lock held: it must not call back into the group.
pub trait TxnFollower: Send + Sync + 'static {
    /// Writes the parts of `commit` whose partitions this node replicates. Durability is the
    /// log's until [`TxnFollower::make_durable`] is called.
    fn commit(&self, commit: &TxnCommit<'_>);

    /// Returns once every commit handed so far is durable in storage: a snapshot is about to
    /// cover them and the log before it will be purged.
    fn make_durable(&self);

    /// A snapshot replaced the state up to `index`: the commits before it were not handed to
    /// this follower, so this node's storage may lack them.
    fn skipped(&self, index: u64);
}

/// A commit applied before the follower was attached (a replay at start-up).
#[derive(Clone, Debug, PartialEq, Eq)]
struct PendingCommit {
    index: u64,
    timestamp: i64,
    provisional: i64,
    mutations: Vec<u8>,
}

/// Counts of applied transactions, the same on every node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxnCounts {
    /// Transactions committed.
    pub commits: u64,
    /// Transactions refused as conflicts.
    pub conflicts: u64,
}

/// The transaction part of the group's state machine.
pub struct TxnState {
    /// The log index of the last transaction command applied.
    last_index: u64,
    table: WriteTable,
    last_timestamp: i64,
    counts: TxnCounts,
    follower: Mutex<Option<Arc<dyn TxnFollower>>>,
    /// Commits applied before a follower was attached; handed to it when it attaches.
    pending: Mutex<Vec<PendingCommit>>,
    /// Whether this state has applied a command or been restored: a restore after that is a
    /// snapshot from another node, whose commits this node's storage never received.
    touched: bool,
    /// The end of such a snapshot installed before a follower was attached.
    skipped_through: Mutex<Option<u64>>,
}

impl Default for TxnState {
    fn default() -> Self {
        TxnState::new(DEFAULT_WRITE_TABLE_BYTES)
    }
}

impl TxnState {
    /// An empty state whose write table stays within `table_bytes`.
    pub fn new(table_bytes: usize) -> TxnState {
        TxnState {
            last_index: 0,
            table: WriteTable::new(table_bytes),
            last_timestamp: i64::MIN,
            counts: TxnCounts::default(),
            follower: Mutex::new(None),
            pending: Mutex::new(Vec::new()),
            touched: false,
            skipped_through: Mutex::new(None),
        }
    }

    /// The write table.
    pub fn table(&self) -> &WriteTable {
        &self.table
    }

    /// Commits and conflicts so far.
    pub fn counts(&self) -> TxnCounts {
        self.counts
    }

    /// Hands `follower` the commits applied before it existed and every later one. The caller
    /// holds the state machine's lock (`MetaNode::with_state`), so none falls between.
    pub fn attach(&self, follower: Arc<dyn TxnFollower>) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        for p in &pending {
            follower.commit(&TxnCommit {
                index: p.index,
                timestamp: p.timestamp,
                provisional: p.provisional,
                mutations: &p.mutations,
            });
        }
        if let Some(index) = self
            .skipped_through
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            follower.skipped(index);
        }
        *self.follower.lock().unwrap_or_else(|p| p.into_inner()) = Some(follower);
    }

    fn follower(&self) -> Option<Arc<dyn TxnFollower>> {
        self.follower
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Notes that the state machine applied a command (of any part): a restore after this is
    /// a snapshot from another node.
    pub fn note_applied(&mut self) {
        self.touched = true;
    }

    /// Applies one batch at `index` and answers it.
    pub fn apply(&mut self, index: u64, command: &[u8]) -> TxnResponse {
        self.touched = true;
        debug_assert!(index >= self.last_index);
        self.last_index = index;
        let batch = match TxnBatch::decode(command) {
            Ok(batch) => batch,
            Err(e) => return TxnResponse::Rejected(e),
        };
        let follower = self.follower();
        let mut outcomes = Vec::with_capacity(batch.transactions.len());
        for t in batch.transactions {
            // A read at or after this index cannot have been taken before it was committed.
            if t.read_at >= index || self.table.conflicts(t.read_at, &t.reads) {
                self.counts.conflicts += 1;
                outcomes.push(TxnOutcome::Conflict);
                continue;
            }
            let timestamp = if t.keeps_timestamps {
                // A user's timestamp may be anywhere: the log's clock ignores it.
                t.provisional
            } else {
                let timestamp = t.provisional.max(self.last_timestamp.saturating_add(1));
                debug_assert!(timestamp > self.last_timestamp || self.last_timestamp == i64::MAX);
                self.last_timestamp = timestamp;
                timestamp
            };
            self.table.record(index, &t.writes);
            self.counts.commits += 1;
            let commit = TxnCommit {
                index,
                timestamp,
                provisional: t.provisional,
                mutations: &t.mutations,
            };
            match &follower {
                Some(f) => f.commit(&commit),
                None => {
                    self.pending
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(PendingCommit {
                            index,
                            timestamp,
                            provisional: t.provisional,
                            mutations: t.mutations,
                        })
                }
            }
            outcomes.push(TxnOutcome::Committed { timestamp });
        }
        TxnResponse::Outcomes(outcomes)
    }

    /// The whole state, for a snapshot. The follower first makes every commit durable, since
    /// the log before the snapshot will be purged; commits not yet handed to a follower travel
    /// in the snapshot.
    pub fn snapshot(&self) -> Vec<u8> {
        if let Some(f) = self.follower() {
            f.make_durable();
        }
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        out.push(TXN_VERSION);
        out.extend_from_slice(&self.last_index.to_be_bytes());
        out.extend_from_slice(&self.last_timestamp.to_be_bytes());
        out.extend_from_slice(&self.counts.commits.to_be_bytes());
        out.extend_from_slice(&self.counts.conflicts.to_be_bytes());
        out.extend_from_slice(&self.table.low_water.to_be_bytes());
        out.extend_from_slice(&(self.table.max_entries as u64).to_be_bytes());
        out.extend_from_slice(&(self.table.order.len() as u64).to_be_bytes());
        for (at, p) in &self.table.order {
            out.extend_from_slice(&at.to_be_bytes());
            out.extend_from_slice(&p.table);
            out.extend_from_slice(&p.token.to_be_bytes());
            out.extend_from_slice(&p.key_hash.to_be_bytes());
        }
        out.extend_from_slice(&(pending.len() as u64).to_be_bytes());
        for p in pending.iter() {
            out.extend_from_slice(&p.index.to_be_bytes());
            out.extend_from_slice(&p.timestamp.to_be_bytes());
            out.extend_from_slice(&p.provisional.to_be_bytes());
            out.extend_from_slice(&(p.mutations.len() as u64).to_be_bytes());
            out.extend_from_slice(&p.mutations);
        }
        out
    }

    /// Decodes a snapshot without installing it.
    pub(crate) fn decode_snapshot(bytes: &[u8]) -> Result<TxnSnapshot, MetaError> {
        let bad = |_| MetaError::Malformed;
        let mut r = Reader(bytes);
        if r.u8().map_err(bad)? != TXN_VERSION {
            return Err(MetaError::Malformed);
        }
        let last_index = r.u64().map_err(bad)?;
        let last_timestamp = r.i64().map_err(bad)?;
        let counts = TxnCounts {
            commits: r.u64().map_err(bad)?,
            conflicts: r.u64().map_err(bad)?,
        };
        let low_water = r.u64().map_err(bad)?;
        let max_entries = r.u64().map_err(bad)? as usize;
        let n = r.u64().map_err(bad)? as usize;
        if n > max_entries || n.saturating_mul(40) > r.0.len() {
            return Err(MetaError::Malformed);
        }
        let mut order = VecDeque::with_capacity(n);
        for _ in 0..n {
            let at = r.u64().map_err(bad)?;
            let p = PartitionRef {
                table: r.take(16).map_err(bad)?.try_into().expect("16 bytes"),
                token: r.i64().map_err(bad)?,
                key_hash: r.u64().map_err(bad)?,
            };
            order.push_back((at, p));
        }
        let n = r.u64().map_err(bad)? as usize;
        if n.saturating_mul(32) > r.0.len() {
            return Err(MetaError::Malformed);
        }
        let mut pending = Vec::with_capacity(n);
        for _ in 0..n {
            let index = r.u64().map_err(bad)?;
            let timestamp = r.i64().map_err(bad)?;
            let provisional = r.i64().map_err(bad)?;
            let len = r.u64().map_err(bad)? as usize;
            let mutations = r.take(len).map_err(bad)?.to_vec();
            pending.push(PendingCommit {
                index,
                timestamp,
                provisional,
                mutations,
            });
        }
        if !r.0.is_empty() {
            return Err(MetaError::Malformed);
        }
        let mut last_write = HashMap::with_capacity(order.len());
        for (at, p) in &order {
            last_write.insert(*p, *at);
        }
        Ok(TxnSnapshot {
            last_index,
            table: WriteTable {
                max_entries: max_entries.max(1),
                last_write,
                order,
                low_water,
            },
            last_timestamp,
            counts,
            pending,
        })
    }

    /// Installs a decoded snapshot. The first restore of a fresh state is
    /// this node's own stored snapshot (its storage made those commits durable first); any
    /// later one came from another node, and the follower learns what it missed.
    pub(crate) fn install(&mut self, snapshot: TxnSnapshot) {
        let from_elsewhere = self.touched;
        let index = snapshot.last_index;
        self.touched = true;
        self.last_index = index;
        self.table = snapshot.table;
        self.last_timestamp = snapshot.last_timestamp;
        self.counts = snapshot.counts;
        match self.follower() {
            Some(f) => {
                for p in &snapshot.pending {
                    f.commit(&TxnCommit {
                        index: p.index,
                        timestamp: p.timestamp,
                        provisional: p.provisional,
                        mutations: &p.mutations,
                    });
                }
                if from_elsewhere {
                    f.skipped(index);
                }
            }
            None => {
                *self.pending.lock().unwrap_or_else(|p| p.into_inner()) = snapshot.pending;
                if from_elsewhere {
                    *self
                        .skipped_through
                        .lock()
                        .unwrap_or_else(|p| p.into_inner()) = Some(index);
                }
            }
        }
    }
}

/// A decoded snapshot of the transaction part.
pub(crate) struct TxnSnapshot {
    last_index: u64,
    table: WriteTable,
    last_timestamp: i64,
    counts: TxnCounts,
    pending: Vec<PendingCommit>,
}

impl TxnSnapshot {
    /// The state of a group that never saw a transaction.
    pub(crate) fn empty(table_bytes: usize) -> TxnSnapshot {
        TxnSnapshot {
            last_index: 0,
            table: WriteTable::new(table_bytes),
            last_timestamp: i64::MIN,
            counts: TxnCounts::default(),
            pending: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests;
