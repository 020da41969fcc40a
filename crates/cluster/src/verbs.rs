//! The internode verbs of the cluster layer, all in one place so that no two share a number.
//!
//! Verbs below [`FIRST_APPLICATION_VERB`] belong to the messenger itself (pings).

use sluice_internode::FIRST_APPLICATION_VERB;

/// A message of the metadata Raft group (append, vote, snapshot, or an operation forwarded to
/// the leader), always on `ConnectionClass::Control`. The body is the serialized message
/// followed by one byte, its `sluice_meta::RpcKind`.
pub const VERB_RAFT: u16 = FIRST_APPLICATION_VERB;

/// A node asks a member of the cluster to admit it, on `ConnectionClass::Control`. The body
/// is the joining node's host id, addresses, dc, rack and token count; the reply its tokens,
/// or why it was refused (see `crate::node`).
pub const VERB_JOIN: u16 = FIRST_APPLICATION_VERB + 1;

/// A coordinator's mutations for this replica to apply, on `ConnectionClass::Requests`; the
/// reply is empty once they are durable (`sluice_engine::replica_msg::encode_mutations`).
pub const VERB_MUTATION: u16 = FIRST_APPLICATION_VERB + 8;

/// A coordinator asks for one partition's digest or raw entries, on
/// `ConnectionClass::Requests` (`sluice_engine::replica_msg::encode_read`).
pub const VERB_READ: u16 = FIRST_APPLICATION_VERB + 9;

/// A read repair: a raw partition for this replica to merge, on `ConnectionClass::Requests`;
/// the reply is empty once it is durable (`sluice_engine::replica_msg::encode_repair`).
pub const VERB_REPAIR: u16 = FIRST_APPLICATION_VERB + 10;

/// A TRUNCATE of one table, on `ConnectionClass::Requests`; the reply is empty once this
/// node dropped the table's rows (`sluice_engine::replica_msg::encode_truncate`).
pub const VERB_TRUNCATE: u16 = FIRST_APPLICATION_VERB + 11;
/// A SELECT, LWT, SERIAL read or transaction forwarded by a coordinator that is not a replica
/// of its partitions, for this replica to run as the coordinator, on
/// `ConnectionClass::Requests`; the reply is its rows, Void or error
/// (`sluice_engine::replica_msg::encode_forwarded_statement`).
pub const VERB_SELECT: u16 = FIRST_APPLICATION_VERB + 14;

/// One storage page of a token range of a table, for a coordinator's scan, on
/// `ConnectionClass::Requests` (`sluice_engine::replica_msg::encode_scan`).
pub const VERB_SCAN: u16 = FIRST_APPLICATION_VERB + 15;

/// A slice of one partition for a coordinator that holds no copy of it, read once this
/// replica made its copy consistent at the read's level, on `ConnectionClass::Requests`
/// (`sluice_engine::replica_msg::encode_slice`).
pub const VERB_SLICE: u16 = FIRST_APPLICATION_VERB + 16;

/// A chunk of a token range of a table, on `ConnectionClass::Bulk`: the body names the
/// table, the range and the key to resume after; the reply carries the records (see
/// `crate::streaming`).
pub const VERB_STREAM_FETCH: u16 = FIRST_APPLICATION_VERB + 20;

/// A node tells a peer to pull the ranges it gains when a node leaves the ring (its own
/// decommission, or a removal of a dead node), on `ConnectionClass::Control`; the reply is
/// what it pulled (see `crate::lifecycle`).
pub const VERB_STREAM_GAINS: u16 = FIRST_APPLICATION_VERB + 21;

/// A node's load (bytes of data on disk), on `ConnectionClass::Control`; also how
/// `nodetool status` finds a peer up.
pub const VERB_NODE_LOAD: u16 = FIRST_APPLICATION_VERB + 22;

/// An operator's command to the node it is sent to (`sluice nodetool`: status,
/// decommission, removenode), on `ConnectionClass::Control`.
pub const VERB_ADMIN: u16 = FIRST_APPLICATION_VERB + 23;

/// The reads a node admitted of keys this node is also a replica of, for the per-partition
/// read limit, one-way on `ConnectionClass::Requests`
/// (`sluice_engine::read_counts::encode_read_counts`).
pub const VERB_READ_COUNTS: u16 = FIRST_APPLICATION_VERB + 17;

/// Every verb of this crate, to check that they are distinct and not reserved.
pub const ALL: [u16; 14] = [
    VERB_RAFT,
    VERB_JOIN,
    VERB_MUTATION,
    VERB_READ,
    VERB_REPAIR,
    VERB_TRUNCATE,
    VERB_SELECT,
    VERB_SCAN,
    VERB_SLICE,
    VERB_READ_COUNTS,
    VERB_STREAM_FETCH,
    VERB_STREAM_GAINS,
    VERB_NODE_LOAD,
    VERB_ADMIN,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_are_distinct_and_outside_the_reserved_range() {
        for (i, verb) in ALL.iter().enumerate() {
            assert!(*verb >= FIRST_APPLICATION_VERB, "verb {verb} is reserved");
            assert!(!ALL[..i].contains(verb), "verb {verb} is used twice");
        }
    }
}
