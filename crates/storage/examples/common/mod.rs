//! Helpers of the storage examples: a table of one-row partitions keyed by a `u64`, written
//! to a store opened with periodic durability.

use bytes::Bytes;
use sluice_storage::{
    CellWrite, Durability, Liveness, Mutation, RowMutation, Storage, StorageConfig, TableLayout,
};
use std::path::Path;
use std::time::Duration;

/// The layout of table `id`: a partition key and no clustering.
pub fn layout(id: [u8; 16]) -> TableLayout {
    TableLayout {
        id,
        clustering: vec![],
        regular: None,
        gc_grace_seconds: sluice_storage::DEFAULT_GC_GRACE_SECONDS,
    }
}

/// The token of `key`, spread over the ring as murmur3 would spread keys.
pub fn token(key: u64) -> i64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64
}

/// A write of the one row of partition `key` in `table`: its row marker and `cells`.
pub fn one_row(table: [u8; 16], key: u64, timestamp: i64, cells: Vec<CellWrite>) -> Mutation {
    Mutation {
        table,
        token: token(key),
        partition_key: Bytes::copy_from_slice(&key.to_be_bytes()),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows: vec![RowMutation {
            clustering: vec![],
            liveness: Some(Liveness {
                timestamp,
                expiry: None,
            }),
            deletion: None,
            collection_deletions: vec![],
            cells,
        }],
    }
}

/// Opens one store in `dir` with periodic durability and a cache of `cache_bytes`.
pub fn open(dir: &Path, cache_bytes: u64) -> Storage {
    Storage::open(StorageConfig {
        path: dir.to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_secs(10),
        },
        cache_bytes,
        stores: 1,
    })
    .expect("open")
}
