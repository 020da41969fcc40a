//! The internode frame: a fixed 24-byte header and an opaque body.
//!
//! | offset | size | field                                                    |
//! |-------:|-----:|----------------------------------------------------------|
//! | 0      | 2    | magic `0x534E` ("SN")                                    |
//! | 2      | 1    | version (1)                                              |
//! | 3      | 1    | kind: 0 request, 1 response, 2 one-way                   |
//! | 4      | 2    | verb                                                     |
//! | 6      | 1    | status (responses; 0 on requests and one-way messages)   |
//! | 7      | 1    | reserved, 0                                              |
//! | 8      | 8    | message id (a response echoes its request's)             |
//! | 16     | 4    | remaining time budget in microseconds, when written      |
//! | 20     | 4    | body length                                              |
//!
//! All integers are big-endian. The decoder validates the whole header, including the body
//! length against the configured maximum, before it reserves room for the body; it reserves at
//! most [`READ_RESERVE_CAP`] ahead so a peer's declared length alone cannot make it allocate.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Length of the frame header.
pub const HEADER_LEN: usize = 24;
/// First two bytes of every frame.
pub const MAGIC: u16 = 0x534E;
/// The wire version this crate speaks.
pub const VERSION: u8 = 1;
/// Default cap on a frame body.
pub const DEFAULT_MAX_BODY: u32 = 16 * 1024 * 1024;
/// Most the decoder reserves ahead in the read buffer for a frame still arriving.
pub const READ_RESERVE_CAP: usize = 256 * 1024;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// A request that expects exactly one response with the same message id.
    Request = 0,
    /// The response to a request.
    Response = 1,
    /// A message that expects no response.
    OneWay = 2,
}

impl Kind {
    /// The kind with this byte, if any.
    pub const fn from_u8(b: u8) -> Option<Kind> {
        match b {
            0 => Some(Kind::Request),
            1 => Some(Kind::Response),
            2 => Some(Kind::OneWay),
            _ => None,
        }
    }
}

/// The outcome a response reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// The handler answered; the body is its reply.
    Ok = 0,
    /// The receiver's queue for this class was full: the request was not run.
    Overloaded = 1,
    /// The request's budget ran out before it was run: it was not run.
    Expired = 2,
    /// The receiver has no handler for this verb.
    UnknownVerb = 3,
    /// The handler failed or dropped the request without answering.
    Failed = 4,
}

impl Status {
    /// The status with this byte, if any.
    pub const fn from_u8(b: u8) -> Option<Status> {
        match b {
            0 => Some(Status::Ok),
            1 => Some(Status::Overloaded),
            2 => Some(Status::Expired),
            3 => Some(Status::UnknownVerb),
            4 => Some(Status::Failed),
            _ => None,
        }
    }
}

/// A parsed frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Request, response or one-way.
    pub kind: Kind,
    /// What the body means; opaque to this crate except for its reserved verbs.
    pub verb: u16,
    /// Outcome of a response; [`Status::Ok`] on requests and one-way messages.
    pub status: Status,
    /// Message id, chosen by the requester and echoed by the response.
    pub id: u64,
    /// Time left for this message when it was written, in microseconds.
    pub budget_micros: u32,
    /// Body length in bytes.
    pub length: u32,
}

/// Why a header is unacceptable. Every variant closes the connection: after a bad header
/// the byte stream cannot be trusted to be in step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The first two bytes are not [`MAGIC`].
    BadMagic,
    /// The version is not [`VERSION`].
    UnsupportedVersion,
    /// The kind byte is unknown.
    BadKind,
    /// The status byte is unknown, or set on a non-response.
    BadStatus,
    /// The reserved byte is not zero.
    ReservedSet,
    /// The body length exceeds the maximum.
    TooLarge,
}

impl FrameError {
    /// A static description.
    pub const fn message(self) -> &'static str {
        match self {
            FrameError::BadMagic => "bad magic",
            FrameError::UnsupportedVersion => "unsupported internode version",
            FrameError::BadKind => "unknown frame kind",
            FrameError::BadStatus => "bad response status",
            FrameError::ReservedSet => "reserved header byte is not zero",
            FrameError::TooLarge => "frame body exceeds the maximum frame size",
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl FrameHeader {
    /// Parses and validates a header; `max_body` bounds the body length.
    pub fn parse(bytes: &[u8; HEADER_LEN], max_body: u32) -> Result<FrameHeader, FrameError> {
        let mut b = &bytes[..];
        if b.get_u16() != MAGIC {
            return Err(FrameError::BadMagic);
        }
        if b.get_u8() != VERSION {
            return Err(FrameError::UnsupportedVersion);
        }
        let kind = Kind::from_u8(b.get_u8()).ok_or(FrameError::BadKind)?;
        let verb = b.get_u16();
        let status = Status::from_u8(b.get_u8()).ok_or(FrameError::BadStatus)?;
        if kind != Kind::Response && status != Status::Ok {
            return Err(FrameError::BadStatus);
        }
        if b.get_u8() != 0 {
            return Err(FrameError::ReservedSet);
        }
        let id = b.get_u64();
        let budget_micros = b.get_u32();
        let length = b.get_u32();
        if length > max_body {
            return Err(FrameError::TooLarge);
        }
        Ok(FrameHeader {
            kind,
            verb,
            status,
            id,
            budget_micros,
            length,
        })
    }

    /// Appends the encoded header to `buf`.
    pub fn write(&self, buf: &mut BytesMut) {
        buf.reserve(HEADER_LEN);
        buf.put_u16(MAGIC);
        buf.put_u8(VERSION);
        buf.put_u8(self.kind as u8);
        buf.put_u16(self.verb);
        buf.put_u8(self.status as u8);
        buf.put_u8(0);
        buf.put_u64(self.id);
        buf.put_u32(self.budget_micros);
        buf.put_u32(self.length);
    }
}

/// A whole frame: header and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The validated header.
    pub header: FrameHeader,
    /// The body, `header.length` bytes, split off the read buffer without copying.
    pub body: Bytes,
}

/// Appends a whole frame to `buf`. The body must fit the header's `u32` length.
pub fn encode_frame(header: FrameHeader, body: &[u8], buf: &mut BytesMut) {
    debug_assert_eq!(header.length as usize, body.len());
    header.write(buf);
    buf.extend_from_slice(body);
}

/// Splits frames off a read buffer.
#[derive(Debug, Clone, Copy)]
pub struct FrameDecoder {
    max_body: u32,
}

impl FrameDecoder {
    /// A decoder that rejects bodies longer than `max_body`.
    pub const fn new(max_body: u32) -> FrameDecoder {
        FrameDecoder { max_body }
    }

    /// The next whole frame in `buf`, `Ok(None)` if more bytes are needed (then `buf` has room
    /// reserved for part of the rest, at most [`READ_RESERVE_CAP`]), or the header's error.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = FrameHeader::parse(head, self.max_body)?;
        let total = HEADER_LEN + header.length as usize;
        if buf.len() < total {
            buf.reserve((total - buf.len()).min(READ_RESERVE_CAP));
            return Ok(None);
        }
        buf.advance(HEADER_LEN);
        let body = buf.split_to(header.length as usize).freeze();
        Ok(Some(Frame { header, body }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(kind: Kind, status: Status, length: u32) -> FrameHeader {
        FrameHeader {
            kind,
            verb: 42,
            status,
            id: 7,
            budget_micros: 1_000,
            length,
        }
    }

    #[test]
    fn a_partial_frame_waits_for_more_bytes() {
        let mut buf = BytesMut::new();
        encode_frame(header(Kind::Request, Status::Ok, 3), b"abc", &mut buf);
        let whole = buf.clone();
        let decoder = FrameDecoder::new(DEFAULT_MAX_BODY);
        for cut in 0..whole.len() {
            let mut part = BytesMut::from(&whole[..cut]);
            assert_eq!(decoder.decode(&mut part), Ok(None), "cut at {cut}");
        }
        let frame = decoder.decode(&mut buf).unwrap().unwrap();
        assert_eq!(&frame.body[..], b"abc");
        assert!(buf.is_empty());
    }

    #[test]
    fn a_status_on_a_request_is_rejected() {
        let mut buf = BytesMut::new();
        header(Kind::Request, Status::Ok, 0).write(&mut buf);
        buf[6] = Status::Overloaded as u8;
        let decoder = FrameDecoder::new(DEFAULT_MAX_BODY);
        assert_eq!(decoder.decode(&mut buf), Err(FrameError::BadStatus));
    }

    #[test]
    fn each_corrupt_field_has_its_error() {
        let mut good = BytesMut::new();
        header(Kind::OneWay, Status::Ok, 0).write(&mut good);
        let decoder = FrameDecoder::new(DEFAULT_MAX_BODY);
        for (offset, value, error) in [
            (0, 0x00, FrameError::BadMagic),
            (2, 9, FrameError::UnsupportedVersion),
            (3, 3, FrameError::BadKind),
            (6, 200, FrameError::BadStatus),
            (7, 1, FrameError::ReservedSet),
        ] {
            let mut bad = good.clone();
            bad[offset] = value;
            assert_eq!(decoder.decode(&mut bad), Err(error));
        }
    }

    fn any_kind() -> impl Strategy<Value = Kind> {
        prop_oneof![
            Just(Kind::Request),
            Just(Kind::Response),
            Just(Kind::OneWay)
        ]
    }

    fn any_status() -> impl Strategy<Value = Status> {
        (0u8..5).prop_map(|b| Status::from_u8(b).unwrap())
    }

    proptest! {
        #[test]
        fn round_trip(
            kind in any_kind(),
            status in any_status(),
            verb: u16,
            id: u64,
            budget_micros: u32,
            body in proptest::collection::vec(any::<u8>(), 0..2048),
            trailing in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let status = if kind == Kind::Response { status } else { Status::Ok };
            let header = FrameHeader { kind, verb, status, id, budget_micros, length: body.len() as u32 };
            let mut buf = BytesMut::new();
            encode_frame(header, &body, &mut buf);
            buf.extend_from_slice(&trailing);
            let frame = FrameDecoder::new(4096).decode(&mut buf).unwrap().unwrap();
            prop_assert_eq!(frame.header, header);
            prop_assert_eq!(&frame.body[..], &body[..]);
            prop_assert_eq!(&buf[..], &trailing[..]);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let decoder = FrameDecoder::new(256);
            let mut buf = BytesMut::from(&bytes[..]);
            // Decode until the decoder errs or wants more; every outcome is acceptable but a panic.
            while let Ok(Some(frame)) = decoder.decode(&mut buf) {
                prop_assert!(frame.body.len() <= 256);
            }
            prop_assert!(buf.capacity() <= 512 + READ_RESERVE_CAP + HEADER_LEN);
        }

        #[test]
        fn a_header_claiming_more_than_the_maximum_is_rejected_before_the_body(
            max_body in 0u32..(1 << 20),
            excess in 1u32..(1 << 30),
            kind in any_kind(),
        ) {
            let claimed = max_body.saturating_add(excess);
            let mut buf = BytesMut::new();
            header(kind, Status::Ok, claimed).write(&mut buf);
            let capacity = buf.capacity();
            // Only the header is present: the error must come from it alone, with no reservation.
            prop_assert_eq!(FrameDecoder::new(max_body).decode(&mut buf), Err(FrameError::TooLarge));
            prop_assert_eq!(buf.capacity(), capacity);
            prop_assert_eq!(buf.len(), HEADER_LEN);
        }
    }
}
