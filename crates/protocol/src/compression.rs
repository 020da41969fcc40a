//! v4 body compression: lz4 (4-byte big-endian uncompressed length + raw block) and snappy
//! (raw block). Decompression is bounded: the claimed uncompressed length is checked against
//! a cap before anything is allocated.

use bytes::{Bytes, BytesMut};

use crate::frame::{FrameHeader, FLAG_COMPRESSION, HEADER_LEN};
use crate::wire::DecodeError;

/// Responses with a body shorter than this are sent uncompressed: compressing tiny bodies
/// costs CPU and usually makes them larger.
pub const COMPRESSION_THRESHOLD: usize = 512;

/// lz4 cannot expand data by more than ~255x; a larger claim is a lie, rejected before the
/// output buffer is allocated.
const LZ4_MAX_RATIO: usize = 255;

/// Snappy's densest element is a 3-byte copy of 64 bytes (~21x); a larger claim is a lie.
const SNAPPY_MAX_RATIO: usize = 32;

/// The body compression negotiated in STARTUP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// No compression.
    #[default]
    None,
    /// lz4 with a 4-byte big-endian uncompressed-length prefix.
    Lz4,
    /// Raw snappy block.
    Snappy,
}

impl Compression {
    /// The algorithm named by STARTUP's `COMPRESSION` value (case-insensitive).
    pub fn from_startup_value(value: &str) -> Result<Compression, DecodeError> {
        if value.eq_ignore_ascii_case("lz4") {
            Ok(Compression::Lz4)
        } else if value.eq_ignore_ascii_case("snappy") {
            Ok(Compression::Snappy)
        } else {
            Err(DecodeError("unsupported compression algorithm"))
        }
    }

    /// The algorithm chosen by a STARTUP option map (no `COMPRESSION` key: none).
    pub fn from_startup_options<K: AsRef<str>, V: AsRef<str>>(
        options: &[(K, V)],
    ) -> Result<Compression, DecodeError> {
        match options
            .iter()
            .find(|(k, _)| k.as_ref().eq_ignore_ascii_case("COMPRESSION"))
        {
            Some((_, v)) => Compression::from_startup_value(v.as_ref()),
            None => Ok(Compression::None),
        }
    }

    /// The STARTUP/SUPPORTED name, `None` for no compression.
    pub const fn name(self) -> Option<&'static str> {
        match self {
            Compression::None => None,
            Compression::Lz4 => Some("lz4"),
            Compression::Snappy => Some("snappy"),
        }
    }

    /// The names to advertise in SUPPORTED's `COMPRESSION` key.
    pub const SUPPORTED_NAMES: [&'static str; 2] = ["lz4", "snappy"];

    /// Decompresses `input`, refusing any output longer than `max_len` before allocating it.
    pub fn decompress(self, input: &[u8], max_len: usize) -> Result<Vec<u8>, DecodeError> {
        match self {
            Compression::None => Err(DecodeError(
                "compressed frame but no compression negotiated",
            )),
            Compression::Lz4 => {
                let (prefix, block) = input
                    .split_first_chunk::<4>()
                    .ok_or(DecodeError("lz4 body shorter than its length prefix"))?;
                let len = u32::from_be_bytes(*prefix) as usize;
                if len > max_len {
                    return Err(DecodeError(
                        "decompressed body exceeds the maximum frame size",
                    ));
                }
                if len > block.len().saturating_mul(LZ4_MAX_RATIO).saturating_add(16) {
                    return Err(DecodeError("lz4 uncompressed length is implausible"));
                }
                let mut out = vec![0u8; len];
                let n = lz4_flex::block::decompress_into(block, &mut out)
                    .map_err(|_| DecodeError("corrupt lz4 body"))?;
                if n != len {
                    return Err(DecodeError("lz4 body shorter than its declared length"));
                }
                Ok(out)
            }
            Compression::Snappy => {
                let len = snap::raw::decompress_len(input)
                    .map_err(|_| DecodeError("corrupt snappy body"))?;
                if len > max_len {
                    return Err(DecodeError(
                        "decompressed body exceeds the maximum frame size",
                    ));
                }
                if len > input.len().saturating_mul(SNAPPY_MAX_RATIO) {
                    return Err(DecodeError("snappy uncompressed length is implausible"));
                }
                let mut out = vec![0u8; len];
                let n = snap::raw::Decoder::new()
                    .decompress(input, &mut out)
                    .map_err(|_| DecodeError("corrupt snappy body"))?;
                out.truncate(n);
                Ok(out)
            }
        }
    }

    /// The plain body of a received frame: the body itself when flag 0x01 is clear, else its
    /// decompression with the negotiated algorithm (bounded by `max_len`).
    pub fn decompress_body(
        self,
        header: &FrameHeader,
        body: Bytes,
        max_len: usize,
    ) -> Result<Bytes, DecodeError> {
        if header.flags & FLAG_COMPRESSION == 0 {
            return Ok(body);
        }
        self.decompress(&body, max_len).map(Bytes::from)
    }

    /// Compresses `input`, appending the compressed form to `out`.
    pub fn compress_into(self, input: &[u8], out: &mut BytesMut) {
        match self {
            Compression::None => out.extend_from_slice(input),
            Compression::Lz4 => {
                let start = out.len();
                let max = lz4_flex::block::get_maximum_output_size(input.len());
                out.resize(start + 4 + max, 0);
                out[start..start + 4]
                    .copy_from_slice(&u32::try_from(input.len()).unwrap_or(u32::MAX).to_be_bytes());
                // Cannot fail: the output was sized to the worst case.
                let n = lz4_flex::block::compress_into(input, &mut out[start + 4..])
                    .unwrap_or_default();
                out.truncate(start + 4 + n);
            }
            Compression::Snappy => {
                let start = out.len();
                let max = snap::raw::max_compress_len(input.len());
                out.resize(start + max, 0);
                // Cannot fail: the output was sized to the worst case.
                let n = snap::raw::Encoder::new()
                    .compress(input, &mut out[start..])
                    .unwrap_or_default();
                out.truncate(start + n);
            }
        }
    }

    /// Compresses in place the body of the frame that starts at `start` in `buf` (a complete
    /// frame with its length already patched), when compression is on and the body is at
    /// least [`COMPRESSION_THRESHOLD`] bytes and actually shrinks. Sets flag 0x01 and the new
    /// length. Works inside `buf`'s own storage: no temporary allocation.
    pub fn compress_frame_in_place(self, buf: &mut BytesMut, start: usize) {
        if self == Compression::None {
            return;
        }
        let body_start = start + HEADER_LEN;
        let end = buf.len();
        let body_len = end - body_start;
        if body_len < COMPRESSION_THRESHOLD {
            return;
        }
        let max = match self {
            Compression::Lz4 => 4 + lz4_flex::block::get_maximum_output_size(body_len),
            _ => snap::raw::max_compress_len(body_len),
        };
        buf.resize(end + max, 0);
        let (plain, spare) = buf.split_at_mut(end);
        let plain = &plain[body_start..];
        let n = match self {
            Compression::Lz4 => {
                spare[..4].copy_from_slice(&(body_len as u32).to_be_bytes());
                lz4_flex::block::compress_into(plain, &mut spare[4..])
                    .ok()
                    .map(|n| n + 4)
            }
            _ => snap::raw::Encoder::new().compress(plain, spare).ok(),
        };
        match n {
            Some(n) if n < body_len => {
                buf.copy_within(end..end + n, body_start);
                buf.truncate(body_start + n);
                buf[start + 1] |= FLAG_COMPRESSION;
                buf[start + 5..body_start].copy_from_slice(&(n as u32).to_be_bytes());
            }
            _ => buf.truncate(end),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{begin_frame, finish_frame, Opcode};

    fn sample(len: usize) -> Vec<u8> {
        (0..len).map(|i| b"sluice cql "[i % 11]).collect()
    }

    #[test]
    fn startup_values() {
        assert_eq!(Compression::from_startup_value("lz4"), Ok(Compression::Lz4));
        assert_eq!(
            Compression::from_startup_value("Snappy"),
            Ok(Compression::Snappy)
        );
        assert!(Compression::from_startup_value("zstd").is_err());
        let opts = [("CQL_VERSION", "3.0.0"), ("COMPRESSION", "snappy")];
        assert_eq!(
            Compression::from_startup_options(&opts),
            Ok(Compression::Snappy)
        );
        assert_eq!(
            Compression::from_startup_options(&[("CQL_VERSION", "3.0.0")]),
            Ok(Compression::None)
        );
    }

    #[test]
    fn round_trips_both_algorithms() {
        for c in [Compression::Lz4, Compression::Snappy] {
            for len in [0, 1, 100, 10_000] {
                let data = sample(len);
                let mut out = BytesMut::new();
                c.compress_into(&data, &mut out);
                assert_eq!(c.decompress(&out, 1 << 20).unwrap(), data, "{c:?} {len}");
            }
        }
    }

    #[test]
    fn lz4_layout_is_big_endian_length_plus_raw_block() {
        let data = sample(1000);
        let mut out = BytesMut::new();
        Compression::Lz4.compress_into(&data, &mut out);
        assert_eq!(&out[..4], &1000u32.to_be_bytes());
        assert_eq!(lz4_flex::block::decompress(&out[4..], 1000).unwrap(), data);
    }

    #[test]
    fn bounds_the_claimed_output_size() {
        // A tiny lz4 body claiming 2 GiB.
        let lie = [0x80, 0, 0, 0, 0x10, b'a'];
        assert!(Compression::Lz4.decompress(&lie, usize::MAX).is_err());
        assert!(Compression::Lz4.decompress(&lie, 1 << 24).is_err());
        // A snappy varint claiming 2 GiB.
        let lie = [0x80, 0x80, 0x80, 0x80, 0x08, 0x00];
        assert!(Compression::Snappy.decompress(&lie, 1 << 24).is_err());
        // A 4-byte snappy body claiming 1 MiB, under the cap but impossible for its size.
        let lie = [0x80, 0x80, 0x40, 0x00];
        assert_eq!(
            Compression::Snappy.decompress(&lie, 1 << 24),
            Err(DecodeError("snappy uncompressed length is implausible"))
        );
        // The densest real inputs stay within the plausibility bounds.
        let zeros = vec![0u8; 1 << 20];
        for c in [Compression::Lz4, Compression::Snappy] {
            let mut out = BytesMut::new();
            c.compress_into(&zeros, &mut out);
            assert_eq!(c.decompress(&out, 1 << 24).unwrap(), zeros);
        }
        // Honest but over the cap.
        let data = sample(5000);
        for c in [Compression::Lz4, Compression::Snappy] {
            let mut out = BytesMut::new();
            c.compress_into(&data, &mut out);
            assert!(c.decompress(&out, 4999).is_err());
            assert!(c.decompress(&out, 5000).is_ok());
        }
    }

    #[test]
    fn corrupt_input_is_an_error() {
        assert!(Compression::Lz4.decompress(&[0, 0], 100).is_err());
        assert!(Compression::Lz4
            .decompress(&[0, 0, 0, 50, 0xff, 0xff], 100)
            .is_err());
        assert!(Compression::Snappy
            .decompress(&[10, 0xff, 0xff], 100)
            .is_err());
        assert!(Compression::None.decompress(&[1], 100).is_err());
    }

    #[test]
    fn in_place_frame_compression_respects_threshold() {
        for c in [Compression::Lz4, Compression::Snappy] {
            let mut buf = BytesMut::from(&b"prefix"[..]);
            let start = begin_frame(&mut buf, 5, Opcode::Result);
            let body = sample(4000);
            buf.extend_from_slice(&body);
            finish_frame(&mut buf, start);
            c.compress_frame_in_place(&mut buf, start);
            assert_eq!(&buf[..6], b"prefix");
            assert_eq!(buf[start + 1] & FLAG_COMPRESSION, FLAG_COMPRESSION);
            let len = u32::from_be_bytes(buf[start + 5..start + 9].try_into().unwrap()) as usize;
            assert_eq!(len, buf.len() - start - HEADER_LEN);
            assert!(len < body.len());
            assert_eq!(c.decompress(&buf[start + 9..], 1 << 20).unwrap(), body);

            // Small bodies stay plain.
            let mut buf = BytesMut::new();
            let start = begin_frame(&mut buf, 5, Opcode::Result);
            buf.extend_from_slice(&sample(100));
            finish_frame(&mut buf, start);
            c.compress_frame_in_place(&mut buf, start);
            assert_eq!(buf[1], 0);
            assert_eq!(buf.len(), HEADER_LEN + 100);
        }
    }
}
