//! What one write may store (the largest cell value, the largest mutation of one partition)
//! and the disk-space guard that refuses writes before the file system fills.
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
    value_message: &'static str,
    mutation_message: &'static str,
}

impl Default for WriteLimits {
    fn default() -> WriteLimits {
        WriteLimits {
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
            max_mutation_bytes: DEFAULT_MAX_MUTATION_BYTES,
            value_message: "A cell value is larger than max-value-bytes (16777216 bytes)",
            mutation_message: "The mutation of one partition is larger than \
                max-mutation-bytes (16777216 bytes)",
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
            value_message: leak(format!(
                "A cell value is larger than max-value-bytes ({max_value_bytes} bytes)"
            )),
            mutation_message: leak(format!(
                "The mutation of one partition is larger than max-mutation-bytes \
                 ({max_mutation_bytes} bytes)"
            )),
        }
    }

    /// The largest cell value.
    pub fn max_value_bytes(&self) -> usize {
        self.max_value_bytes
    }

    /// The largest mutation of one partition.
    pub fn max_mutation_bytes(&self) -> usize {
        self.max_mutation_bytes
    }

    /// `TooLarge` naming the limit when a cell of `m` or `m` as a whole is over its limit.
    pub(crate) fn check(&self, m: &Mutation) -> Result<(), StorageError> {
        let mut total = m.partition_key.len();
        let rows = m.static_row.iter().chain(&m.rows);
        for row in rows {
            total += self.row_bytes(row)?;
        }
        if total > self.max_mutation_bytes {
            return Err(StorageError::TooLarge(self.mutation_message));
        }
        Ok(())
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

/// The free-space guard of one data directory: a sampling thread keeps `full` current.
#[derive(Debug)]
pub(crate) struct DiskSpace {
    /// Free space is below the reserve: writes are refused.
    full: AtomicBool,
    /// The reserve in bytes.
    min_free: AtomicU64,
    /// Test hook: the free space to assume instead of the file system's (`u64::MAX` = none).
    free_override: AtomicU64,
    path: PathBuf,
}

impl DiskSpace {
    /// Starts sampling `path`'s file system. The thread stops once the returned guard is the
    /// last holder of the state (the storage was dropped).
    pub(crate) fn start(path: &Path) -> Result<Arc<DiskSpace>, StorageError> {
        let space = Arc::new(DiskSpace {
            full: AtomicBool::new(false),
            min_free: AtomicU64::new(0),
            free_override: AtomicU64::new(u64::MAX),
            path: path.to_path_buf(),
        });
        space.sample();
        let sampled = space.clone();
        std::thread::Builder::new()
            .name("sluice-disk-space".into())
            .spawn(move || {
                while Arc::strong_count(&sampled) > 1 {
                    std::thread::sleep(DISK_SAMPLE_EVERY);
                    sampled.sample();
                }
            })
            .map_err(|_| StorageError::Io("cannot start the disk space thread"))?;
        Ok(space)
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
        let full = free < min_free;
        if self.full.swap(full, Ordering::Relaxed) != full {
            if full {
                tracing::error!(
                    free,
                    min_free,
                    path = %self.path.display(),
                    "disk almost full: writes are refused until space is freed"
                );
            } else {
                tracing::warn!(free, min_free, "disk space freed: writes accepted again");
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
        assert_eq!(limits.check(&mutation(&[1000, 1000])), Ok(()));
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
        let space = DiskSpace::start(dir.path()).unwrap();
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
}
