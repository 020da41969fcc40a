//! `Storage`: the row store, one fjall database (`Store`) per slice of the token ring.
//!
//! Each store has its own journal, memtables, sync thread and partition stripes, and owns
//! the partitions whose tokens fall in its slice — the same slices as the shards
//! (`sluice_types::token::shard_of`), so that a shard writing its own partitions shares no
//! lock with the other shards. A data directory keeps the number of stores it was created
//! with (written in its `STORES` file before any store exists); a directory written before
//! stores existed is one store.
//!
//! A batch whose partitions live in several stores is committed store by store. Each part
//! carries the whole batch as a batchlog record in the same journal batch, so that if any
//! part survives a crash, opening the storage replays every part (a replay merges by
//! timestamp like any write, so replaying what is already there changes nothing). Once
//! every part is durable the record is removed. (A transaction may write its records
//! earlier in the same journals and carry only markers naming them: see `store::transaction`.)

use crate::limits::{DiskSampler, DiskSpace, PartitionSizes, WriteLimits};
use crate::model::{ClusteringSlice, Mutation, PartitionRead, TableId, TableLayout};
use crate::store::{
    commit_transaction, take_batchlog_len, ConditionRead, Prepared, RawPartition, Store, TxnEnv,
    TxnError, TxnPartition, TxnRead,
};
use crate::{ScanPage, ScanStart, StorageConfig, StorageError};
use bytes::Bytes;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Name of the file in a data directory that records its number of stores.
const STORES_FILE: &str = "STORES";

/// Meta key prefix of batchlog records.
const BATCHLOG_PREFIX: &[u8] = b"batchlog/";

/// Meta key prefix of the records a transaction writes before its locks; its parts'
/// batches carry an empty record under the batchlog key, a marker that names this one.
const BATCHLOG_AHEAD_PREFIX: &[u8] = b"batchlog-ahead/";

/// The key of the record made ahead that the marker under batchlog key `key` names.
fn ahead_key(key: &[u8]) -> Vec<u8> {
    let mut ahead = BATCHLOG_AHEAD_PREFIX.to_vec();
    ahead.extend_from_slice(key.get(BATCHLOG_PREFIX.len()..).unwrap_or(key));
    ahead
}

/// The value of `Shared::assumed_group_commit` when no wait is assumed.
const NOT_ASSUMED: u64 = u64::MAX;

/// Most stores a data directory may have (a sanity bound on the `STORES` file).
const MAX_STORES: usize = 1024;

/// The acknowledgement barrier of Periodic mode, given to the server at start: before each
/// socket write of answers it flushes every store's journal buffer to the OS, so every write
/// applied before it survives the process being killed.
#[derive(Clone)]
pub struct AckBarrier {
    inner: Arc<Shared>,
}

/// Proof, carried by a request, that its caller holds the [`AckBarrier`] and flushes it
/// before it answers: only a barrier makes one ([`AckBarrier::held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckBarrierHeld(());

impl AckBarrier {
    /// Moves every store's journal buffer to the OS (one `write(2)` per store with writes
    /// not there yet, none otherwise). One flush per batch of answers makes it a group flush,
    /// whatever the writes in the batch. In Batch mode it does nothing, since answers there
    /// wait for the fsync itself.
    pub fn flush(&self) -> Result<(), StorageError> {
        for store in self.inner.stores.iter() {
            store.flush_journal_to_os()?;
        }
        Ok(())
    }

    /// The proof that the caller flushes this barrier before it answers.
    pub fn held(&self) -> AckBarrierHeld {
        AckBarrierHeld(())
    }

    /// How long a write begun now is expected to wait for its group fsync (Batch mode; zero
    /// in Periodic mode, where no write waits for one), so that admission can count that
    /// wait before it lets a write run: in the store of `token`, or the longest of every
    /// store's when the write's partition is not known (a batch).
    pub fn group_commit_wait(&self, token: Option<i64>) -> GroupCommitWait {
        let [assumed, fsync] = &self.inner.assumed_group_commit;
        let assumed = assumed.load(Ordering::Relaxed);
        if assumed != NOT_ASSUMED {
            return GroupCommitWait {
                expected: Duration::from_nanos(assumed),
                fsync: Duration::from_nanos(fsync.load(Ordering::Relaxed)),
            };
        }
        let stores = &self.inner.stores;
        let of = |s: &Store| {
            let (expected, fsync) = s.group_commit_wait();
            GroupCommitWait { expected, fsync }
        };
        match token {
            Some(token) => {
                let n = stores.len() as u32;
                let i = sluice_types::token::shard_of(
                    token,
                    n,
                    sluice_types::token::SHARDING_IGNORE_MSB,
                ) as usize;
                stores.get(i).map(of).unwrap_or_default()
            }
            None => stores
                .iter()
                .map(of)
                .max_by_key(|w| w.expected)
                .unwrap_or_default(),
        }
    }
}

/// Nanoseconds of `d`, saturated.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What [`AckBarrier::group_commit_wait`] expects of the group fsync a new write joins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupCommitWait {
    /// The expected wait until the write is durable: the rest of the fsync in progress,
    /// then the fsync that covers every write not yet in one.
    pub expected: Duration,
    /// The bare cost of one fsync, as measured: even a lone write waits about this long.
    pub fsync: Duration,
}

/// The row store. Cheap to clone; all clones share the same stores.
#[derive(Clone)]
pub struct Storage {
    inner: Arc<Shared>,
}

struct Shared {
    /// The free-space guard of the data directory. First of the fields: its thread holds
    /// handles on the stores' databases, and stops before they close.
    disk: DiskSampler,
    stores: Box<[Store]>,
    /// Distinguishes this process's batchlog keys from those of earlier runs.
    batch_epoch: u64,
    batch_seq: AtomicU64,
    /// Size limits of one write (the defaults until `set_write_limits`).
    limits: std::sync::OnceLock<WriteLimits>,
    /// Test hook: the group-commit wait to report instead of the measured one, in
    /// nanoseconds (`NOT_ASSUMED`: measure), expected wait then bare fsync.
    assumed_group_commit: [AtomicU64; 2],
    /// Partition size estimates, made when a partition size limit is set.
    partition_sizes: std::sync::OnceLock<PartitionSizes>,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage")
            .field("stores", &self.inner.stores.len())
            .finish_non_exhaustive()
    }
}

/// Proof that a write was applied; wait on it with `Storage::wait_durable`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitTicket(Ticket);

/// What [`Storage::apply_conditional`] did.
#[derive(Debug)]
pub struct ConditionalOutcome {
    /// Set when the condition held and the write was applied: await it with
    /// [`Storage::wait_durable`].
    pub ticket: Option<CommitTicket>,
    /// The condition's reads as they were under the locks, in the order asked.
    pub reads: Vec<PartitionRead>,
    /// The write timestamp the commit assigned, when asked to assign one and it wrote.
    pub timestamp: Option<i64>,
}

impl ConditionalOutcome {
    /// Whether the condition held (and the write was applied).
    pub fn applied(&self) -> bool {
        self.ticket.is_some()
    }
}

/// What [`Storage::apply_transaction`] did.
#[derive(Debug)]
pub struct TxnOutcome {
    /// Set when the transaction wrote: await it with [`Storage::wait_durable`].
    pub ticket: Option<CommitTicket>,
    /// The reads as they were under the locks, in the order asked.
    pub reads: Vec<PartitionRead>,
    /// The write timestamp the commit assigned, when it wrote.
    pub timestamp: Option<i64>,
    /// Time spent acquiring the locks.
    pub lock_wait: Duration,
    /// Time the locks were held (the critical section).
    pub locked_for: Duration,
}

/// A batch that spans stores: its parts by store, its batchlog key and record.
type SplitBatch = (Vec<(usize, Prepared)>, Vec<u8>, Vec<u8>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Ticket {
    /// Committed to one store.
    One { store: usize, seq: u64 },
    /// Committed to several stores, each part with the batchlog record `key` (or a marker
    /// there and the record under `ahead`).
    Many {
        parts: Vec<(usize, u64)>,
        key: Vec<u8>,
        ahead: Option<Vec<u8>>,
    },
    /// Everything a read of these stores could have seen (see [`Storage::seen_ticket`]).
    Seen { parts: Vec<(usize, u64)> },
}

impl CommitTicket {
    /// Test hook: the ticket of the next commit to the same stores (not made yet).
    #[cfg(test)]
    pub(crate) fn successor(&self) -> CommitTicket {
        CommitTicket(match &self.0 {
            Ticket::One { store, seq } => Ticket::One {
                store: *store,
                seq: seq + 1,
            },
            Ticket::Many { parts, key, ahead } => Ticket::Many {
                parts: parts.iter().map(|&(store, seq)| (store, seq + 1)).collect(),
                key: key.clone(),
                ahead: ahead.clone(),
            },
            Ticket::Seen { parts } => Ticket::Seen {
                parts: parts.iter().map(|&(store, seq)| (store, seq + 1)).collect(),
            },
        })
    }
}

impl Storage {
    /// Opens (or creates) the storage in `config.path`, replays any batchlog records left
    /// by a crash, and starts each store's sync thread.
    pub fn open(config: StorageConfig) -> Result<Storage, StorageError> {
        let dirs = store_dirs(&config.path, config.stores)?;
        let cache_each = config.cache_bytes / dirs.len() as u64;
        let stores = dirs
            .iter()
            .map(|dir| Store::open(dir, config.durability, cache_each))
            .collect::<Result<Vec<_>, _>>()?
            .into_boxed_slice();
        let batch_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let databases: Vec<fjall::Database> = stores.iter().map(Store::database).collect();
        let unflushed = Box::new(move || databases.iter().map(|d| d.write_buffer_size()).sum());
        let disk = DiskSpace::start(&config.path, unflushed)?;
        let storage = Storage {
            inner: Arc::new(Shared {
                disk,
                stores,
                batch_epoch,
                batch_seq: AtomicU64::new(0),
                limits: std::sync::OnceLock::new(),
                assumed_group_commit: [AtomicU64::new(NOT_ASSUMED), AtomicU64::new(0)],
                partition_sizes: std::sync::OnceLock::new(),
            }),
        };
        storage.replay_batchlog()?;
        Ok(storage)
    }

    /// Sets the size limits of one write, once (at start-up); a later call is ignored.
    pub fn set_write_limits(&self, limits: WriteLimits) {
        if self.inner.limits.set(limits).is_err() {
            tracing::warn!("write limits already set; keeping the first");
            return;
        }
        if limits.max_partition_bytes() > 0 {
            let _ = self.inner.partition_sizes.set(PartitionSizes::new());
        }
    }

    /// `TooLarge` when a mutation is over the write limits (see [`WriteLimits`]), else its
    /// bytes, which the caller passes to [`record_partition_bytes`](Self::record_partition_bytes)
    /// once it is written.
    fn check_limits(&self, limits: &WriteLimits, m: &Mutation) -> Result<usize, StorageError> {
        let bytes = limits.check(m)?;
        if let Some(sizes) = self.inner.partition_sizes.get() {
            sizes.check(limits, m, bytes)?;
        }
        Ok(bytes)
    }

    /// Adds a written mutation's bytes to its partition's size estimate (when a partition
    /// size limit is set).
    fn record_partition_bytes(&self, m: &Mutation, bytes: usize) {
        if let Some(sizes) = self.inner.partition_sizes.get() {
            sizes.record(m, bytes);
        }
    }

    /// Forgets the partition size estimates (a table was emptied).
    fn forget_partition_sizes(&self) {
        if let Some(sizes) = self.inner.partition_sizes.get() {
            sizes.clear();
        }
    }

    /// The size limits of one write.
    pub fn write_limits(&self) -> &WriteLimits {
        static DEFAULT: std::sync::OnceLock<WriteLimits> = std::sync::OnceLock::new();
        self.inner
            .limits
            .get()
            .unwrap_or_else(|| DEFAULT.get_or_init(WriteLimits::default))
    }

    /// Refuses writes while the data directory's file system has less than `bytes` free
    /// (0, the default of a storage opened without it: never).
    pub fn set_min_free_disk_bytes(&self, bytes: u64) {
        self.inner.disk.set_min_free(bytes);
    }

    /// Test hook: assume `free` bytes free on the data directory's file system instead of
    /// asking it (`None`: ask it again), so that tests can fill the disk.
    #[doc(hidden)]
    pub fn assume_free_disk_bytes(&self, free: Option<u64>) {
        self.inner.disk.override_free(free);
    }

    /// Test hook: report `wait` as every write's group-commit wait
    /// ([`AckBarrier::group_commit_wait`]) instead of the measured one (`None`: measure again),
    /// so that tests can make the group fsync look slow.
    #[doc(hidden)]
    pub fn assume_group_commit_wait(&self, wait: Option<GroupCommitWait>) {
        let [assumed, fsync] = &self.inner.assumed_group_commit;
        match wait {
            Some(w) => {
                fsync.store(nanos(w.fsync), Ordering::Relaxed);
                assumed.store(nanos(w.expected).min(NOT_ASSUMED - 1), Ordering::Relaxed);
            }
            None => assumed.store(NOT_ASSUMED, Ordering::Relaxed),
        }
    }

    /// Number of stores (fjall databases) the data is spread over.
    pub fn store_count(&self) -> usize {
        self.inner.stores.len()
    }

    /// The store that owns partitions with this token.
    pub(crate) fn store_of(&self, token: i64) -> usize {
        let n = self.inner.stores.len();
        sluice_types::token::shard_of(token, n as u32, sluice_types::token::SHARDING_IGNORE_MSB)
            as usize
    }

    fn store(&self, token: i64) -> &Store {
        &self.inner.stores[self.store_of(token)]
    }

    /// Applies mutations: atomically (one engine batch) when their partitions share a
    /// store, else store by store with a batchlog record (see the module doc). LWW merge
    /// per cell happens here. Returns when the data is visible to reads; durability is
    /// awaited with `wait_durable`.
    ///
    /// Refused before anything is written when the disk is below its reserve
    /// ([`DISK_FULL_MESSAGE`](crate::DISK_FULL_MESSAGE)) or a mutation is over the
    /// [`WriteLimits`] (`TooLarge`, naming the limit).
    pub fn apply(
        &self,
        mutations: &[(&TableLayout, Mutation)],
    ) -> Result<CommitTicket, StorageError> {
        self.check_before_writing(mutations)?;
        let ticket = self.commit_mutations(mutations)?;
        self.record_written(mutations);
        Ok(ticket)
    }

    /// Refuses `mutations` before anything is written: the disk below its reserve, or a
    /// mutation over the [`WriteLimits`] or its partition's size limit.
    fn check_before_writing(
        &self,
        mutations: &[(&TableLayout, Mutation)],
    ) -> Result<(), StorageError> {
        self.inner.disk.check()?;
        let limits = self.write_limits();
        for (_, m) in mutations {
            self.check_limits(limits, m)?;
        }
        Ok(())
    }

    /// Counts written `mutations` in their partitions' size estimates (when a partition
    /// size limit is set); they passed [`check_before_writing`](Self::check_before_writing).
    fn record_written(&self, mutations: &[(&TableLayout, Mutation)]) {
        if self.inner.partition_sizes.get().is_none() {
            return;
        }
        let limits = self.write_limits();
        for (_, m) in mutations {
            // Checked before the write: this only counts its bytes again.
            if let Ok(bytes) = limits.check(m) {
                self.record_partition_bytes(m, bytes);
            }
        }
    }

    /// [`apply`](Self::apply) once the mutations are checked.
    fn commit_mutations(
        &self,
        mutations: &[(&TableLayout, Mutation)],
    ) -> Result<CommitTicket, StorageError> {
        let stores = &self.inner.stores;
        let first = mutations.first().map_or(0, |(_, m)| self.store_of(m.token));
        if mutations
            .iter()
            .all(|(_, m)| self.store_of(m.token) == first)
        {
            // Everything expensive happens in `prepare`, before any lock.
            let seq = stores[first].commit(Store::prepare(mutations)?, None)?;
            return Ok(CommitTicket(Ticket::One { store: first, seq }));
        }
        let (parts, key, record) = self.split_batch(mutations)?;
        let mut committed = Vec::with_capacity(parts.len());
        for (store, prepared) in parts {
            let seq = stores[store].commit(prepared, Some((&key, &record)))?;
            committed.push((store, seq));
        }
        Ok(CommitTicket(Ticket::Many {
            parts: committed,
            key,
            ahead: None,
        }))
    }

    /// Applies `mutations` (all in the partition `token`/`partition_key`) only if
    /// `condition` holds on `reads` of that partition, read and evaluated under the
    /// partition's stripe locks, which every write to it takes: nothing lands between the
    /// check and the write. Encoding happens before the locks. With `provisional`, the
    /// timestamp the mutations were made with, the commit assigns the write's timestamp:
    /// above every timestamp stored in the partition's stripe, so it is ordered after
    /// everything it read. The locks are released on return; await durability with
    /// [`wait_durable`](Self::wait_durable), so concurrent conditional writes share an fsync.
    /// Refused before anything is read, as [`apply`](Self::apply) refuses.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_conditional(
        &self,
        token: i64,
        partition_key: &[u8],
        reads: &[ConditionRead<'_>],
        now_secs: u32,
        mutations: &[(&TableLayout, Mutation)],
        provisional: Option<i64>,
        condition: impl FnOnce(&[PartitionRead]) -> bool,
    ) -> Result<ConditionalOutcome, StorageError> {
        if mutations
            .iter()
            .any(|(_, m)| m.token != token || m.partition_key != partition_key)
        {
            return Err(StorageError::Corrupt(
                "a conditional write outside its condition's partition",
            ));
        }
        self.check_before_writing(mutations)?;
        let store = self.store_of(token);
        let prepared = Store::prepare(mutations)?;
        let done = self.inner.stores[store].commit_conditional(
            prepared,
            token,
            partition_key,
            reads,
            now_secs,
            provisional,
            condition,
        )?;
        if done.seq.is_some() {
            self.record_written(mutations);
        }
        Ok(ConditionalOutcome {
            ticket: done.seq.map(|seq| CommitTicket(Ticket::One { store, seq })),
            reads: done.reads,
            timestamp: done.timestamp,
        })
    }

    /// Runs a transaction over several partitions, tables and stores, atomically and
    /// serializably: the locks of every partition in `partitions` (those it may write) and
    /// in `reads` are taken in one global order (no deadlock, no abort), the reads are
    /// made, `decide` builds the writes from them (made with timestamp `provisional`; it
    /// may build none), the commit moves them above every timestamp stored in the locked
    /// stripes and writes them, one batch per store with a batchlog record when they span
    /// stores (replayed whole at the next open if the process dies between parts). The
    /// locks are released on return; await durability with [`wait_durable`](Self::wait_durable).
    /// `decide` must only write partitions named in `partitions` or `reads`. `known` are
    /// writes that need no read (made with timestamp `provisional`, in those partitions
    /// too): they are converted, encoded and logged before the locks, so that the locks
    /// cover only what depends on the reads.
    #[allow(clippy::too_many_arguments)]
    pub fn apply_transaction<'l, E>(
        &self,
        partitions: &[TxnPartition],
        reads: &[TxnRead<'_>],
        known: &[(&'l TableLayout, Mutation)],
        now_secs: u32,
        provisional: i64,
        decide: impl FnOnce(&[PartitionRead]) -> Result<Vec<(&'l TableLayout, Mutation)>, E>,
    ) -> Result<TxnOutcome, TxnError<E>> {
        self.inner.disk.check()?;
        let limits = self.write_limits();
        let store_of = |token: i64| self.store_of(token);
        // A transaction's writes are counted at the check: one that then aborts over-counts
        // its partitions, which the estimate allows (it is an upper bound).
        let check_limits = |m: &Mutation| {
            let bytes = self.check_limits(limits, m)?;
            self.record_partition_bytes(m, bytes);
            Ok(())
        };
        // Each part's record holds the other parts only: a record is in the same engine
        // batch as its own part, so wherever it survives that part did too.
        let batchlog = |parts: &[(usize, Prepared)]| {
            let records = (0..parts.len())
                .map(|own| {
                    let others = parts.iter().enumerate().filter(|(i, _)| *i != own);
                    encode_parts(parts.len() - 1, others.map(|(_, p)| p)).map(fjall::Slice::from)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let seq = self.inner.batch_seq.fetch_add(1, Ordering::Relaxed);
            let mut key = BATCHLOG_PREFIX.to_vec();
            key.extend_from_slice(&self.inner.batch_epoch.to_be_bytes());
            key.extend_from_slice(&seq.to_be_bytes());
            Ok((key, records))
        };
        let env = TxnEnv {
            store_of: &store_of,
            check_limits: &check_limits,
            batchlog: &batchlog,
            ahead_key: &ahead_key,
        };
        let done = commit_transaction(
            &self.inner.stores,
            &env,
            partitions,
            reads,
            known,
            now_secs,
            provisional,
            decide,
        )?;
        let ticket = match (done.parts.as_slice(), done.batchlog_key) {
            ([], _) => None,
            (&[(store, seq)], None) => Some(CommitTicket(Ticket::One { store, seq })),
            (_, key) => Some(CommitTicket(Ticket::Many {
                parts: done.parts,
                key: key.unwrap_or_default(),
                ahead: done.ahead_key,
            })),
        };
        Ok(TxnOutcome {
            ticket,
            reads: done.reads,
            timestamp: done.timestamp,
            lock_wait: done.lock_wait,
            locked_for: done.locked_for,
        })
    }

    /// Splits a batch that spans stores into its parts, a batchlog key and the record.
    fn split_batch(
        &self,
        mutations: &[(&TableLayout, Mutation)],
    ) -> Result<SplitBatch, StorageError> {
        let mut parts: Vec<(usize, Prepared)> = Vec::new();
        for store in 0..self.inner.stores.len() {
            let own = mutations
                .iter()
                .filter(|(_, m)| self.store_of(m.token) == store);
            let prepared = Store::prepare(own)?;
            if !prepared.is_empty() {
                parts.push((store, prepared));
            }
        }
        let record = encode_record(&parts)?;
        let seq = self.inner.batch_seq.fetch_add(1, Ordering::Relaxed);
        let mut key = BATCHLOG_PREFIX.to_vec();
        key.extend_from_slice(&self.inner.batch_epoch.to_be_bytes());
        key.extend_from_slice(&seq.to_be_bytes());
        Ok((parts, key, record))
    }

    /// Test hook: commits only the first part of a batch that spans stores, with its
    /// batchlog record, as if the process died before committing the others.
    #[cfg(test)]
    pub(crate) fn apply_first_part_only(
        &self,
        mutations: &[(&TableLayout, Mutation)],
    ) -> Result<(), StorageError> {
        let (parts, key, record) = self.split_batch(mutations)?;
        assert!(parts.len() > 1, "the batch must span stores");
        let (store, prepared) = parts.into_iter().next().ok_or(StorageError::Closed)?;
        self.inner.stores[store].commit(prepared, Some((&key, &record)))?;
        Ok(())
    }

    /// Test hook: the number of batchlog records in each store.
    #[cfg(test)]
    pub(crate) fn batchlog_records(&self) -> Vec<usize> {
        self.inner
            .stores
            .iter()
            .map(|s| s.meta_scan(BATCHLOG_PREFIX).map_or(0, |r| r.len()))
            .collect()
    }

    /// Test hook: the number of records written ahead by transactions, in all stores.
    #[cfg(test)]
    pub(crate) fn batchlog_ahead_records(&self) -> usize {
        self.inner
            .stores
            .iter()
            .map(|s| s.meta_scan(BATCHLOG_AHEAD_PREFIX).map_or(0, |r| r.len()))
            .sum()
    }

    /// Fsyncs everything every store has applied so far (blocking): for writes whose
    /// durability another log carried until now.
    pub fn sync_all(&self) -> Result<(), StorageError> {
        for store in self.inner.stores.iter() {
            store.sync_all()?;
        }
        Ok(())
    }

    /// A ticket for every write a read that has returned could have seen: in the store of
    /// `token`, or in every store (`None`). Take it after the read; once
    /// [`wait_durable`](Self::wait_durable) resolves on it, nothing the read saw can be lost
    /// by a crash (Batch mode) or by the process dying (Periodic mode), so an answer that
    /// shows the read's result (a SERIAL read, a conditional write that did not apply) may
    /// go out. Costs nothing when the journal is already durable that far, else at most one
    /// group fsync per store.
    pub fn seen_ticket(&self, token: Option<i64>) -> CommitTicket {
        let stores = &self.inner.stores;
        let parts = match token {
            Some(token) => {
                let store = self.store_of(token);
                vec![(store, stores[store].seen_upto())]
            }
            None => stores
                .iter()
                .enumerate()
                .map(|(store, s)| (store, s.seen_upto()))
                .collect(),
        };
        CommitTicket(Ticket::Seen { parts })
    }

    /// Resolves once the ticket's write is durable: in Batch mode after the group fsync; in
    /// Periodic mode once it is in the OS (the next timed fsync makes it durable).
    pub async fn wait_durable(&self, ticket: CommitTicket) -> Result<(), StorageError> {
        let stores = &self.inner.stores;
        match ticket.0 {
            Ticket::One { store, seq } => stores[store].wait_durable(seq).await,
            Ticket::Seen { parts } => {
                for (store, seq) in parts {
                    stores[store].wait_durable(seq).await?;
                }
                Ok(())
            }
            Ticket::Many { parts, key, ahead } => {
                for &(store, seq) in &parts {
                    stores[store].wait_durable(seq).await?;
                }
                // Every part is durable: the record is no longer needed. Not fsynced: if
                // the removal is lost (or fails, e.g. on a store closing meanwhile), the
                // next open replays the record, which is harmless; the write stands.
                let mut keys: Vec<&[u8]> = vec![&key];
                keys.extend(ahead.as_deref());
                for &(store, _) in &parts {
                    if let Err(e) = stores[store].forget_batchlog(&keys) {
                        tracing::debug!(error = %e, "batchlog record left for the next open");
                    }
                }
                Ok(())
            }
        }
    }

    /// True when `ticket` needs nothing more than an [`AckBarrier`] flush before its write
    /// may be acknowledged: in Periodic mode, a write to one store is as durable as the mode
    /// makes it once its journal buffer is in the OS, and the barrier moves it there. A caller
    /// that holds the barrier ([`AckBarrierHeld`]) and flushes it before it writes any answer
    /// to its client can then answer without awaiting [`wait_durable`](Self::wait_durable),
    /// so that the request ends where it ran instead of waiting for the rest of the event-loop
    /// turn. A batch that spans stores still waits: its batchlog record goes only once every
    /// part is in the OS.
    pub fn durable_at_ack_barrier(&self, ticket: &CommitTicket, _held: AckBarrierHeld) -> bool {
        match ticket.0 {
            Ticket::One { store, .. } => self.inner.stores[store].journal_in_os_is_durable(),
            Ticket::Many { .. } | Ticket::Seen { .. } => false,
        }
    }

    /// The acknowledgement barrier, for the server that answers the clients: it flushes it
    /// before each socket write of answers.
    pub fn ack_barrier(&self) -> AckBarrier {
        AckBarrier {
            inner: self.inner.clone(),
        }
    }

    /// Replays the batchlog records found in any store, then removes them, and the
    /// records made ahead by transactions that never committed.
    fn replay_batchlog(&self) -> Result<(), StorageError> {
        let stores = &self.inner.stores;
        let mut records = std::collections::BTreeMap::new();
        for store in stores.iter() {
            for (key, record) in store.meta_scan(BATCHLOG_PREFIX)? {
                // An empty record is a marker: the record was written ahead, earlier in
                // the same journal, so it is there wherever the marker is.
                let record = match record.is_empty() {
                    true => store
                        .meta_get(&ahead_key(&key))?
                        .ok_or(StorageError::Corrupt(
                            "a batchlog marker without its record",
                        ))?,
                    false => record,
                };
                records.insert(key, record);
            }
        }
        let mut stale = Vec::new();
        for (index, store) in stores.iter().enumerate() {
            for (key, _) in store.meta_scan(BATCHLOG_AHEAD_PREFIX)? {
                stale.push((index, key));
            }
        }
        if records.is_empty() {
            for (store, key) in &stale {
                stores[*store].forget_batchlog(&[key])?;
            }
            return Ok(());
        }
        tracing::info!(
            records = records.len(),
            "replaying batches that spanned stores"
        );
        for record in records.values() {
            for (store, prepared) in decode_record(record, stores.len())? {
                match stores[store].commit(prepared, None) {
                    Ok(_) => {}
                    // The same deterministic error the original write met: skip that part.
                    Err(e @ (StorageError::TooLarge(_) | StorageError::Corrupt(_))) => {
                        tracing::warn!(error = %e, "a replayed batch part was not applied")
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        for store in stores.iter() {
            store.sync_all()?;
        }
        // The replayed parts are durable; the records need no fsync to go (see `wait_durable`).
        for key in records.keys() {
            for store in stores.iter() {
                store.forget_batchlog(&[key])?;
            }
        }
        for (store, key) in &stale {
            stores[*store].forget_batchlog(&[key])?;
        }
        Ok(())
    }

    /// Number of rows written whole without reading what they replace (tests, metrics).
    pub fn replaced_row_count(&self) -> u64 {
        self.inner
            .stores
            .iter()
            .map(Store::replaced_row_count)
            .sum()
    }

    /// Number of journal fsyncs done by the sync threads (for tests and metrics).
    pub fn fsync_count(&self) -> u64 {
        self.inner.stores.iter().map(Store::fsync_count).sum()
    }

    /// Number of journal buffer flushes made for waiting writers in Periodic mode (tests, metrics).
    pub fn buffer_flush_count(&self) -> u64 {
        self.inner
            .stores
            .iter()
            .map(Store::buffer_flush_count)
            .sum()
    }

    /// Test hook: the number of stored entries (headers and rows, live or not) of a table.
    #[cfg(test)]
    pub(crate) fn raw_entry_count(&self, table: TableId) -> usize {
        self.inner
            .stores
            .iter()
            .map(|s| s.raw_entry_count(table))
            .sum()
    }

    /// Sets the most dead entries (deleted or expired rows, deleted partitions) one read or
    /// scan page may step over before it fails with `StorageError::TooManyTombstones`
    /// (Cassandra's tombstone_failure_threshold; default
    /// [`crate::DEFAULT_TOMBSTONE_FAILURE_THRESHOLD`]).
    pub fn set_tombstone_failure_threshold(&self, threshold: usize) {
        for store in self.inner.stores.iter() {
            store.set_tombstone_failure_threshold(threshold);
        }
    }

    /// Test hook: flushes and fully compacts a table in every store; returns the entries
    /// then on disk, engine tombstones included.
    #[cfg(test)]
    pub(crate) fn compact_table(&self, table: TableId) -> usize {
        self.inner
            .stores
            .iter()
            .map(|s| s.compact_table(table))
            .sum()
    }

    /// Test hook: a table's data blocks loaded and disk tables skipped by a filter so far,
    /// over every store.
    #[cfg(test)]
    pub(crate) fn read_filter_metrics(&self, table: TableId) -> (usize, usize) {
        self.inner
            .stores
            .iter()
            .map(|s| s.read_filter_metrics(table))
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }

    /// Test hook: holds every sync thread before its next fsync while the guards live, so
    /// that tests (here and in other crates) can see what waits for durability.
    #[doc(hidden)]
    pub fn hold_sync(&self) -> Vec<std::sync::RwLockWriteGuard<'_, ()>> {
        self.inner.stores.iter().map(Store::hold_sync).collect()
    }

    /// Writes every memtable to a disk table now, waiting at most `limit` (tools and
    /// benchmarks that need a store with disk tables; the node flushes on its own).
    pub fn flush_memtables(&self, limit: Duration) {
        for store in &self.inner.stores {
            store.flush_memtables(limit);
        }
    }

    /// Disk tables of user data, over every store (tools and benchmarks).
    pub fn disk_table_count(&self) -> usize {
        self.inner.stores.iter().map(Store::data_table_count).sum()
    }

    /// Disk tables of user data in level 0 (written by a flush, not yet compacted), over
    /// every store (tools and benchmarks): each may hold any partition.
    pub fn l0_disk_table_count(&self) -> usize {
        self.inner
            .stores
            .iter()
            .map(Store::l0_data_table_count)
            .sum()
    }

    /// Reads one partition: rows in `slice` (reversed if asked), resuming strictly after
    /// `after` (a full clustering key) when given, at most `limit` rows. TTL-expired cells and
    /// rows are not returned (`now_secs` = now as epoch seconds).
    #[allow(clippy::too_many_arguments)]
    pub fn read_partition(
        &self,
        layout: &TableLayout,
        token: i64,
        partition_key: &[u8],
        slice: &ClusteringSlice,
        after: Option<&[Bytes]>,
        limit: usize,
        now_secs: u32,
    ) -> Result<PartitionRead, StorageError> {
        self.store(token).read_partition(
            layout,
            token,
            partition_key,
            slice,
            after,
            limit,
            now_secs,
        )
    }

    /// Every stored entry of one partition (header and rows, deletions included), for
    /// comparing and repairing replicas; refused past [`crate::MAX_RAW_PARTITION_BYTES`].
    pub fn read_raw_partition(
        &self,
        table: TableId,
        token: i64,
        partition_key: &[u8],
    ) -> Result<RawPartition, StorageError> {
        self.store(token)
            .read_raw_partition(&table, token, partition_key)
    }

    /// Merges another replica's raw partition into this one's, last write wins per cell and
    /// deletions applied, as a write would; await durability with `wait_durable`.
    pub fn apply_raw_partition(
        &self,
        layout: &TableLayout,
        token: i64,
        partition_key: &[u8],
        raw: &RawPartition,
    ) -> Result<CommitTicket, StorageError> {
        self.inner.disk.check()?;
        let prepared = Store::prepare_raw_partition(layout, token, partition_key, raw)?;
        let store = self.store_of(token);
        let seq = self.inner.stores[store].commit(prepared, None)?;
        Ok(CommitTicket(Ticket::One { store, seq }))
    }

    /// Token-ordered scan of a table from `start` up to `end` (token bound), returning at most
    /// `row_limit` rows in total (a partition with only a static row counts as 1) and where to resume.
    ///
    /// A resumed partition (`ScanStart::Resume`) is returned with its static row, for the
    /// caller to fill static columns, but only when it still has rows; its static row alone
    /// does not count again.
    pub fn scan(
        &self,
        layout: &TableLayout,
        start: &ScanStart,
        end: Bound<i64>,
        row_limit: usize,
        now_secs: u32,
    ) -> Result<ScanPage, StorageError> {
        let resume_in = match start {
            ScanStart::Resume { token, .. } => self.store_of(*token),
            ScanStart::Token(_) => 0,
        };
        Store::scan(
            &self.inner.stores,
            resume_in,
            layout,
            start,
            end,
            row_limit,
            now_secs,
        )
    }

    /// Reads the stored records (partition headers with their deletions and static rows,
    /// rows with their tombstones) of `table` whose tokens are in `(start, end]` (`start`
    /// `None`: from the smallest token), in key order, strictly after the key `after` when
    /// given, until about `max_bytes` (at least one record). For streaming a range to another
    /// node: pass the chunk's `resume_after` as the next call's `after`.
    pub fn export_token_range(
        &self,
        table: TableId,
        start: Option<i64>,
        end: i64,
        after: Option<&[u8]>,
        max_bytes: usize,
    ) -> Result<crate::RangeChunk, StorageError> {
        let token_key = |t: i64| crate::keycodec::token_bytes(t).to_vec();
        let lo = match (after, start) {
            (Some(key), _) => Bound::Excluded(key.to_vec()),
            (None, None) => Bound::Unbounded,
            (None, Some(t)) => match t.checked_add(1) {
                Some(next) => Bound::Included(token_key(next)),
                None => return Ok(crate::RangeChunk::default()),
            },
        };
        let hi = match end.checked_add(1) {
            Some(next) => Bound::Excluded(token_key(next)),
            None => Bound::Unbounded,
        };
        if let (Bound::Included(l) | Bound::Excluded(l), Bound::Excluded(h)) = (&lo, &hi) {
            if l >= h {
                return Ok(crate::RangeChunk::default());
            }
        }
        Store::export_range(&self.inner.stores, &table, lo, hi, max_bytes)
    }

    /// Merges streamed records of the table `layout` describes into storage by timestamp, as a write would (so
    /// importing the same records again changes nothing), one commit per store. Every record
    /// is checked before anything is written. Await each ticket with
    /// [`wait_durable`](Self::wait_durable).
    pub fn import_records(
        &self,
        layout: &TableLayout,
        records: &[crate::RawRecord],
    ) -> Result<Vec<CommitTicket>, StorageError> {
        self.inner.disk.check()?;
        let mut by_store: Vec<Vec<&crate::RawRecord>> = vec![Vec::new(); self.store_count()];
        for record in records {
            let token = crate::keycodec::token_from_bytes(
                record
                    .key
                    .get(..crate::keycodec::TOKEN_LEN)
                    .and_then(|t| t.try_into().ok())
                    .ok_or(StorageError::Corrupt("short streamed key"))?,
            );
            by_store[self.store_of(token)].push(record);
        }
        let prepared = by_store
            .iter()
            .map(|records| Store::prepare_raw_records(layout, records))
            .collect::<Result<Vec<_>, _>>()?;
        let mut tickets = Vec::new();
        for (store, prepared) in prepared.into_iter().enumerate() {
            if by_store[store].is_empty() {
                continue;
            }
            let seq = self.inner.stores[store].commit(prepared, None)?;
            tickets.push(CommitTicket(Ticket::One { store, seq }));
        }
        Ok(tickets)
    }

    /// Empties a table (TRUNCATE). Each store switches the table to a fresh keyspace at
    /// once (a durable record and a handle swap, whatever the table's size); the old
    /// keyspaces' files are deleted in the background.
    pub fn truncate(&self, table: TableId) -> Result<(), StorageError> {
        self.forget_partition_sizes();
        self.inner.stores.iter().try_for_each(|s| s.truncate(table))
    }

    /// Drops a table's data (DROP TABLE, DROP KEYSPACE): as [`truncate`](Self::truncate),
    /// but the table keeps no keyspace, and a write that races with the drop is discarded.
    pub fn drop_table(&self, table: TableId) -> Result<(), StorageError> {
        self.forget_partition_sizes();
        self.inner
            .stores
            .iter()
            .try_for_each(|s| s.drop_table(table))
    }

    /// Truncated or dropped tables' keyspaces whose files are not deleted yet, over every
    /// store (tests, metrics).
    pub fn pending_table_deletions(&self) -> usize {
        self.inner
            .stores
            .iter()
            .map(Store::pending_table_deletions)
            .sum()
    }

    /// Test hook: each store's keyspace names, as fjall lists them.
    #[cfg(test)]
    pub(crate) fn keyspace_names(&self) -> Vec<Vec<String>> {
        self.inner
            .stores
            .iter()
            .map(Store::keyspace_names)
            .collect()
    }

    /// Test hook: the names of a table's current keyspaces, each with its store's index.
    #[cfg(test)]
    pub(crate) fn table_keyspace_names(&self, table: TableId) -> Vec<(usize, String)> {
        self.inner
            .stores
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.table_keyspace_name(table).map(|n| (i, n)))
            .collect()
    }

    /// Purge jobs dropped because a store's purge queue was full; their rows stay hidden by
    /// the deletion and are purged once the queue drains (tests, metrics).
    pub fn dropped_purge_jobs(&self) -> u64 {
        self.inner
            .stores
            .iter()
            .map(Store::dropped_purge_jobs)
            .sum()
    }

    /// The background purges' counters summed over every store (metrics).
    pub fn purge_stats(&self) -> crate::PurgeStats {
        self.inner
            .stores
            .iter()
            .map(Store::purge_stats)
            .fold(crate::PurgeStats::default(), |a, b| a.plus(&b))
    }

    /// Rows the background purgers examined for shadowed rows (tests, metrics).
    pub fn purge_rows_examined(&self) -> u64 {
        self.inner
            .stores
            .iter()
            .map(Store::purge_rows_examined)
            .sum()
    }

    /// Test hook: waits at most `limit` for every store's purger to finish; true if they did.
    #[cfg(test)]
    pub(crate) fn wait_purges(&self, limit: std::time::Duration) -> bool {
        self.inner.stores.iter().all(|s| s.wait_purges(limit))
    }

    /// Test hook: the purge records left in every store.
    #[cfg(test)]
    pub(crate) fn purge_record_count(&self) -> usize {
        self.inner
            .stores
            .iter()
            .map(Store::purge_record_count)
            .sum()
    }

    /// Test hook: holds every store's purger while the guards live.
    #[cfg(test)]
    pub(crate) fn hold_purgers(&self) -> Vec<crate::store::PurgeHold<'_>> {
        self.inner.stores.iter().map(Store::hold_purger).collect()
    }

    /// Test hook: holds every store's table deleter while the guards live.
    #[cfg(test)]
    pub(crate) fn hold_deleters(&self) -> Vec<crate::store::DeletionHold<'_>> {
        self.inner.stores.iter().map(Store::hold_deleter).collect()
    }

    /// Small durable metadata store for the schema catalog (synchronously fsynced).
    pub fn meta_put(&self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.inner.stores[0].meta_put(key, value)
    }

    /// Deletes one metadata key (synchronously fsynced).
    pub fn meta_delete(&self, key: &[u8]) -> Result<(), StorageError> {
        self.inner.stores[0].meta_delete(key)
    }

    /// All metadata entries whose key starts with `prefix`, in key order.
    pub fn meta_scan(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>, StorageError> {
        self.inner.stores[0].meta_scan(prefix)
    }

    /// Flushes and fsyncs everything (clean shutdown). Later calls fail with `Closed`.
    pub fn close(&self) -> Result<(), StorageError> {
        // Every store is closed, even when one of them fails.
        let results: Vec<_> = self.inner.stores.iter().map(Store::close).collect();
        results.into_iter().collect()
    }
}

/// The store directories of a data directory: `store-0` .. `store-{n-1}` as its `STORES`
/// file says, writing that file (with `wanted` stores) when the directory is new. A
/// non-empty directory without it predates stores and is one store itself.
fn store_dirs(path: &Path, wanted: usize) -> Result<Vec<std::path::PathBuf>, StorageError> {
    const IO: StorageError = StorageError::Io("cannot set up the data directory");
    let log = |e: std::io::Error| {
        tracing::error!(error = %e, path = %path.display(), "data directory");
        IO
    };
    let file = path.join(STORES_FILE);
    let count = match std::fs::read_to_string(&file) {
        Ok(text) => text
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_STORES).contains(n))
            .ok_or(StorageError::Corrupt(
                "bad STORES file in the data directory",
            ))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let has_data = match std::fs::read_dir(path) {
                Ok(mut entries) => entries.next().is_some(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => return Err(log(e)),
            };
            if has_data {
                return Ok(vec![path.to_path_buf()]);
            }
            let count = wanted.clamp(1, MAX_STORES);
            std::fs::create_dir_all(path).map_err(log)?;
            write_durably(path, STORES_FILE, format!("{count}\n").as_bytes()).map_err(log)?;
            count
        }
        Err(e) => return Err(log(e)),
    };
    if count != wanted {
        tracing::info!(
            stores = count,
            wanted,
            "the data directory keeps the number of stores it was created with"
        );
    }
    Ok((0..count)
        .map(|i| path.join(format!("store-{i}")))
        .collect())
}

/// Writes `name` in `dir` through a temporary file, fsyncing the file and the directory.
fn write_durably(dir: &Path, name: &str, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(contents)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

/// A batchlog record: the number of parts, then per part its store and its entries.
fn encode_record(parts: &[(usize, Prepared)]) -> Result<Vec<u8>, StorageError> {
    encode_parts(parts.len(), parts.iter())
}

/// A batchlog record of `count` parts.
fn encode_parts<'p>(
    count: usize,
    parts: impl Iterator<Item = &'p (usize, Prepared)>,
) -> Result<Vec<u8>, StorageError> {
    let mut out = Vec::new();
    out.extend_from_slice(&(count as u32).to_be_bytes());
    for (store, prepared) in parts {
        out.extend_from_slice(&(*store as u32).to_be_bytes());
        prepared.encode(&mut out)?;
    }
    Ok(out)
}

/// Decodes `encode_record`, checking every store index against `stores`.
fn decode_record(mut input: &[u8], stores: usize) -> Result<Vec<(usize, Prepared)>, StorageError> {
    const BAD: StorageError = StorageError::Corrupt("bad batchlog record");
    let count = take_batchlog_len(&mut input)?;
    let mut parts = Vec::new();
    for _ in 0..count {
        let store = take_batchlog_len(&mut input)?;
        if store >= stores {
            return Err(BAD);
        }
        parts.push((store, Prepared::decode(&mut input)?));
    }
    if !input.is_empty() {
        return Err(BAD);
    }
    Ok(parts)
}
