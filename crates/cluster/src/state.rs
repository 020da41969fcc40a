//! The metadata group's whole state machine: the topology and the schema share the one log.
//!
//! A command's first byte says whose it is: [`TOPOLOGY_VERSION_BYTE`] for the topology (its
//! encoding from before the schema joined the group, so existing logs replay unchanged) and
//! [`SCHEMA_TAG`] for the schema, [`TXN_TAG`] for the transaction log. A snapshot carries the
//! three parts behind [`SNAPSHOT_TAG_WITH_TXN`]; the two-part snapshots ([`SNAPSHOT_TAG`]) and
//! topology-only ones written before are still restored, with the missing parts empty.

use sluice_meta::{Apply, MetaError};

use crate::schema::{SchemaState, SCHEMA_TAG};
use crate::topology::{Topology, TopologyError, TopologyResponse, TOPOLOGY_VERSION_BYTE};
use crate::txn_log::{TxnSnapshot, TxnState, DEFAULT_WRITE_TABLE_BYTES, TXN_TAG};

/// The first byte of a snapshot of both parts: then the topology part's length (4 bytes,
/// big-endian), the topology part, and the schema part.
pub const SNAPSHOT_TAG: u8 = 0xC5;

/// The first byte of a snapshot of the three parts: the topology part's length (4 bytes,
/// big-endian) and the part, the schema part's length and the part, then the transaction part.
pub const SNAPSHOT_TAG_WITH_TXN: u8 = 0xC6;

/// The topology and the schema, as one `Apply` state machine.
#[derive(Default)]
pub struct ClusterState {
    topology: Topology,
    schema: SchemaState,
    txn: TxnState,
}

impl ClusterState {
    /// An empty state around `topology` (whose watch the caller may already hold).
    pub fn new(topology: Topology) -> ClusterState {
        ClusterState {
            topology,
            schema: SchemaState::new(),
            txn: TxnState::default(),
        }
    }

    /// The transaction part.
    pub fn txn(&self) -> &TxnState {
        &self.txn
    }

    /// The topology part.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The schema part.
    pub fn schema(&self) -> &SchemaState {
        &self.schema
    }
}

impl Apply for ClusterState {
    fn apply(&mut self, index: u64, command: &[u8]) -> Vec<u8> {
        self.txn.note_applied();
        match command.first() {
            Some(&SCHEMA_TAG) => self.schema.apply(command).encode(),
            Some(&TXN_TAG) => self.txn.apply(index, command).encode(),
            Some(&TOPOLOGY_VERSION_BYTE) => self.topology.apply(index, command),
            // The topology answered unknown first bytes so before the schema shared the log.
            _ => TopologyResponse::Rejected(if command.is_empty() {
                TopologyError::Malformed
            } else {
                TopologyError::UnsupportedVersion
            })
            .encode(),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let topology = self.topology.snapshot();
        let schema = self.schema.snapshot();
        let txn = self.txn.snapshot();
        let mut out = Vec::with_capacity(9 + topology.len() + schema.len() + txn.len());
        out.push(SNAPSHOT_TAG_WITH_TXN);
        // A topology snapshot is far below 4 GiB (at most a few thousand nodes), and so is the
        // schema (at most 65,536 documents of at most one command each).
        out.extend_from_slice(&(topology.len() as u32).to_be_bytes());
        out.extend_from_slice(&topology);
        out.extend_from_slice(&(schema.len() as u32).to_be_bytes());
        out.extend_from_slice(&schema);
        out.extend_from_slice(&txn);
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), MetaError> {
        match snapshot.split_first() {
            Some((&TOPOLOGY_VERSION_BYTE, _)) => {
                self.topology.restore(snapshot)?;
                self.schema.install(0, Default::default());
                self.txn
                    .install(TxnSnapshot::empty(DEFAULT_WRITE_TABLE_BYTES));
                Ok(())
            }
            Some((&SNAPSHOT_TAG, rest)) => {
                let (length, rest) = rest.split_first_chunk::<4>().ok_or(MetaError::Malformed)?;
                let length = u32::from_be_bytes(*length) as usize;
                if length > rest.len() {
                    return Err(MetaError::Malformed);
                }
                let (topology, schema) = rest.split_at(length);
                // Both parts decode before either changes.
                let (epoch, documents) = SchemaState::decode_snapshot(schema)?;
                self.topology.restore(topology)?;
                self.schema.install(epoch, documents);
                self.txn
                    .install(TxnSnapshot::empty(DEFAULT_WRITE_TABLE_BYTES));
                Ok(())
            }
            Some((&SNAPSHOT_TAG_WITH_TXN, rest)) => {
                let (topology, rest) = split_part(rest)?;
                let (schema, txn) = split_part(rest)?;
                // Every part decodes before any changes.
                let (epoch, documents) = SchemaState::decode_snapshot(schema)?;
                let txn = TxnState::decode_snapshot(txn)?;
                self.topology.restore(topology)?;
                self.schema.install(epoch, documents);
                self.txn.install(txn);
                Ok(())
            }
            _ => Err(MetaError::Malformed),
        }
    }
}

/// Splits a part behind its 4-byte big-endian length from what follows it.
fn split_part(bytes: &[u8]) -> Result<(&[u8], &[u8]), MetaError> {
    let (length, rest) = bytes.split_first_chunk::<4>().ok_or(MetaError::Malformed)?;
    let length = u32::from_be_bytes(*length) as usize;
    if length > rest.len() {
        return Err(MetaError::Malformed);
    }
    Ok(rest.split_at(length))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{SchemaCommand, SchemaEdit, SchemaResponse};
    use crate::topology::TopologyCommand;
    use uuid::Uuid;

    fn join(n: u8) -> Vec<u8> {
        TopologyCommand::Join {
            host_id: Uuid::from_u128(0x1000 + u128::from(n)),
            cql_addr: ([127, 0, 0, n], 9042).into(),
            internode_addr: ([127, 0, 0, n], 7000).into(),
            dc: "datacenter1".to_owned(),
            rack: "rack1".to_owned(),
            num_tokens: 4,
        }
        .encode()
    }

    fn schema_put(base: u64, key: &str) -> Vec<u8> {
        SchemaCommand {
            base,
            edits: vec![SchemaEdit::Put {
                key: key.to_owned(),
                value: "{}".to_owned(),
            }],
        }
        .encode()
    }

    #[test]
    fn commands_go_to_their_part_and_a_snapshot_restores_both() {
        let mut state = ClusterState::default();
        assert!(matches!(
            TopologyResponse::decode(&state.apply(1, &join(1))),
            Ok(TopologyResponse::Joined { .. })
        ));
        assert_eq!(
            SchemaResponse::decode(&state.apply(2, &schema_put(0, "keyspace/ks"))),
            Ok(SchemaResponse::Applied { epoch: 1 })
        );
        assert_eq!(state.topology().nodes().len(), 1);
        assert_eq!(state.schema().epoch(), 1);

        let snapshot = state.snapshot();
        let mut restored = ClusterState::default();
        restored.restore(&snapshot).unwrap();
        assert_eq!(restored.snapshot(), snapshot);
        assert_eq!(restored.topology().nodes(), state.topology().nodes());
        assert_eq!(restored.schema().documents(), state.schema().documents());
        // Both parts go on from where they were.
        let next = schema_put(1, "keyspace/other");
        assert_eq!(restored.apply(3, &next), state.apply(3, &next));
        assert_eq!(restored.apply(4, &join(2)), state.apply(4, &join(2)));
        assert_eq!(restored.snapshot(), state.snapshot());
    }

    fn transfer(read_at: u64, a: i64, b: i64) -> Vec<u8> {
        use crate::txn_log::{PartitionRef, TxnBatch, TxnProposal};
        let p = |token| PartitionRef {
            table: [1; 16],
            token,
            key_hash: token as u64,
        };
        TxnBatch {
            transactions: vec![TxnProposal {
                read_at,
                provisional: 1_000,
                reads: vec![p(a), p(b)],
                writes: vec![p(a), p(b)],
                mutations: vec![9; 4],
                keeps_timestamps: false,
            }],
        }
        .encode()
        .unwrap()
    }

    #[test]
    fn transactions_share_the_log_and_the_snapshot_with_the_other_parts() {
        use crate::txn_log::{TxnOutcome, TxnResponse};
        let mut state = ClusterState::default();
        state.apply(1, &join(1));
        state.apply(2, &schema_put(0, "keyspace/ks"));
        assert_eq!(
            TxnResponse::decode(&state.apply(3, &transfer(2, 1, 2))),
            Ok(TxnResponse::Outcomes(vec![TxnOutcome::Committed {
                timestamp: 1_000
            }]))
        );
        let snapshot = state.snapshot();
        assert_eq!(snapshot[0], SNAPSHOT_TAG_WITH_TXN);
        let mut restored = ClusterState::default();
        restored.restore(&snapshot).unwrap();
        assert_eq!(restored.snapshot(), snapshot);
        assert_eq!(restored.txn().counts(), state.txn().counts());
        // A read before the committed write conflicts on both; a later one commits on both
        // with the same timestamp.
        for (index, command) in [(4, transfer(2, 2, 3)), (5, transfer(3, 2, 3))] {
            assert_eq!(
                restored.apply(index, &command),
                state.apply(index, &command)
            );
        }
        assert_eq!(state.txn().counts().conflicts, 1);
        assert_eq!(state.txn().counts().commits, 2);
        assert_eq!(restored.snapshot(), state.snapshot());
        // A two-part snapshot from before the transaction log restores with an empty one.
        let mut old = vec![SNAPSHOT_TAG];
        let topology = state.topology().snapshot();
        old.extend_from_slice(&(topology.len() as u32).to_be_bytes());
        old.extend_from_slice(&topology);
        old.extend_from_slice(&state.schema().snapshot());
        let mut from_old = ClusterState::default();
        from_old.restore(&old).unwrap();
        assert_eq!(from_old.txn().counts(), Default::default());
        assert_eq!(from_old.schema().epoch(), 1);
    }

    #[test]
    fn a_topology_only_snapshot_restores_with_an_empty_schema() {
        let mut topology = Topology::new();
        topology.apply(1, &join(1));
        let old = topology.snapshot();
        let mut state = ClusterState::default();
        state.apply(1, &schema_put(0, "keyspace/ks"));
        state.restore(&old).unwrap();
        assert_eq!(state.topology().nodes().len(), 1);
        assert_eq!(state.schema().epoch(), 0);
        assert!(state.schema().documents().is_empty());
    }

    #[test]
    fn malformed_commands_and_snapshots_are_refused_without_a_change() {
        let mut state = ClusterState::default();
        state.apply(1, &join(1));
        state.apply(2, &schema_put(0, "keyspace/ks"));
        let before = state.snapshot();
        for bad in [&b""[..], b"\x00", b"\x07junk", b"\x02junk", b"\x01junk"] {
            let answer = state.apply(3, bad);
            let refused = matches!(
                TopologyResponse::decode(&answer),
                Ok(TopologyResponse::Rejected(_))
            ) || matches!(
                SchemaResponse::decode(&answer),
                Ok(SchemaResponse::Rejected(_))
            );
            assert!(refused, "{bad:?} answered {answer:?}");
        }
        let mut truncated = before.clone();
        truncated.truncate(7);
        let mut long_length = before.clone();
        long_length[1..5].copy_from_slice(&u32::MAX.to_be_bytes());
        for bad in [
            &b""[..],
            b"\xC5",
            b"\xC5\x00\x00",
            &truncated,
            &long_length,
            b"\x09",
        ] {
            assert_eq!(state.restore(bad), Err(MetaError::Malformed), "{bad:?}");
        }
        assert_eq!(state.snapshot(), before);
    }
}
