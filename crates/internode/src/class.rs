//! Connection classes: one TCP connection per (peer, class), each with its own bounded queue
//! and writer task, so that a backlog in one class never delays another.

/// The traffic a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum ConnectionClass {
    /// Raft, failure-detector pings, schema and topology: small, latency-critical.
    Control = 0,
    /// Requests from a coordinator to replicas.
    Requests = 1,
    /// Replies to requests, apart from the payloads they answer.
    Responses = 2,
    /// Streaming, hints and repair: large and throughput-bound.
    Bulk = 3,
}

/// Number of classes.
pub const CLASS_COUNT: usize = 4;

impl ConnectionClass {
    /// Every class, in wire order.
    pub const ALL: [ConnectionClass; CLASS_COUNT] = [
        ConnectionClass::Control,
        ConnectionClass::Requests,
        ConnectionClass::Responses,
        ConnectionClass::Bulk,
    ];

    /// The class with this wire byte, if any.
    pub const fn from_u8(b: u8) -> Option<ConnectionClass> {
        match b {
            0 => Some(ConnectionClass::Control),
            1 => Some(ConnectionClass::Requests),
            2 => Some(ConnectionClass::Responses),
            3 => Some(ConnectionClass::Bulk),
            _ => None,
        }
    }

    /// Index into per-class arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The class a reply to a request of this class travels on. Control replies stay on
    /// Control so that pings and Raft never wait behind data; bulk acknowledgements stay on
    /// Bulk so that streaming never fills the user Responses connection.
    pub const fn reply_class(self) -> ConnectionClass {
        match self {
            ConnectionClass::Control => ConnectionClass::Control,
            ConnectionClass::Requests | ConnectionClass::Responses => ConnectionClass::Responses,
            ConnectionClass::Bulk => ConnectionClass::Bulk,
        }
    }

    /// A short lowercase name for logs and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            ConnectionClass::Control => "control",
            ConnectionClass::Requests => "requests",
            ConnectionClass::Responses => "responses",
            ConnectionClass::Bulk => "bulk",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_round_trip_and_unknown_bytes_are_rejected() {
        for class in ConnectionClass::ALL {
            assert_eq!(ConnectionClass::from_u8(class as u8), Some(class));
            assert_eq!(ConnectionClass::ALL[class.index()], class);
        }
        assert_eq!(ConnectionClass::from_u8(4), None);
    }

    #[test]
    fn control_replies_never_share_a_data_connection() {
        assert_eq!(
            ConnectionClass::Control.reply_class(),
            ConnectionClass::Control
        );
        assert_eq!(
            ConnectionClass::Requests.reply_class(),
            ConnectionClass::Responses
        );
        assert_eq!(ConnectionClass::Bulk.reply_class(), ConnectionClass::Bulk);
    }
}
