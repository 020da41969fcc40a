//! What one write may store (the largest cell value, the largest mutation of one partition,
//! optionally the largest partition) and the disk-space guard that refuses writes before
//! the file system fills.
//!
//! fjall poisons its whole database on any failed journal write, flush or compaction (an
//! `ENOSPC` included): every later write fails until the process reopens it. So Sluice does
//! not let the disk fill: a thread samples the data directory's free space, and writes are
//! refused with a clear error while it is below a reserve, which is left for memtable
//! flushes, compactions and the deletions that free space. Reads go on; writes resume by
//! themselves once space is freed.

use crate::model::{CellValue, Mutation, RowMutation};
use crate::StorageError;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Default largest cell value: Cassandra bounds a mutation at half its commit log segment
/// (16 MiB by default) and has no lower bound on a cell, so neither has Sluice by default.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 16 << 20;

/// Default largest mutation of one partition (one statement, or a batch's part for one
/// partition): Cassandra's `max_mutation_size`, half of its 32 MiB commit log segment.
pub const DEFAULT_MAX_MUTATION_BYTES: usize = 16 << 20;

/// Slots of the partition size estimates (16 bytes each): the partitions written most are
/// kept, the others are forgotten (see [`PartitionSizes`]).
pub(crate) const PARTITION_SIZE_SLOTS: usize = 1 << 14;

/// Default free space below which the node refuses writes: room for several memtable
/// flushes (16 MiB each) and the compactions that follow them. (A storage opened without
/// `Storage::set_min_free_disk_bytes` has no reserve.)
pub const DEFAULT_MIN_FREE_DISK_BYTES: u64 = 1 << 30;

/// How often the free space of the data directory is sampled.
const DISK_SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// The answer to a write while the disk is below its reserve.
pub const DISK_FULL_MESSAGE: &str = "No space left on device: the data directory's file system \
    has less free space than min-free-disk-bytes; writes are refused until space is freed \
    (reads go on)";

/// The answer once fjall has failed a disk write and stopped accepting writes.
pub const STORAGE_FAILED_MESSAGE: &str = "Storage stopped accepting writes after a failed disk \
    write (see the log: no space left on device, or an I/O error); restart the node once the \
    disk is fixed";

/// Limits on the size of one write, with their error messages built once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteLimits {
    max_value_bytes: usize,
    max_mutation_bytes: usize,
    /// The largest partition (its estimate, see [`PartitionSizes`]); 0: no limit.
    max_partition_bytes: u64,
    value_message: &'static str,
    mutation_message: &'static str,
    partition_message: &'static str,
}

impl Default for WriteLimits {
    fn default() -> WriteLimits {
        WriteLimits {
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_mutation_bytes: DEFAULT_MAX_MUTATION_BYTES,
            max_partition_bytes: 0,
            value_message: "A cell value is larger than max-value-bytes (16777216 bytes)",
            mutation_message: "The mutation of one partition is larger than \
                max-mutation-bytes (16777216 bytes)",
            partition_message: "",
        }
    }
}

impl WriteLimits {
    /// Limits of `max_value_bytes` per cell value and `max_mutation_bytes` per partition
    /// mutation. Builds their messages, naming the limits, once: call it at start-up.
    pub fn new(max_value_bytes: usize, max_mutation_bytes: usize) -> WriteLimits {
        if (max_value_bytes, max_mutation_bytes)
            == (DEFAULT_MAX_VALUE_BYTES, DEFAULT_MAX_MUTATION_BYTES)
        {
            return WriteLimits::default();
        }
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        WriteLimits {
            max_value_bytes,
            max_mutation_bytes,
            max_partition_bytes: 0,
            partition_message: "",
            value_message: leak(format!(
                "A cell value is larger than max-value-bytes ({max_value_bytes} bytes)"
            )),
            mutation_message: leak(format!(
                "The mutation of one partition is larger than max-mutation-bytes \
                 ({max_mutation_bytes} bytes)"
            )),
        }
    }

    /// These limits and a largest partition of `bytes` (0: none). Builds its message,
    /// naming the limit, once: call it at start-up.
    pub fn with_max_partition_bytes(self, bytes: u64) -> WriteLimits {
        let partition_message = match bytes {
            0 => "",
            _ => Box::leak(
                format!("The partition would grow larger than max-partition-bytes ({bytes} bytes)")
                    .into_boxed_str(),
            ),
        };
        WriteLimits {
            max_partition_bytes: bytes,
            partition_message,
            ..self
        }
    }

    /// The largest partition (0: no limit).
    pub fn max_partition_bytes(&self) -> u64 {
        self.max_partition_bytes
    }

    /// The largest cell value.
    pub fn max_value_bytes(&self) -> usize {
        self.max_value_bytes
    }

    /// The largest mutation of one partition.
    pub fn max_mutation_bytes(&self) -> usize {
        self.max_mutation_bytes
    }

    /// `TooLarge` naming the limit when a cell of `m` or `m` as a whole is over its limit;
    /// else the bytes `m` adds to its partition (keys and values).
    pub(crate) fn check(&self, m: &Mutation) -> Result<usize, StorageError> {
        let mut total = m.partition_key.len();
        let rows = m.static_row.iter().chain(&m.rows);
        for row in rows {
            total += self.row_bytes(row)?;
        }
        if total > self.max_mutation_bytes {
            return Err(StorageError::TooLarge(self.mutation_message));
        }
        Ok(total)
    }

    /// The key and value bytes of one row's changes; `TooLarge` for a cell over the limit.
    fn row_bytes(&self, row: &RowMutation) -> Result<usize, StorageError> {
        let mut bytes: usize = row.clustering.iter().map(|c| c.len()).sum();
        for cell in &row.cells {
            let value = match &cell.value {
                CellValue::Live(v) => v.len(),
                CellValue::Tombstone | CellValue::CounterDelta(_) => 0,
            };
            if value > self.max_value_bytes {
                return Err(StorageError::TooLarge(self.value_message));
            }
            bytes += value + cell.path.as_ref().map_or(0, |p| p.len());
        }
        Ok(bytes)
    }
}

/// An estimate of each partition's size, for the partition size limit: the bytes written to
/// it (keys and values, as [`WriteLimits::check`] counts them) since the node started or
/// since its last whole-partition deletion. Overwrites count again, so it is an upper bound
/// of what those writes left; what was written before a restart is not counted.
///
/// Bounded memory: a fixed table of [`PARTITION_SIZE_SLOTS`] slots. A partition may take
/// one of two slots (by its hash); when both hold other partitions, it replaces the one
/// with the smaller estimate if that is below its own, else it goes uncounted for this
/// write. So the biggest partitions keep their slots and small ones are forgotten, which
/// only ever under-counts. Slots are atomics without a lock: concurrent writes to one
/// partition may lose an addition, which is also an under-count.
pub(crate) struct PartitionSizes {
    /// Per slot: the partition's hash (0: empty) and its estimate in bytes.
    slots: Box<[(AtomicU64, AtomicU64)]>,
}

impl PartitionSizes {
    /// An empty table.
    pub(crate) fn new() -> PartitionSizes {
        PartitionSizes {
            slots: (0..PARTITION_SIZE_SLOTS)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        }
    }

    /// The hash of `m`'s partition: its token (already a hash of the partition key) mixed
    /// with its table; never 0, which marks an empty slot.
    fn hash_of(m: &Mutation) -> u64 {
        let lo = u64::from_le_bytes(m.table[..8].try_into().unwrap_or([0; 8]));
        let hi = u64::from_le_bytes(m.table[8..].try_into().unwrap_or([0; 8]));
        let table = lo.wrapping_mul(0xFF51_AFD7_ED55_8CCD)
            ^ hi.wrapping_mul(0xC4CE_B9FE_1A85_EC53).rotate_left(31);
        let mixed = (m.token as u64 ^ table).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (mixed ^ (mixed >> 29)).max(1)
    }

    /// The two slots a hash may take.
    fn candidates(hash: u64) -> [usize; 2] {
        let mask = PARTITION_SIZE_SLOTS - 1;
        [(hash >> 20) as usize & mask, (hash >> 40) as usize & mask]
    }

    /// The estimate of `m`'s partition before `m` (0 when not tracked).
    pub(crate) fn estimate(&self, m: &Mutation) -> u64 {
        let hash = Self::hash_of(m);
        Self::candidates(hash)
            .iter()
            .map(|&i| &self.slots[i])
            .find(|(h, _)| h.load(Ordering::Relaxed) == hash)
            .map_or(0, |(_, bytes)| bytes.load(Ordering::Relaxed))
    }

    /// `TooLarge` with `limits`' message when `m` would take its partition's estimate over
    /// the limit (none when the limit is 0).
    pub(crate) fn check(
        &self,
        limits: &WriteLimits,
        m: &Mutation,
        bytes: usize,
    ) -> Result<(), StorageError> {
        if limits.max_partition_bytes == 0 || m.partition_deletion.is_some() {
            return Ok(());
        }
        if self.estimate(m).saturating_add(bytes as u64) > limits.max_partition_bytes {
            return Err(StorageError::TooLarge(limits.partition_message));
        }
        Ok(())
    }

    /// Counts a written mutation of `bytes`: a partition deletion starts its partition's
    /// estimate again from `bytes`.
    pub(crate) fn record(&self, m: &Mutation, bytes: usize) {
        let hash = Self::hash_of(m);
        let bytes = bytes as u64;
        let [a, b] = Self::candidates(hash).map(|i| &self.slots[i]);
        for (h, estimate) in [a, b] {
            if h.load(Ordering::Relaxed) == hash {
                if m.partition_deletion.is_some() {
                    estimate.store(bytes, Ordering::Relaxed);
                } else {
                    estimate.fetch_add(bytes, Ordering::Relaxed);
                }
                return;
            }
        }
        // Not tracked: take an empty slot, or the smaller one if below this partition.
        let victim = if a.1.load(Ordering::Relaxed) <= b.1.load(Ordering::Relaxed) {
            a
        } else {
            b
        };
        let empty = [a, b]
            .into_iter()
            .find(|(h, _)| h.load(Ordering::Relaxed) == 0);
        let slot = match empty {
            Some(slot) => slot,
            None if victim.1.load(Ordering::Relaxed) < bytes => victim,
            None => return,
        };
        slot.0.store(hash, Ordering::Relaxed);
        slot.1.store(bytes, Ordering::Relaxed);
    }

    /// Forgets every estimate (a table was truncated or dropped: which slots were its
    /// partitions is not known, and forgetting only under-counts).
    pub(crate) fn clear(&self) {
        for (h, bytes) in self.slots.iter() {
            h.store(0, Ordering::Relaxed);
            bytes.store(0, Ordering::Relaxed);
        }
    }
}

/// Bytes the memtables hold that a flush will write to disk (each store's active and sealed
/// memtables); the free-space guard counts them as already used.
pub(crate) type UnflushedBytes = Box<dyn Fn() -> u64 + Send>;

/// The free-space guard of one data directory: a sampling thread keeps `full` current.
pub(crate) struct DiskSpace {
    /// Free space, less the unflushed memtable bytes, is below the reserve: writes are refused.
    full: AtomicBool,
    /// The reserve in bytes.
    min_free: AtomicU64,
    /// Test hook: the free space to assume instead of the file system's (`u64::MAX` = none).
    free_override: AtomicU64,
    /// Reads the unflushed memtable bytes (fjall handles: let go when the sampler stops).
    unflushed: std::sync::Mutex<UnflushedBytes>,
    /// Asks the sampling thread to stop.
    stop: AtomicBool,
    path: PathBuf,
}

/// The sampling thread of a [`DiskSpace`]; stops it and waits for it when dropped, so that
/// the memtable sizes it reads (fjall handles) are let go before the stores close.
pub(crate) struct DiskSampler {
    space: Arc<DiskSpace>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::ops::Deref for DiskSampler {
    type Target = DiskSpace;
    fn deref(&self) -> &DiskSpace {
        &self.space
    }
}

impl Drop for DiskSampler {
    fn drop(&mut self) {
        self.space.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            if t.join().is_err() {
                tracing::error!("disk space thread panicked");
            }
        }
    }
}

impl DiskSpace {
    /// Starts sampling `path`'s file system and `unflushed` (the memtable bytes a flush will
    /// write there) until the returned sampler is dropped.
    pub(crate) fn start(
        path: &Path,
        unflushed: UnflushedBytes,
    ) -> Result<DiskSampler, StorageError> {
        let space = Arc::new(DiskSpace {
            full: AtomicBool::new(false),
            min_free: AtomicU64::new(0),
            free_override: AtomicU64::new(u64::MAX),
            unflushed: std::sync::Mutex::new(unflushed),
            stop: AtomicBool::new(false),
            path: path.to_path_buf(),
        });
        space.sample();
        let sampled = space.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-disk-space".into())
            .spawn(move || {
                while !sampled.stop.load(Ordering::Acquire) {
                    std::thread::park_timeout(DISK_SAMPLE_EVERY);
                    sampled.sample();
                }
            })
            .map_err(|_| StorageError::Io("cannot start the disk space thread"))?;
        Ok(DiskSampler {
            space,
            thread: Some(thread),
        })
    }

    /// Reads the free space and updates `full`; logs each change.
    fn sample(&self) {
        let free = match self.free_override.load(Ordering::Relaxed) {
            u64::MAX => match free_bytes(&self.path) {
                Some(free) => free,
                // Unknown: keep the last verdict rather than guess.
                None => return,
            },
            free => free,
        };
        let min_free = self.min_free.load(Ordering::Relaxed);
        // A flush of what the memtables hold takes that much of the free space: count it
        // now, so that a write the reserve accepts cannot be followed by a flush that fills
        // the disk.
        let unflushed = (self.unflushed.lock().unwrap_or_else(|e| e.into_inner()))();
        let full = free.saturating_sub(unflushed) < min_free;
        if self.full.swap(full, Ordering::Relaxed) != full {
            if full {
                tracing::error!(
                    free,
                    unflushed,
                    min_free,
                    path = %self.path.display(),
                    "disk almost full: writes are refused until space is freed"
                );
            } else {
                tracing::warn!(
                    free,
                    unflushed,
                    min_free,
                    "disk space freed: writes accepted again"
                );
            }
        }
    }

    /// `Err` with [`DISK_FULL_MESSAGE`] while free space is below the reserve.
    pub(crate) fn check(&self) -> Result<(), StorageError> {
        if self.full.load(Ordering::Relaxed) {
            return Err(StorageError::Io(DISK_FULL_MESSAGE));
        }
        Ok(())
    }

    /// Sets the reserve and samples at once.
    pub(crate) fn set_min_free(&self, bytes: u64) {
        self.min_free.store(bytes, Ordering::Relaxed);
        self.sample();
    }

    /// Test hook: assume `free` bytes free (`None`: read the file system again), sampled at once.
    pub(crate) fn override_free(&self, free: Option<u64>) {
        self.free_override
            .store(free.unwrap_or(u64::MAX), Ordering::Relaxed);
        self.sample();
    }
}

/// Bytes available to an unprivileged writer on `path`'s file system.
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` is writable memory of the
    // right type; statvfs initialises it when it returns 0.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between platforms
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CellWrite, Mutation};
    use bytes::Bytes;

    fn mutation(values: &[usize]) -> Mutation {
        Mutation {
            table: [1; 16],
            token: 1,
            partition_key: Bytes::from_static(b"k"),
            partition_deletion: None,
            range_deletions: vec![],
            static_row: None,
            rows: vec![RowMutation {
                cells: values
                    .iter()
                    .map(|&n| CellWrite {
                        column: 1,
                        path: None,
                        value: CellValue::Live(Bytes::from(vec![0u8; n])),
                        timestamp: 1,
                        expiry: None,
                    })
                    .collect(),
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_cell_or_a_mutation_over_its_limit_is_too_large_with_the_limit_named() {
        let limits = WriteLimits::new(1000, 2500);
        assert_eq!(limits.check(&mutation(&[1000, 1000])), Ok(2001));
        assert_eq!(
            limits.check(&mutation(&[1001])),
            Err(StorageError::TooLarge(
                "A cell value is larger than max-value-bytes (1000 bytes)"
            ))
        );
        assert_eq!(
            limits.check(&mutation(&[1000, 1000, 1000])),
            Err(StorageError::TooLarge(
                "The mutation of one partition is larger than max-mutation-bytes (2500 bytes)"
            ))
        );
        // The defaults' messages name the defaults.
        let d = WriteLimits::default();
        assert_eq!(d, WriteLimits::new(16 << 20, 16 << 20));
        assert!(d.value_message.contains(&(16usize << 20).to_string()));
        assert!(d.mutation_message.contains(&(16usize << 20).to_string()));
    }

    #[test]
    fn the_guard_refuses_writes_below_the_reserve_and_accepts_them_again() {
        let dir = tempfile::tempdir().unwrap();
        let space = DiskSpace::start(dir.path(), Box::new(|| 0)).unwrap();
        space.set_min_free(1);
        assert_eq!(space.check(), Ok(()));
        assert!(free_bytes(dir.path()).is_some_and(|f| f > 0));
        space.override_free(Some(0));
        assert_eq!(space.check(), Err(StorageError::Io(DISK_FULL_MESSAGE)));
        space.override_free(None);
        assert_eq!(space.check(), Ok(()));
        // A reserve above the free space refuses too.
        space.set_min_free(u64::MAX - 1);
        assert_eq!(space.check(), Err(StorageError::Io(DISK_FULL_MESSAGE)));
    }

    #[test]
    fn the_guard_counts_unflushed_memtable_bytes_as_used() {
        let dir = tempfile::tempdir().unwrap();
        let unflushed = Arc::new(AtomicU64::new(0));
        let source = unflushed.clone();
        let space =
            DiskSpace::start(dir.path(), Box::new(move || source.load(Ordering::Relaxed))).unwrap();
        space.set_min_free(1000);
        space.override_free(Some(1500));
        assert_eq!(space.check(), Ok(()), "500 bytes above the reserve");
        // Memtables holding 501 bytes would take the disk below the reserve once flushed.
        unflushed.store(501, Ordering::Relaxed);
        space.override_free(Some(1500));
        assert_eq!(space.check(), Err(StorageError::Io(DISK_FULL_MESSAGE)));
        // Flushed: the bytes are on disk now, so the free space fell by them instead.
        unflushed.store(0, Ordering::Relaxed);
        space.override_free(Some(999));
        assert_eq!(space.check(), Err(StorageError::Io(DISK_FULL_MESSAGE)));
        space.override_free(Some(1500));
        assert_eq!(space.check(), Ok(()));
        // More memtable bytes than free space saturate instead of wrapping around.
        unflushed.store(u64::MAX / 2, Ordering::Relaxed);
        space.override_free(Some(1500));
        assert_eq!(space.check(), Err(StorageError::Io(DISK_FULL_MESSAGE)));
        // The sampling thread reads the source by itself too.
        unflushed.store(0, Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while space.check().is_err() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(space.check(), Ok(()));
        drop(space);
        assert_eq!(
            Arc::strong_count(&unflushed),
            1,
            "the stopped sampler let go of its source"
        );
    }

    #[test]
    fn a_partition_over_its_limit_is_refused_with_the_limit_named() {
        let limits = WriteLimits::new(1000, 2500).with_max_partition_bytes(5000);
        assert_eq!(limits.max_partition_bytes(), 5000);
        let sizes = PartitionSizes::new();
        let m = mutation(&[999]); // 1,000 bytes with its key
        for _ in 0..5 {
            let bytes = limits.check(&m).unwrap();
            assert_eq!(sizes.check(&limits, &m, bytes), Ok(()));
            sizes.record(&m, bytes);
        }
        assert_eq!(sizes.estimate(&m), 5000);
        let one_more = mutation(&[0]);
        assert_eq!(
            sizes.check(&limits, &one_more, 2),
            Err(StorageError::TooLarge(
                "The partition would grow larger than max-partition-bytes (5000 bytes)"
            ))
        );
        // Another partition of the same table, and the same partition of another table,
        // have estimates of their own.
        let mut other = mutation(&[999]);
        other.token = 2;
        assert_eq!(sizes.check(&limits, &other, 1000), Ok(()));
        other.token = 1;
        other.table = [2; 16];
        assert_eq!(sizes.check(&limits, &other, 1000), Ok(()));
        // A partition deletion starts the partition again.
        let mut deletion = mutation(&[]);
        deletion.partition_deletion = Some(2);
        sizes.record(&deletion, 1);
        assert_eq!(sizes.check(&limits, &m, 1000), Ok(()));
        // Without a limit nothing is refused.
        let unlimited = WriteLimits::new(1000, 2500);
        sizes.record(&m, 1 << 40);
        assert_eq!(sizes.check(&unlimited, &m, 1000), Ok(()));
        sizes.clear();
        assert_eq!(sizes.estimate(&m), 0);
    }

    #[test]
    fn partition_estimates_stay_in_their_slots_and_keep_the_biggest() {
        let sizes = PartitionSizes::new();
        let at = |token: i64| {
            let mut m = mutation(&[]);
            m.token = token;
            m
        };
        // Far more partitions than slots: memory stays the table's, and the big partition
        // written first keeps its estimate against every small one after it.
        sizes.record(&at(-1), 1 << 30);
        for token in 0..(4 * PARTITION_SIZE_SLOTS as i64) {
            sizes.record(&at(token.wrapping_mul(0x2545_F491_4F6C_DD1D)), 10);
        }
        assert_eq!(sizes.estimate(&at(-1)), 1 << 30);
        assert_eq!(sizes.slots.len(), PARTITION_SIZE_SLOTS);
        let tracked = sizes
            .slots
            .iter()
            .filter(|(h, _)| h.load(Ordering::Relaxed) != 0)
            .count();
        assert!(tracked > PARTITION_SIZE_SLOTS / 2, "{tracked} slots used");
    }
}
