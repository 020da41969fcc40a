//! The bounded table of recently applied request ids, so a retried proposal applies once.
//!
//! Every node evicts in log order, so the table is the same on every node and in snapshots.

use std::collections::{HashMap, VecDeque};

use crate::types::Answer;
use crate::RequestId;

/// Request ids applied recently, with the answer each one got, oldest evicted first.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct DedupTable {
    capacity: usize,
    /// Insertion (log) order, for eviction.
    order: VecDeque<RequestId>,
    #[serde(with = "answers")]
    answers: HashMap<RequestId, Answer>,
}

impl DedupTable {
    /// An empty table remembering at most `capacity` request ids.
    pub(crate) fn new(capacity: usize) -> DedupTable {
        DedupTable {
            capacity: capacity.max(1),
            order: VecDeque::new(),
            answers: HashMap::new(),
        }
    }

    /// The answer a request already got, if it is still remembered.
    pub(crate) fn get(&self, request: &RequestId) -> Option<&Answer> {
        self.answers.get(request)
    }

    /// Remembers `request`'s answer, forgetting the oldest one when full.
    pub(crate) fn insert(&mut self, request: RequestId, answer: Answer) {
        debug_assert!(!self.answers.contains_key(&request), "inserted twice");
        if self.order.len() >= self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.answers.remove(&oldest);
            }
        }
        self.order.push_back(request);
        self.answers.insert(request, answer);
        debug_assert_eq!(self.order.len(), self.answers.len());
        debug_assert!(self.order.len() <= self.capacity);
    }

    /// Keeps this node's capacity after restoring a table another node encoded.
    pub(crate) fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.answers.remove(&oldest);
            }
        }
    }

    /// How many request ids are remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.order.len()
    }
}

/// JSON maps need string keys, so the answers travel as a list of pairs.
mod answers {
    use std::collections::HashMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::types::Answer;
    use crate::RequestId;

    pub(super) fn serialize<S: Serializer>(
        map: &HashMap<RequestId, Answer>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let mut pairs: Vec<(&RequestId, &Answer)> = map.iter().collect();
        pairs.sort_by_key(|(request, _)| **request);
        pairs.serialize(serializer)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<HashMap<RequestId, Answer>, D::Error> {
        let pairs = Vec::<(RequestId, Answer)>::deserialize(deserializer)?;
        Ok(pairs.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(seq: u64) -> RequestId {
        RequestId { client: 9, seq }
    }

    fn answer(index: u64) -> Answer {
        Answer {
            index,
            response: vec![index as u8],
        }
    }

    #[test]
    fn forgets_the_oldest_when_full() {
        let mut table = DedupTable::new(3);
        for seq in 0..5 {
            table.insert(id(seq), answer(seq + 10));
        }
        assert_eq!(table.len(), 3);
        assert!(table.get(&id(0)).is_none());
        assert!(table.get(&id(1)).is_none());
        assert_eq!(table.get(&id(4)), Some(&answer(14)));
    }

    #[test]
    fn survives_a_round_trip_and_a_smaller_capacity() {
        let mut table = DedupTable::new(10);
        for seq in 0..6 {
            table.insert(id(seq), answer(seq));
        }
        let json = serde_json::to_vec(&table).unwrap();
        let mut back: DedupTable = serde_json::from_slice(&json).unwrap();
        assert_eq!(back.get(&id(5)), Some(&answer(5)));
        back.set_capacity(2);
        assert_eq!(back.len(), 2);
        assert!(back.get(&id(3)).is_none());
        assert_eq!(back.get(&id(4)), Some(&answer(4)));
    }
}
