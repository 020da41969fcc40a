//! The merge of several stores' ranges into one key order.

use super::io;
use crate::StorageError;

/// Several stores' entries in one ascending key order. A key lives in one store only, so
/// there are no ties to break; each store's iterator is read one entry ahead.
pub(super) struct MergedRange {
    iters: Vec<fjall::Iter>,
    heads: Vec<Option<fjall::KvPair>>,
    started: bool,
}

impl MergedRange {
    pub(super) fn new(iters: Vec<fjall::Iter>) -> MergedRange {
        let heads = iters.iter().map(|_| None).collect();
        MergedRange {
            iters,
            heads,
            started: false,
        }
    }

    fn pull(iter: &mut fjall::Iter) -> Result<Option<fjall::KvPair>, StorageError> {
        iter.next().map(|g| g.into_inner().map_err(io)).transpose()
    }

    fn advance(&mut self) -> Result<Option<fjall::KvPair>, StorageError> {
        if !self.started {
            self.started = true;
            for (head, iter) in self.heads.iter_mut().zip(&mut self.iters) {
                *head = Self::pull(iter)?;
            }
        }
        let next = self
            .heads
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.as_ref().map(|(k, _)| (i, k)))
            .min_by(|a, b| a.1.cmp(b.1))
            .map(|(i, _)| i);
        let Some(i) = next else {
            return Ok(None);
        };
        let item = self.heads[i].take();
        self.heads[i] = Self::pull(&mut self.iters[i])?;
        Ok(item)
    }
}

impl Iterator for MergedRange {
    type Item = Result<fjall::KvPair, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.advance().transpose()
    }
}
