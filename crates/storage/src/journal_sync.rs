//! Fsyncs fjall's active journal through our own file handle, outside fjall's journal lock.
//!
//! `Database::persist` runs `fdatasync` while holding the journal writer mutex, so every
//! writer (and the stripe locks it holds) stalls for the whole fsync; with this, writers
//! keep appending while it runs. Writes are already in the OS page cache when a
//! ticket is handed out (fjall flushes its buffer on every batch), so `fdatasync` on any
//! descriptor of the journal file makes them durable.
//!
//! Correctness across journal rotation: fjall names journals `<id>.jnl` in the database
//! folder, the highest id being the active one, and it fsyncs (SyncAll) the old journal
//! BEFORE it creates `<id + 1>.jnl`. So once the sync thread has read the applied ticket
//! counter and then found the highest existing journal, every earlier journal is already
//! durable and syncing the found one covers every ticket up to the counter. When the layout
//! is not what we expect, the caller falls back to `Database::persist`.

use std::fs::File;
use std::path::{Path, PathBuf};

/// The sync thread's handle on the active journal.
pub struct JournalSyncer {
    folder: PathBuf,
    current: Option<(u64, File)>,
    /// Set after the journal was not found once: the layout is not what we expect, so the
    /// caller's fallback is used from then on (and the warning logged once).
    disabled: bool,
}

/// The journal file could not be located or synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SideSyncError {
    /// No `<id>.jnl` file where fjall keeps them: use `Database::persist` instead.
    NotFound,
    /// `fdatasync` (or opening the file) failed: durability is lost.
    Io,
}

fn journal_path(folder: &Path, id: u64) -> PathBuf {
    folder.join(format!("{id}.jnl"))
}

impl JournalSyncer {
    /// A syncer for the journals of the database at `folder`.
    pub fn new(folder: &Path) -> JournalSyncer {
        JournalSyncer {
            folder: folder.to_path_buf(),
            current: None,
            disabled: false,
        }
    }

    /// The highest journal id in the folder.
    fn scan_active(&self) -> Option<u64> {
        std::fs::read_dir(&self.folder)
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".jnl"))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .max()
    }

    /// Fsyncs the active journal (data only: appends need no metadata but the size, which
    /// `fdatasync` covers).
    pub fn sync(&mut self) -> Result<(), SideSyncError> {
        if self.disabled {
            return Err(SideSyncError::NotFound);
        }
        let result = self.sync_active();
        if result == Err(SideSyncError::NotFound) {
            tracing::warn!(
                folder = %self.folder.display(),
                "fjall journal not found; falling back to fsync under fjall's journal lock"
            );
            self.disabled = true;
        }
        result
    }

    /// Starts writing the active journal's dirty pages back without waiting for them
    /// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), so that the next `sync` finds little left.
    ///
    /// In periodic mode an fsync otherwise writes back up to a whole period of appends at
    /// once, and while ext4 allocates blocks for them it holds the inode's `i_data_sem`, which
    /// the shard's next journal `write(2)` also needs, so the shard stalls behind the fsync.
    /// RocksDB's `wal_bytes_per_sync` does the same. Durability is unchanged: only `sync`
    /// makes writes durable. Best effort: errors are left to the next `sync`.
    pub fn start_writeback(&mut self) {
        if self.disabled || self.open_active().is_err() {
            return;
        }
        #[cfg(target_os = "linux")]
        if let Some((_, file)) = &self.current {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor we own; offset 0 and length 0 mean the whole file.
            unsafe {
                libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
    }

    fn sync_active(&mut self) -> Result<(), SideSyncError> {
        self.open_active()?;
        match &self.current {
            Some((_, file)) => file.sync_data().map_err(|e| {
                tracing::error!(error = %e, "journal fdatasync failed");
                SideSyncError::Io
            }),
            None => Err(SideSyncError::NotFound),
        }
    }

    /// Opens the active journal if it is not the one held (following rotations).
    fn open_active(&mut self) -> Result<(), SideSyncError> {
        let mut id = match &self.current {
            Some((id, _)) => *id,
            None => self.scan_active().ok_or(SideSyncError::NotFound)?,
        };
        // Follow rotations: a newer journal only exists once the older one is synced.
        while journal_path(&self.folder, id + 1).exists() {
            id += 1;
        }
        if self.current.as_ref().is_none_or(|(cur, _)| *cur != id) {
            // Opened for writing (never written through) so that the sync also works where
            // flushing needs write access; nothing is created or truncated.
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(journal_path(&self.folder, id))
                .map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        SideSyncError::NotFound
                    } else {
                        SideSyncError::Io
                    }
                })?;
            self.current = Some((id, file));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_rotation_and_reports_missing_journals() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = JournalSyncer::new(dir.path());
        assert_eq!(s.sync(), Err(SideSyncError::NotFound));
        // Once not found, it stays on the fallback.
        std::fs::write(dir.path().join("1.jnl"), b"z").unwrap();
        assert_eq!(s.sync(), Err(SideSyncError::NotFound));
        let mut s = JournalSyncer::new(dir.path());
        std::fs::remove_file(dir.path().join("1.jnl")).unwrap();
        std::fs::write(dir.path().join("3.jnl"), b"a").unwrap();
        std::fs::write(dir.path().join("12.jnl"), b"b").unwrap();
        std::fs::write(dir.path().join("x.jnl"), b"c").unwrap();
        s.sync().unwrap();
        assert_eq!(s.current.as_ref().map(|c| c.0), Some(12));
        std::fs::write(dir.path().join("13.jnl"), b"d").unwrap();
        std::fs::write(dir.path().join("14.jnl"), b"e").unwrap();
        // Starting the writeback follows rotations the same way.
        s.start_writeback();
        assert_eq!(s.current.as_ref().map(|c| c.0), Some(14));
        s.sync().unwrap();
        assert_eq!(s.current.as_ref().map(|c| c.0), Some(14));
    }
}
