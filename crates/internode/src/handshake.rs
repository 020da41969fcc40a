//! The handshake that opens every internode connection.
//!
//! The connecting side sends, once:
//!
//! | size | field                                                        |
//! |-----:|--------------------------------------------------------------|
//! | 2    | magic `0x534E`                                               |
//! | 1    | version (1)                                                  |
//! | 1    | connection class                                             |
//! | 16   | host id of the connecting node                               |
//! | 1    | address family of its internode address: 4 or 6             |
//! | 16   | that address's IP (IPv4 in the first 4 bytes, rest zero)     |
//! | 2    | that address's port                                          |
//! | 1    | cluster name length, 1..=[`MAX_CLUSTER_NAME`]                |
//! | n    | cluster name, UTF-8                                          |
//!
//! The accepting side answers with magic, version, an [`Answer`] byte and its own host id (20
//! bytes), and closes the connection after any answer but `Accepted`. From then on the
//! connecting side only writes frames and the accepting side only reads them; replies travel
//! on the accepting node's own connection back to the internode address given here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::{Buf, BufMut, BytesMut};

use crate::class::ConnectionClass;
use crate::frame::{MAGIC, VERSION};

/// Longest cluster name accepted.
pub const MAX_CLUSTER_NAME: usize = 128;
/// Length of the fixed part of the hello, before the cluster name.
pub const HELLO_FIXED_LEN: usize = 2 + 1 + 1 + 16 + 1 + 16 + 2 + 1;
/// Length of the answer.
pub const ANSWER_LEN: usize = 2 + 1 + 1 + 16;

/// What the connecting side says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Which class this connection carries.
    pub class: ConnectionClass,
    /// The connecting node's host id.
    pub host_id: u128,
    /// The connecting node's internode listen address, where replies go.
    pub internode_addr: SocketAddr,
    /// The cluster the connecting node belongs to.
    pub cluster_name: String,
}

/// The accepting side's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Answer {
    /// The connection is open for frames.
    Accepted = 0,
    /// The cluster names differ.
    ClusterMismatch = 1,
    /// The connecting node has the accepting node's own host id.
    SameHostId = 2,
}

impl Answer {
    /// The answer with this byte, if any.
    pub const fn from_u8(b: u8) -> Option<Answer> {
        match b {
            0 => Some(Answer::Accepted),
            1 => Some(Answer::ClusterMismatch),
            2 => Some(Answer::SameHostId),
            _ => None,
        }
    }

    /// A static description for logs.
    pub const fn message(self) -> &'static str {
        match self {
            Answer::Accepted => "accepted",
            Answer::ClusterMismatch => "cluster name mismatch",
            Answer::SameHostId => "peer has this node's host id",
        }
    }
}

/// Why a handshake is unacceptable; the connection closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeError {
    /// Wrong magic.
    BadMagic,
    /// Unsupported version.
    UnsupportedVersion,
    /// Unknown connection class.
    BadClass,
    /// Unknown address family.
    BadAddress,
    /// Cluster name empty, too long or not UTF-8.
    BadClusterName,
    /// Unknown answer byte.
    BadAnswer,
}

impl HandshakeError {
    /// A static description for logs.
    pub const fn message(self) -> &'static str {
        match self {
            HandshakeError::BadMagic => "bad handshake magic",
            HandshakeError::UnsupportedVersion => "unsupported handshake version",
            HandshakeError::BadClass => "unknown connection class",
            HandshakeError::BadAddress => "bad internode address",
            HandshakeError::BadClusterName => "bad cluster name",
            HandshakeError::BadAnswer => "unknown handshake answer",
        }
    }
}

impl Hello {
    /// Appends the encoded hello. The cluster name must be 1..=[`MAX_CLUSTER_NAME`] bytes.
    pub fn encode(&self, buf: &mut BytesMut) {
        debug_assert!(!self.cluster_name.is_empty() && self.cluster_name.len() <= MAX_CLUSTER_NAME);
        buf.put_u16(MAGIC);
        buf.put_u8(VERSION);
        buf.put_u8(self.class as u8);
        buf.put_u128(self.host_id);
        let mut ip = [0u8; 16];
        match self.internode_addr.ip() {
            IpAddr::V4(v4) => {
                buf.put_u8(4);
                ip[..4].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                buf.put_u8(6);
                ip = v6.octets();
            }
        }
        buf.put_slice(&ip);
        buf.put_u16(self.internode_addr.port());
        buf.put_u8(self.cluster_name.len() as u8);
        buf.put_slice(self.cluster_name.as_bytes());
    }

    /// Validates the fixed part and returns the cluster name's length still to read.
    pub fn parse_fixed(fixed: &[u8; HELLO_FIXED_LEN]) -> Result<usize, HandshakeError> {
        let mut b = &fixed[..];
        if b.get_u16() != MAGIC {
            return Err(HandshakeError::BadMagic);
        }
        if b.get_u8() != VERSION {
            return Err(HandshakeError::UnsupportedVersion);
        }
        let name_len = fixed[HELLO_FIXED_LEN - 1] as usize;
        if name_len == 0 || name_len > MAX_CLUSTER_NAME {
            return Err(HandshakeError::BadClusterName);
        }
        Ok(name_len)
    }

    /// Decodes a hello from its fixed part and its cluster name bytes.
    pub fn decode(fixed: &[u8; HELLO_FIXED_LEN], name: &[u8]) -> Result<Hello, HandshakeError> {
        let name_len = Hello::parse_fixed(fixed)?;
        if name.len() != name_len {
            return Err(HandshakeError::BadClusterName);
        }
        let mut b = &fixed[3..];
        let class = ConnectionClass::from_u8(b.get_u8()).ok_or(HandshakeError::BadClass)?;
        let host_id = b.get_u128();
        let family = b.get_u8();
        let mut ip = [0u8; 16];
        b.copy_to_slice(&mut ip);
        let port = b.get_u16();
        let ip = match family {
            4 => {
                if ip[4..].iter().any(|&x| x != 0) {
                    return Err(HandshakeError::BadAddress);
                }
                IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]))
            }
            6 => IpAddr::V6(Ipv6Addr::from(ip)),
            _ => return Err(HandshakeError::BadAddress),
        };
        let cluster_name = std::str::from_utf8(name)
            .map_err(|_| HandshakeError::BadClusterName)?
            .to_owned();
        Ok(Hello {
            class,
            host_id,
            internode_addr: SocketAddr::new(ip, port),
            cluster_name,
        })
    }
}

/// Encodes the accepting side's answer.
pub fn encode_answer(answer: Answer, host_id: u128) -> [u8; ANSWER_LEN] {
    let mut out = [0u8; ANSWER_LEN];
    out[..2].copy_from_slice(&MAGIC.to_be_bytes());
    out[2] = VERSION;
    out[3] = answer as u8;
    out[4..].copy_from_slice(&host_id.to_be_bytes());
    out
}

/// Decodes the accepting side's answer and host id.
pub fn decode_answer(bytes: &[u8; ANSWER_LEN]) -> Result<(Answer, u128), HandshakeError> {
    let mut b = &bytes[..];
    if b.get_u16() != MAGIC {
        return Err(HandshakeError::BadMagic);
    }
    if b.get_u8() != VERSION {
        return Err(HandshakeError::UnsupportedVersion);
    }
    let answer = Answer::from_u8(b.get_u8()).ok_or(HandshakeError::BadAnswer)?;
    Ok((answer, b.get_u128()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split(buf: &[u8]) -> (&[u8; HELLO_FIXED_LEN], &[u8]) {
        let (fixed, name) = buf.split_at(HELLO_FIXED_LEN);
        (fixed.try_into().unwrap(), name)
    }

    #[test]
    fn hello_round_trips_for_both_families() {
        for addr in ["127.0.0.2:7000", "[::1]:7001"] {
            let hello = Hello {
                class: ConnectionClass::Bulk,
                host_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
                internode_addr: addr.parse().unwrap(),
                cluster_name: "Test Cluster".into(),
            };
            let mut buf = BytesMut::new();
            hello.encode(&mut buf);
            let (fixed, name) = split(&buf);
            assert_eq!(Hello::decode(fixed, name), Ok(hello));
        }
    }

    #[test]
    fn answer_round_trips() {
        let bytes = encode_answer(Answer::ClusterMismatch, 99);
        assert_eq!(decode_answer(&bytes), Ok((Answer::ClusterMismatch, 99)));
    }

    proptest! {
        #[test]
        fn arbitrary_hellos_never_panic(bytes in proptest::collection::vec(any::<u8>(), HELLO_FIXED_LEN..HELLO_FIXED_LEN + 200)) {
            let (fixed, name) = split(&bytes);
            if let Ok(hello) = Hello::decode(fixed, name) {
                prop_assert!(hello.cluster_name.len() <= MAX_CLUSTER_NAME);
            }
            let answer: [u8; ANSWER_LEN] = bytes[..ANSWER_LEN].try_into().unwrap();
            let _ = decode_answer(&answer);
        }
    }
}
