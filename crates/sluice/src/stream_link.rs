//! The node's storage and schema, as the cluster layer streams them
//! (`sluice_cluster::LocalData`): the replicated tables of the current schema, a token range
//! of a table out of storage, streamed records into it, and the bytes on disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_cluster::streaming::{ImportFuture, Record, TableKey};
use sluice_cluster::{LocalData, StreamChunk, StreamTable};
use sluice_engine::Engine;
use sluice_ring::Replication;
use sluice_storage::{RawRecord, Storage};

/// Most directory levels the load walk descends (the data directory is a few deep).
const MAX_LOAD_DEPTH: usize = 8;

/// The engine's schema and storage, for streaming.
pub struct EngineData {
    engine: Arc<Engine>,
    storage: Storage,
    data_dir: PathBuf,
}

impl EngineData {
    /// Streams `engine`'s tables in and out of `storage`, whose files are under `data_dir`.
    pub fn new(engine: Arc<Engine>, storage: Storage, data_dir: PathBuf) -> EngineData {
        EngineData {
            engine,
            storage,
            data_dir,
        }
    }
}

impl LocalData for EngineData {
    fn tables(&self) -> Vec<StreamTable> {
        let schema = self.engine.schema();
        let mut tables = Vec::new();
        for keyspace in schema.keyspaces.values() {
            if sluice_engine::catalog::is_system_keyspace(&keyspace.name) {
                continue;
            }
            let replication = match Replication::from_map(&keyspace.replication) {
                Ok(Replication::Local) => continue,
                Ok(replication) => replication,
                Err(error) => {
                    tracing::warn!(keyspace = %keyspace.name, %error, "not streamed: its replication cannot be placed");
                    continue;
                }
            };
            for table in schema.tables_of(&keyspace.name) {
                if table.is_virtual() {
                    continue;
                }
                tables.push(StreamTable {
                    id: table.layout.id,
                    replication: replication.clone(),
                });
            }
        }
        tables
    }

    fn export(
        &self,
        table: TableKey,
        start: Option<i64>,
        end: i64,
        after: Option<&[u8]>,
        max_bytes: usize,
    ) -> Result<StreamChunk, &'static str> {
        let chunk = self
            .storage
            .export_token_range(table, start, end, after, max_bytes)
            .map_err(storage_message)?;
        Ok(StreamChunk {
            records: chunk
                .records
                .into_iter()
                .map(|r| (r.key, r.value))
                .collect(),
            resume_after: chunk.resume_after,
        })
    }

    fn import(&self, table: TableKey, records: Vec<Record>) -> ImportFuture {
        let storage = self.storage.clone();
        // The layout checks each record's clustering and gives the table's gc_grace_seconds.
        let layout = self
            .engine
            .schema()
            .tables
            .values()
            .find(|t| t.layout.id == table)
            .map(|t| t.layout.clone());
        Box::pin(async move {
            let layout = layout.ok_or("a streamed table is not in this node's schema")?;
            let records: Vec<RawRecord> = records
                .into_iter()
                .map(|(key, value)| RawRecord { key, value })
                .collect();
            let writer = storage.clone();
            // A commit of up to a chunk merges under locks and may read: off the event loop.
            let tickets =
                tokio::task::spawn_blocking(move || writer.import_records(&layout, &records))
                    .await
                    .map_err(|_| "the import task failed")?
                    .map_err(storage_message)?;
            for ticket in tickets {
                storage
                    .wait_durable(ticket)
                    .await
                    .map_err(storage_message)?;
            }
            Ok(())
        })
    }

    fn load_bytes(&self) -> u64 {
        directory_bytes(&self.data_dir, MAX_LOAD_DEPTH)
    }
}

fn storage_message(error: sluice_storage::StorageError) -> &'static str {
    match error {
        sluice_storage::StorageError::Io(m)
        | sluice_storage::StorageError::Corrupt(m)
        | sluice_storage::StorageError::TooLarge(m) => m,
        sluice_storage::StorageError::TooManyTombstones => "too many tombstones",
        sluice_storage::StorageError::Closed => "storage is closed",
    }
}

/// Bytes of the files under `dir`, `depth` levels down (unreadable entries count 0).
fn directory_bytes(dir: &Path, depth: usize) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_dir() {
            if depth > 0 {
                total += directory_bytes(&entry.path(), depth - 1);
            }
        } else {
            total += meta.len();
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_bytes_adds_up_nested_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), [0u8; 100]).unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub").join("b"), [0u8; 23]).unwrap();
        assert_eq!(directory_bytes(dir.path(), 8), 123);
        assert_eq!(directory_bytes(dir.path(), 0), 100);
        assert_eq!(directory_bytes(&dir.path().join("missing"), 8), 0);
    }
}
