//! The timestamp ceiling: a persisted bound on every stored timestamp.

use super::tables::Tables;
use super::{io, Store};
use crate::keycodec::{self, KIND_HEADER};
use crate::row::{PartitionHeader, StoredRow};
use crate::StorageError;
use fjall::Keyspace;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Meta key of the persisted timestamp ceiling.
const CEILING_KEY: &[u8] = b"storage/timestamp-ceiling";

/// How far above a write's timestamp the persisted ceiling is moved, so that it is
/// rewritten about once per this many microseconds of server time, not per write.
const CEILING_HEADROOM_MICROS: i64 = 10_000_000;

/// A bound on every timestamp ever stored, kept in the meta keyspace and moved up in the
/// same journal batch as the write that passes it, so that after a restart it still bounds
/// whatever the journal recovered. It seeds every stripe's `newest` at open.
pub(super) struct TimestampCeiling {
    pub(super) value: std::sync::atomic::AtomicI64,
    /// Held across the commit of a batch that moves the ceiling: moves land in order.
    pub(super) moving: Mutex<()>,
}

impl Store {
    /// Commits `batch`; when it stores a timestamp above the persisted ceiling, the batch
    /// also moves the ceiling (atomically with the data, in order with other moves).
    pub(super) fn commit_with_ceiling(
        &self,
        mut batch: fjall::OwnedWriteBatch,
        newest_written: i64,
    ) -> Result<(), StorageError> {
        let ceiling = &self.ceiling;
        if newest_written <= ceiling.value.load(Ordering::Acquire) {
            return batch.commit().map_err(io);
        }
        let _moving = ceiling.moving.lock().unwrap_or_else(|e| e.into_inner());
        let current = ceiling.value.load(Ordering::Acquire);
        if newest_written <= current {
            return batch.commit().map_err(io);
        }
        let next = newest_written.saturating_add(CEILING_HEADROOM_MICROS);
        batch.insert(&self.meta, CEILING_KEY, next.to_be_bytes());
        batch.commit().map_err(io)?;
        ceiling.value.store(next, Ordering::Release);
        Ok(())
    }
}

/// The persisted timestamp ceiling. A database without one (written before there was one)
/// gets it from one scan of every stored entry (then persisted); an empty one starts below
/// every timestamp.
pub(super) fn load_timestamp_ceiling(
    tables: &Tables,
    meta: &Keyspace,
) -> Result<i64, StorageError> {
    if let Some(v) = meta.get(CEILING_KEY).map_err(io)? {
        let bytes: [u8; 8] = v
            .as_ref()
            .try_into()
            .map_err(|_| StorageError::Corrupt("bad timestamp ceiling"))?;
        return Ok(i64::from_be_bytes(bytes));
    }
    let mut newest = i64::MIN;
    for data in tables.read().keyspaces() {
        for guard in data.iter() {
            let (key, value) = guard.into_inner().map_err(io)?;
            let (_, _, kind, _) = keycodec::split_data_key(&key)?;
            let stored = if kind == KIND_HEADER {
                PartitionHeader::decode_value(&value)?.max_timestamp()
            } else {
                StoredRow::decode_value(&value)?.max_timestamp()
            };
            newest = newest.max(stored);
        }
    }
    if newest > i64::MIN {
        tracing::info!("timestamp ceiling computed from a scan of the stored data");
        meta.insert(CEILING_KEY, newest.to_be_bytes()).map_err(io)?;
    }
    Ok(newest)
}
