//! v4 frame envelopes: the 9-byte header, opcodes, flags, and a zero-copy frame decoder.
//!
//! The decoder exposes the header before the body is complete so that admission control can
//! decide from the header alone, then splits whole frames off the read buffer without copying.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::ErrorCode;

/// Length of a v4 frame header.
pub const HEADER_LEN: usize = 9;
/// The protocol version Sluice speaks.
pub const PROTOCOL_VERSION: u8 = 0x04;
/// Version byte of a v4 request (direction bit clear).
pub const REQUEST_VERSION: u8 = 0x04;
/// Version byte of a v4 response (direction bit set).
pub const RESPONSE_VERSION: u8 = 0x84;
/// Direction bit of the version byte: set on responses.
pub const DIRECTION_RESPONSE: u8 = 0x80;

/// Flag 0x01: the body is compressed with the negotiated algorithm.
pub const FLAG_COMPRESSION: u8 = 0x01;
/// Flag 0x02: tracing requested (request) / tracing id present (response).
pub const FLAG_TRACING: u8 = 0x02;
/// Flag 0x04: a custom payload `[bytes map]` precedes the message body.
pub const FLAG_CUSTOM_PAYLOAD: u8 = 0x04;
/// Flag 0x08: a warnings `[string list]` precedes the message body (responses only).
pub const FLAG_WARNING: u8 = 0x08;
/// Flag 0x10: the client opts into a beta protocol version.
pub const FLAG_BETA: u8 = 0x10;

/// Default cap on a frame body (Cassandra's default `native_transport_max_frame_size`).
pub const DEFAULT_MAX_FRAME_BODY: u32 = 16 * 1024 * 1024;
/// Stream id of server-pushed EVENT frames.
pub const EVENT_STREAM: i16 = -1;

/// Every v4 opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// ERROR (response).
    Error = 0x00,
    /// STARTUP (request).
    Startup = 0x01,
    /// READY (response).
    Ready = 0x02,
    /// AUTHENTICATE (response).
    Authenticate = 0x03,
    /// OPTIONS (request).
    Options = 0x05,
    /// SUPPORTED (response).
    Supported = 0x06,
    /// QUERY (request).
    Query = 0x07,
    /// RESULT (response).
    Result = 0x08,
    /// PREPARE (request).
    Prepare = 0x09,
    /// EXECUTE (request).
    Execute = 0x0A,
    /// REGISTER (request).
    Register = 0x0B,
    /// EVENT (response, stream -1).
    Event = 0x0C,
    /// BATCH (request).
    Batch = 0x0D,
    /// AUTH_CHALLENGE (response).
    AuthChallenge = 0x0E,
    /// AUTH_RESPONSE (request).
    AuthResponse = 0x0F,
    /// AUTH_SUCCESS (response).
    AuthSuccess = 0x10,
}

impl Opcode {
    /// The opcode with this byte, if it is a v4 opcode.
    pub const fn from_u8(b: u8) -> Option<Opcode> {
        Some(match b {
            0x00 => Opcode::Error,
            0x01 => Opcode::Startup,
            0x02 => Opcode::Ready,
            0x03 => Opcode::Authenticate,
            0x05 => Opcode::Options,
            0x06 => Opcode::Supported,
            0x07 => Opcode::Query,
            0x08 => Opcode::Result,
            0x09 => Opcode::Prepare,
            0x0A => Opcode::Execute,
            0x0B => Opcode::Register,
            0x0C => Opcode::Event,
            0x0D => Opcode::Batch,
            0x0E => Opcode::AuthChallenge,
            0x0F => Opcode::AuthResponse,
            0x10 => Opcode::AuthSuccess,
            _ => return None,
        })
    }

    /// True for opcodes a client may send.
    pub const fn is_request(self) -> bool {
        matches!(
            self,
            Opcode::Startup
                | Opcode::Options
                | Opcode::Query
                | Opcode::Prepare
                | Opcode::Execute
                | Opcode::Register
                | Opcode::Batch
                | Opcode::AuthResponse
        )
    }
}

/// A parsed v4 frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Version byte, including the direction bit (0x04 request, 0x84 response).
    pub version: u8,
    /// Header flags (`FLAG_*`).
    pub flags: u8,
    /// Stream id chosen by the client (responses echo it; events use -1).
    pub stream: i16,
    /// Message opcode.
    pub opcode: Opcode,
    /// Body length in bytes.
    pub length: u32,
}

/// Why a frame header is unacceptable. Every variant is fatal for the connection: the server
/// answers with [`FrameError::encode_reply`] (a ProtocolError on the offending stream) and
/// closes, because the byte stream can no longer be trusted to be in sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The version byte (direction bit masked) is not 4.
    UnsupportedVersion {
        /// The version the client sent (`& 0x7f`).
        version: u8,
        /// Stream id to answer on.
        stream: i16,
    },
    /// The direction bit says "response".
    NotARequest {
        /// Stream id to answer on.
        stream: i16,
    },
    /// Unknown opcode byte.
    UnknownOpcode {
        /// Stream id to answer on.
        stream: i16,
    },
    /// The body length is negative or above the configured cap.
    FrameTooLarge {
        /// Stream id to answer on.
        stream: i16,
    },
}

impl FrameError {
    /// The stream id the error reply goes to.
    pub const fn stream(self) -> i16 {
        match self {
            FrameError::UnsupportedVersion { stream, .. }
            | FrameError::NotARequest { stream }
            | FrameError::UnknownOpcode { stream }
            | FrameError::FrameTooLarge { stream } => stream,
        }
    }

    /// A static description.
    pub const fn message(self) -> &'static str {
        match self {
            FrameError::UnsupportedVersion { .. } => "unsupported protocol version",
            FrameError::NotARequest { .. } => "frame has the response direction bit set",
            FrameError::UnknownOpcode { .. } => "unknown opcode",
            FrameError::FrameTooLarge { .. } => "frame body exceeds the maximum frame size",
        }
    }

    /// Appends the complete ProtocolError reply frame (v4 header 0x84, same stream, never
    /// compressed) to `buf`. For a version error the message is the §1.1 wording that
    /// drivers match to step down their protocol version.
    pub fn encode_reply(self, buf: &mut BytesMut) {
        match self {
            FrameError::UnsupportedVersion { version, stream } => {
                encode_unsupported_version(buf, stream, version)
            }
            other => encode_protocol_error(buf, other.stream(), other.message()),
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for FrameError {}

/// The stream id bytes of a header, read the way the client's version lays them out
/// (v1/v2 used a single signed byte; v3+ a big-endian i16).
fn raw_stream(bytes: &[u8; HEADER_LEN]) -> i16 {
    if bytes[0] & 0x7f < 3 {
        i16::from(bytes[2] as i8)
    } else {
        i16::from_be_bytes([bytes[2], bytes[3]])
    }
}

impl FrameHeader {
    /// Parses and validates a request header. `max_body` caps the body length.
    pub fn parse(bytes: &[u8; HEADER_LEN], max_body: u32) -> Result<FrameHeader, FrameError> {
        let stream = raw_stream(bytes);
        let version = bytes[0];
        if version & 0x7f != PROTOCOL_VERSION {
            return Err(FrameError::UnsupportedVersion {
                version: version & 0x7f,
                stream,
            });
        }
        if version & DIRECTION_RESPONSE != 0 {
            return Err(FrameError::NotARequest { stream });
        }
        let opcode = Opcode::from_u8(bytes[4]).ok_or(FrameError::UnknownOpcode { stream })?;
        let length = i32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]);
        let length = u32::try_from(length).map_err(|_| FrameError::FrameTooLarge { stream })?;
        if length > max_body {
            return Err(FrameError::FrameTooLarge { stream });
        }
        Ok(FrameHeader {
            version,
            flags: bytes[1],
            stream,
            opcode,
            length,
        })
    }

    /// True when the body is compressed (flag 0x01).
    pub const fn is_compressed(&self) -> bool {
        self.flags & FLAG_COMPRESSION != 0
    }

    /// Writes this header in wire format.
    pub fn write(&self, buf: &mut BytesMut) {
        buf.put_u8(self.version);
        buf.put_u8(self.flags);
        buf.put_i16(self.stream);
        buf.put_u8(self.opcode as u8);
        buf.put_u32(self.length);
    }
}

/// A whole frame: header plus its (possibly compressed) body, sharing the read buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The header.
    pub header: FrameHeader,
    /// The body as received (decompress with [`crate::Compression::decompress_body`]).
    pub body: Bytes,
}

/// Most the decoder reserves ahead in the read buffer for a frame still arriving.
pub const READ_RESERVE_CAP: usize = 64 * 1024;

/// Pulls whole frames out of a connection's read buffer.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_body: u32,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(DEFAULT_MAX_FRAME_BODY)
    }
}

impl FrameDecoder {
    /// A decoder rejecting bodies longer than `max_body` bytes.
    pub const fn new(max_body: u32) -> FrameDecoder {
        FrameDecoder { max_body }
    }

    /// The body cap.
    pub const fn max_body(&self) -> u32 {
        self.max_body
    }

    /// The header at the front of `buf` once its 9 bytes have arrived, before the body is
    /// complete (admission decides from it). `None` until 9 bytes are buffered.
    pub fn peek_header(&self, buf: &[u8]) -> Option<Result<FrameHeader, FrameError>> {
        let raw: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        Some(FrameHeader::parse(raw, self.max_body))
    }

    /// Splits the next whole frame off the front of `buf` (no copy: `split_to` + `freeze`).
    /// `Ok(None)` means more bytes are needed; in that case `buf` has been reserved for the
    /// rest of the frame (up to [`READ_RESERVE_CAP`]) so the next read can continue it. Errors are fatal (see
    /// [`FrameError`]); `buf` is left untouched so the caller can still inspect it.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        Ok(self
            .next_header(buf)?
            .map(|header| Self::take_frame(buf, header)))
    }

    /// The header of the next frame once the whole frame is buffered, leaving `buf` as it
    /// is: the caller then takes the body with [`FrameDecoder::take_body`] or, turning the
    /// request away from its header, drops it with [`FrameDecoder::skip_body`], which costs
    /// no reference count. `Ok(None)` and errors as for [`FrameDecoder::decode`].
    pub fn next_header(&mut self, buf: &mut BytesMut) -> Result<Option<FrameHeader>, FrameError> {
        self.next_header_past(buf, &mut 0)
    }

    /// [`Self::next_header`] of the frame that starts `skipped` bytes into `buf`, past
    /// frames turned away from their headers whose bytes are still there: a run of them is
    /// dropped with one [`Self::drop_skipped`] instead of one advance each. When no whole
    /// frame follows (`Ok(None)`), the skipped bytes are dropped here.
    #[inline]
    pub fn next_header_past(
        &mut self,
        buf: &mut BytesMut,
        skipped: &mut usize,
    ) -> Result<Option<FrameHeader>, FrameError> {
        debug_assert!(*skipped <= buf.len(), "only buffered frames are skipped");
        let rest = buf.get(*skipped..).unwrap_or_default();
        let header = match self.peek_header(rest) {
            None => {
                Self::drop_skipped(buf, skipped);
                return Ok(None);
            }
            Some(h) => h?,
        };
        let total = HEADER_LEN + header.length as usize;
        if rest.len() < total {
            Self::drop_skipped(buf, skipped);
            // Reserve for the rest of the frame, but never more than READ_RESERVE_CAP at a
            // time: a header alone must not pin max-frame-size memory per connection.
            buf.reserve((total - buf.len()).min(READ_RESERVE_CAP));
            return Ok(None);
        }
        Ok(Some(header))
    }

    /// Drops the `skipped` bytes of frames turned away (see [`Self::next_header_past`]).
    #[inline]
    pub fn drop_skipped(buf: &mut BytesMut, skipped: &mut usize) {
        if *skipped > 0 {
            buf.advance((*skipped).min(buf.len()));
            *skipped = 0;
        }
    }

    /// Splits off the frame whose `header` [`FrameDecoder::next_header`] just returned.
    pub fn take_frame(buf: &mut BytesMut, header: FrameHeader) -> Frame {
        let body = Self::take_body(buf, &header);
        Frame { header, body }
    }

    /// Splits off the frame whose `header` [`FrameDecoder::next_header`] just returned and
    /// returns its body, sharing `buf`'s memory.
    pub fn take_body(buf: &mut BytesMut, header: &FrameHeader) -> Bytes {
        let mut frame = buf.split_to(HEADER_LEN + header.length as usize);
        // Advancing past the header costs no second reference count, unlike split_off.
        frame.advance(HEADER_LEN);
        frame.freeze()
    }

    /// Drops the frame whose `header` [`FrameDecoder::next_header`] just returned.
    pub fn skip_body(buf: &mut BytesMut, header: &FrameHeader) {
        buf.advance(HEADER_LEN + header.length as usize);
    }
}

/// Starts a response frame at the end of `buf`: writes a header with a zero length and
/// returns its offset, for [`finish_frame`] to patch.
pub(crate) fn begin_frame(buf: &mut BytesMut, stream: i16, opcode: Opcode) -> usize {
    let start = buf.len();
    buf.reserve(HEADER_LEN + 64);
    let [s0, s1] = stream.to_be_bytes();
    buf.put_slice(&[RESPONSE_VERSION, 0, s0, s1, opcode as u8, 0, 0, 0, 0]);
    start
}

/// Patches the body length of the frame started at `start`.
pub(crate) fn finish_frame(buf: &mut BytesMut, start: usize) {
    let body_len = buf.len() - start - HEADER_LEN;
    let len = u32::try_from(body_len).unwrap_or(u32::MAX).to_be_bytes();
    buf[start + 5..start + HEADER_LEN].copy_from_slice(&len);
}

/// Appends an uncompressed ERROR frame with code ProtocolError and `message`.
pub fn encode_protocol_error(buf: &mut BytesMut, stream: i16, message: &str) {
    let start = begin_frame(buf, stream, Opcode::Error);
    buf.put_u32(ErrorCode::ProtocolError as u32);
    crate::wire::put_string(buf, message);
    finish_frame(buf, start);
}

/// Appends the §1.1 reply to a frame of an unsupported version:
/// `Invalid or unsupported protocol version (N); supported versions are (4/v4)`, as a v4
/// ProtocolError on the same stream. Built without allocation or formatting.
pub fn encode_unsupported_version(buf: &mut BytesMut, stream: i16, version: u8) {
    const PREFIX: &[u8] = b"Invalid or unsupported protocol version (";
    const SUFFIX: &[u8] = b"); supported versions are (4/v4)";
    let mut digits = [0u8; 3];
    let mut n = version;
    let mut len = 0;
    loop {
        digits[2 - len] = b'0' + n % 10;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let digits = &digits[3 - len..];
    let start = begin_frame(buf, stream, Opcode::Error);
    buf.put_u32(ErrorCode::ProtocolError as u32);
    buf.put_u16((PREFIX.len() + digits.len() + SUFFIX.len()) as u16);
    buf.put_slice(PREFIX);
    buf.put_slice(digits);
    buf.put_slice(SUFFIX);
    finish_frame(buf, start);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Reader;

    fn header(version: u8, flags: u8, stream: i16, opcode: u8, len: i32) -> [u8; 9] {
        let s = stream.to_be_bytes();
        let l = len.to_be_bytes();
        [version, flags, s[0], s[1], opcode, l[0], l[1], l[2], l[3]]
    }

    #[test]
    fn skipped_frames_are_passed_over_and_dropped_once_no_whole_frame_follows() {
        let frame = |stream: i16, body: &[u8]| {
            let mut b = BytesMut::new();
            FrameHeader {
                version: PROTOCOL_VERSION,
                flags: 0,
                stream,
                opcode: Opcode::Query,
                length: body.len() as u32,
            }
            .write(&mut b);
            b.extend_from_slice(body);
            b
        };
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&frame(1, b"one"));
        buf.extend_from_slice(&frame(2, b"second"));
        buf.extend_from_slice(&frame(3, b"3"));
        let partial = frame(4, b"fourth");
        buf.extend_from_slice(&partial[..HEADER_LEN + 2]);
        let mut d = FrameDecoder::default();
        let mut skipped = 0;
        for (stream, len) in [(1, 3), (2, 6)] {
            let h = d
                .next_header_past(&mut buf, &mut skipped)
                .expect("valid")
                .expect("whole");
            assert_eq!((h.stream, h.length), (stream, len));
            skipped += HEADER_LEN + len as usize;
        }
        // A frame let in takes its body from the front once the skipped ones are dropped.
        let h = d
            .next_header_past(&mut buf, &mut skipped)
            .expect("valid")
            .expect("whole");
        assert_eq!(h.stream, 3);
        FrameDecoder::drop_skipped(&mut buf, &mut skipped);
        assert_eq!(skipped, 0);
        assert_eq!(&FrameDecoder::take_frame(&mut buf, h).body[..], b"3");
        // Skipped bytes before an incomplete frame are dropped with the `None`.
        let h = FrameHeader::parse(buf[..HEADER_LEN].try_into().expect("9 bytes"), u32::MAX);
        assert_eq!(h.expect("valid").stream, 4);
        let mut skipped = 0;
        assert_eq!(d.next_header_past(&mut buf, &mut skipped), Ok(None));
        assert_eq!(buf.len(), HEADER_LEN + 2, "the partial frame stays");
        buf.extend_from_slice(&partial[HEADER_LEN + 2..]);
        let h = d.next_header(&mut buf).expect("valid").expect("whole");
        let mut skipped = HEADER_LEN + h.length as usize;
        assert_eq!(d.next_header_past(&mut buf, &mut skipped), Ok(None));
        assert!(
            buf.is_empty() && skipped == 0,
            "a skipped last frame is dropped"
        );
    }

    #[test]
    fn parses_a_valid_request_header() {
        let h = FrameHeader::parse(&header(0x04, 0x01, 300, 0x07, 42), 1024).unwrap();
        assert_eq!(
            h,
            FrameHeader {
                version: 0x04,
                flags: 0x01,
                stream: 300,
                opcode: Opcode::Query,
                length: 42
            }
        );
        assert!(h.is_compressed());
        let mut buf = BytesMut::new();
        h.write(&mut buf);
        assert_eq!(&buf[..], &header(0x04, 0x01, 300, 0x07, 42));
    }

    #[test]
    fn rejects_bad_headers_with_the_stream_id() {
        assert_eq!(
            FrameHeader::parse(&header(0x42, 0, 7, 0x05, 0), 1024),
            Err(FrameError::UnsupportedVersion {
                version: 0x42,
                stream: 7
            })
        );
        assert_eq!(
            FrameHeader::parse(&header(0x05, 0, -3, 0x05, 0), 1024),
            Err(FrameError::UnsupportedVersion {
                version: 5,
                stream: -3
            })
        );
        assert_eq!(
            FrameHeader::parse(&header(0x84, 0, 9, 0x05, 0), 1024),
            Err(FrameError::NotARequest { stream: 9 })
        );
        assert_eq!(
            FrameHeader::parse(&header(0x04, 0, 9, 0x04, 0), 1024),
            Err(FrameError::UnknownOpcode { stream: 9 })
        );
        assert_eq!(
            FrameHeader::parse(&header(0x04, 0, 9, 0x07, 1025), 1024),
            Err(FrameError::FrameTooLarge { stream: 9 })
        );
        assert_eq!(
            FrameHeader::parse(&header(0x04, 0, 9, 0x07, -1), 1024),
            Err(FrameError::FrameTooLarge { stream: 9 })
        );
        // v2 frames carry a one-byte stream id.
        let raw = [0x02, 0, 0x05, 0x05, 0, 0, 0, 0, 0];
        assert_eq!(
            FrameHeader::parse(&raw, 1024),
            Err(FrameError::UnsupportedVersion {
                version: 2,
                stream: 5
            })
        );
    }

    #[test]
    fn unsupported_version_reply_matches_driver_expectations() {
        let mut buf = BytesMut::new();
        encode_unsupported_version(&mut buf, 12, 66);
        assert_eq!(buf[0], 0x84);
        assert_eq!(buf[1], 0);
        assert_eq!(i16::from_be_bytes([buf[2], buf[3]]), 12);
        assert_eq!(buf[4], Opcode::Error as u8);
        let len = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) as usize;
        assert_eq!(len, buf.len() - HEADER_LEN);
        let body = buf.freeze().slice(HEADER_LEN..);
        let mut r = Reader::new(&body);
        assert_eq!(r.read_int().unwrap(), 0x000A);
        let msg = r.read_string().unwrap();
        assert_eq!(
            msg,
            "Invalid or unsupported protocol version (66); supported versions are (4/v4)"
        );
        assert!(msg.contains("unsupported protocol version"));
        for (v, s) in [(0u8, "(0)"), (5, "(5)"), (127, "(127)")] {
            let mut buf = BytesMut::new();
            FrameError::UnsupportedVersion {
                version: v,
                stream: 1,
            }
            .encode_reply(&mut buf);
            let body = buf.freeze().slice(HEADER_LEN..);
            let mut r = Reader::new(&body);
            r.read_int().unwrap();
            assert!(r.read_string().unwrap().contains(s));
        }
    }

    #[test]
    fn a_skipped_frame_leaves_the_next_one_intact() {
        let mut dec = FrameDecoder::new(1024);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&header(0x04, 0, 1, 0x07, 3));
        buf.extend_from_slice(b"abc");
        buf.extend_from_slice(&header(0x04, 0, 2, 0x07, 2));
        buf.extend_from_slice(b"d");
        let h = dec.next_header(&mut buf).unwrap().unwrap();
        assert_eq!((h.stream, h.length), (1, 3));
        FrameDecoder::skip_body(&mut buf, &h);
        // The second frame is not complete yet: no header, and the buffer is kept.
        assert_eq!(dec.next_header(&mut buf).unwrap(), None);
        buf.extend_from_slice(b"e");
        let h = dec.next_header(&mut buf).unwrap().unwrap();
        assert_eq!(h.stream, 2);
        assert_eq!(&FrameDecoder::take_body(&mut buf, &h)[..], b"de");
        assert!(buf.is_empty());
    }

    #[test]
    fn decoder_splits_frames_and_waits_for_bodies() {
        let mut dec = FrameDecoder::new(1024);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&header(0x04, 0, 1, 0x05, 0));
        buf.extend_from_slice(&header(0x04, 0, 2, 0x09, 5));
        buf.extend_from_slice(b"SEL");
        let f = dec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(f.header.stream, 1);
        assert_eq!(f.header.opcode, Opcode::Options);
        assert!(f.body.is_empty());
        // Header of the second frame is visible before its body is complete.
        let h = dec.peek_header(&buf).unwrap().unwrap();
        assert_eq!((h.stream, h.opcode, h.length), (2, Opcode::Prepare, 5));
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
        assert!(buf.capacity() >= HEADER_LEN + 5);
        buf.extend_from_slice(b"ECT");
        let f = dec.decode(&mut buf).unwrap().unwrap();
        assert_eq!(&f.body[..], b"SELEC");
        assert_eq!(&buf[..], b"T");
        assert!(dec.peek_header(&buf).is_none());
        assert_eq!(dec.decode(&mut buf).unwrap(), None);
    }

    #[test]
    fn decoder_rejects_oversize_before_the_body_arrives() {
        let mut dec = FrameDecoder::new(100);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&header(0x04, 0, 3, 0x07, 101));
        assert_eq!(
            dec.decode(&mut buf),
            Err(FrameError::FrameTooLarge { stream: 3 })
        );
        // No reservation for a rejected frame.
        assert!(buf.capacity() < 101);
        let mut out = BytesMut::new();
        FrameError::FrameTooLarge { stream: 3 }.encode_reply(&mut out);
        assert_eq!(i16::from_be_bytes([out[2], out[3]]), 3);
        assert_eq!(out[0], RESPONSE_VERSION);
    }
}
