//! The batchlog codec: a batch that spans stores is recorded whole with each part.

use super::commit::{Pending, Prepared};
use super::Store;
use crate::model::TableId;
use crate::row::{PartitionHeader, StoredRow};
use crate::StorageError;
use std::collections::BTreeMap;

/// Batchlog entry kinds.
const LOGGED_HEADER: u8 = 0;
const LOGGED_ROW: u8 = 1;

impl Prepared {
    /// Whether there is nothing to commit.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends the entries for a batchlog record: count, then per entry its kind, table id,
    /// key and value (key and value each with a u32 length).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) -> Result<(), StorageError> {
        let len = |n: usize| {
            u32::try_from(n).map_err(|_| StorageError::TooLarge("batch too large for the batchlog"))
        };
        out.extend_from_slice(&len(self.entries.len())?.to_be_bytes());
        let mut value = Vec::new();
        for ((table, key), pending) in &self.entries {
            value.clear();
            let (kind, bytes) = match pending {
                Pending::Header(h) => {
                    h.encode(&mut value)?;
                    (LOGGED_HEADER, value.as_slice())
                }
                Pending::Row {
                    encoded: Some(encoded),
                    ..
                } => (LOGGED_ROW, &encoded[..]),
                Pending::Row { row, .. } => {
                    row.encode(&mut value)?;
                    (LOGGED_ROW, value.as_slice())
                }
            };
            out.push(kind);
            out.extend_from_slice(table);
            out.extend_from_slice(&len(key.len())?.to_be_bytes());
            out.extend_from_slice(key);
            out.extend_from_slice(&len(bytes.len())?.to_be_bytes());
            out.extend_from_slice(bytes);
        }
        Ok(())
    }

    /// Decodes what `encode` wrote from the front of `input`, advancing it. Replayed rows
    /// always merge with what is stored (a replay may follow a newer write).
    pub(crate) fn decode(input: &mut &[u8]) -> Result<Prepared, StorageError> {
        const BAD: StorageError = StorageError::Corrupt("bad batchlog record");
        fn take<'a>(input: &mut &'a [u8], n: usize) -> Result<&'a [u8], StorageError> {
            if input.len() < n {
                return Err(BAD);
            }
            let (head, rest) = input.split_at(n);
            *input = rest;
            Ok(head)
        }
        let count = take_batchlog_len(input)?;
        let mut entries = BTreeMap::new();
        let mut stripes = Vec::new();
        let mut tables: Vec<TableId> = Vec::new();
        for _ in 0..count {
            let kind = take(input, 1)?[0];
            let table: TableId = take(input, 16)?.try_into().map_err(|_| BAD)?;
            let key_len = take_batchlog_len(input)?;
            let key = take(input, key_len)?.to_vec();
            let value_len = take_batchlog_len(input)?;
            let value = take(input, value_len)?;
            let stripe = Store::stripe_of_key(&table, &key)?;
            if !tables.contains(&table) {
                tables.push(table);
            }
            stripes.push(stripe);
            let pending = match kind {
                LOGGED_HEADER => Pending::Header(PartitionHeader::decode_value(value)?),
                LOGGED_ROW => Pending::Row {
                    row: StoredRow::decode_value(value)?,
                    replaces_from: None,
                    stripe,
                    encoded: None,
                    merged: None,
                },
                _ => return Err(BAD),
            };
            entries.insert((table, key), pending);
        }
        stripes.sort_unstable();
        stripes.dedup();
        tables.sort_unstable();
        Ok(Prepared {
            entries,
            stripes,
            tables,
            gc_grace: Vec::new(),
        })
    }
}

/// Reads a batchlog length (u32, big-endian) from the front of `input`, advancing it.
pub(crate) fn take_batchlog_len(input: &mut &[u8]) -> Result<usize, StorageError> {
    let (head, rest) = input
        .split_first_chunk::<4>()
        .ok_or(StorageError::Corrupt("bad batchlog record"))?;
    *input = rest;
    Ok(u32::from_be_bytes(*head) as usize)
}
