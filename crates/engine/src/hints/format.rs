//! The hint file: an 8-byte header, then records appended one after another. A record is
//! `len: u32` (big-endian), `crc32(len)`, `created: u64` (Unix milliseconds), `len` bytes of
//! MUTATION body, and `crc32(created ‖ body)`, as Cassandra's hint files checksum the size and
//! the hint separately: a torn length is caught before it is trusted.

use std::io::Read;

use bytes::Bytes;
use uuid::Uuid;

/// The first bytes of every hint file (the last byte is the format version).
pub const FILE_MAGIC: [u8; 8] = *b"SLUHINT1";
/// Bytes a record adds to its body.
pub const RECORD_OVERHEAD: usize = 4 + 4 + 8 + 4;
/// The longest body a record may declare; a longer one is corrupt.
pub const MAX_RECORD_BODY: usize = 256 << 20;
/// The extension of hint files.
const EXTENSION: &str = "hints";

/// CRC-32 (IEEE 802.3, reflected, the checksum of zlib and of Cassandra's hint files).
pub fn crc32(bytes: &[u8]) -> u32 {
    crc32_update(0, bytes)
}

fn crc32_update(crc: u32, bytes: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in bytes {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut c = n as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[n] = c;
        n += 1;
    }
    table
};

/// Appends one record to `out`.
pub fn encode_record(out: &mut Vec<u8>, created_ms: u64, body: &[u8]) {
    debug_assert!(body.len() <= MAX_RECORD_BODY);
    let len = (body.len() as u32).to_be_bytes();
    let created = created_ms.to_be_bytes();
    out.reserve(RECORD_OVERHEAD + body.len());
    out.extend_from_slice(&len);
    out.extend_from_slice(&crc32(&len).to_be_bytes());
    out.extend_from_slice(&created);
    out.extend_from_slice(body);
    out.extend_from_slice(&crc32_update(crc32(&created), body).to_be_bytes());
}

/// The bytes a record of `body_len` takes in a file.
pub fn record_bytes(body_len: usize) -> u64 {
    (RECORD_OVERHEAD + body_len) as u64
}

/// One record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// When the hint was stored (Unix milliseconds).
    pub created_ms: u64,
    /// The MUTATION body.
    pub body: Bytes,
}

/// Why a file's records ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// At a record boundary: every record was whole.
    Clean,
    /// Inside a record (a crash mid-write): the partial record is not a hint.
    Torn,
    /// A checksum did not match, or a length was impossible: the rest is not trusted.
    Corrupt,
}

/// What reading one record found.
#[derive(Debug)]
pub enum Next {
    /// A whole record, checksums matched.
    Record(Record),
    /// No record: the file's records end here.
    End(End),
}

/// Reads the header; false when it is missing, short or not ours.
pub fn read_header(r: &mut impl Read) -> std::io::Result<bool> {
    let mut magic = [0u8; FILE_MAGIC.len()];
    Ok(read_full(r, &mut magic)? == magic.len() && magic == FILE_MAGIC)
}

/// Reads the next record from `r`; a read error other than a short file is an error.
pub fn read_record(r: &mut impl Read) -> std::io::Result<Next> {
    let mut head = [0u8; 16];
    let got = read_full(r, &mut head)?;
    if got == 0 {
        return Ok(Next::End(End::Clean));
    }
    if got < head.len() {
        // Fewer bytes than a record's head: a write cut short.
        return Ok(Next::End(End::Torn));
    }
    let len_bytes: [u8; 4] = head[0..4].try_into().expect("four bytes");
    let len_crc = u32::from_be_bytes(head[4..8].try_into().expect("four bytes"));
    if crc32(&len_bytes) != len_crc {
        return Ok(Next::End(End::Corrupt));
    }
    let len = u32::from_be_bytes(len_bytes) as usize;
    if len > MAX_RECORD_BODY {
        return Ok(Next::End(End::Corrupt));
    }
    let created: [u8; 8] = head[8..16].try_into().expect("eight bytes");
    let mut body = vec![0u8; len];
    if read_full(r, &mut body)? < len {
        return Ok(Next::End(End::Torn));
    }
    let mut crc = [0u8; 4];
    if read_full(r, &mut crc)? < crc.len() {
        return Ok(Next::End(End::Torn));
    }
    if crc32_update(crc32(&created), &body) != u32::from_be_bytes(crc) {
        return Ok(Next::End(End::Corrupt));
    }
    Ok(Next::Record(Record {
        created_ms: u64::from_be_bytes(created),
        body: Bytes::from(body),
    }))
}

/// Fills `buf` as far as the reader goes; the count read (short only at the end).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The file name of hint file `seq` for `host`: `<host>-<seq>.hints`, the sequence padded so
/// that names sort by age.
pub fn file_name(host: Uuid, seq: u64) -> String {
    format!("{}-{seq:020}.{EXTENSION}", host.hyphenated())
}

/// The host and sequence number a hint file's name carries, if it is one.
pub fn parse_file_name(name: &str) -> Option<(Uuid, u64)> {
    let stem = name.strip_suffix(EXTENSION)?.strip_suffix('.')?;
    let (host, seq) = stem.rsplit_once('-')?;
    if seq.len() != 20 {
        return None;
    }
    Some((Uuid::parse_str(host).ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(records: &[(u64, &[u8])]) -> Vec<u8> {
        let mut out = FILE_MAGIC.to_vec();
        for (at, body) in records {
            encode_record(&mut out, *at, body);
        }
        out
    }

    fn read_all(bytes: &[u8]) -> (Vec<Record>, End) {
        let mut r = bytes;
        assert!(read_header(&mut r).unwrap());
        let mut out = Vec::new();
        loop {
            match read_record(&mut r).unwrap() {
                Next::Record(rec) => out.push(rec),
                Next::End(end) => return (out, end),
            }
        }
    }

    #[test]
    fn crc32_is_the_ieee_checksum() {
        // The standard check value of CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn records_round_trip() {
        let bodies: [&[u8]; 3] = [b"first", b"", &[7u8; 1000]];
        let file = file_of(&[(1, bodies[0]), (2, bodies[1]), (u64::MAX, bodies[2])]);
        assert_eq!(
            file.len() as u64,
            8 + bodies.iter().map(|b| record_bytes(b.len())).sum::<u64>()
        );
        let (records, end) = read_all(&file);
        assert_eq!(end, End::Clean);
        let got: Vec<(u64, &[u8])> = records
            .iter()
            .map(|r| (r.created_ms, &r.body[..]))
            .collect();
        assert_eq!(
            got,
            vec![(1, bodies[0]), (2, bodies[1]), (u64::MAX, bodies[2])]
        );
    }

    #[test]
    fn a_torn_tail_keeps_the_whole_records_before_it() {
        let file = file_of(&[(1, b"kept"), (2, b"torn record")]);
        let first_end = 8 + record_bytes(4) as usize;
        // Cut anywhere inside the second record: the first is read, the second is torn.
        for cut in first_end + 1..file.len() {
            let (records, end) = read_all(&file[..cut]);
            assert_eq!(records.len(), 1, "cut at {cut}");
            assert_eq!(&records[0].body[..], b"kept");
            assert_eq!(end, End::Torn, "cut at {cut}");
        }
        let (records, end) = read_all(&file[..first_end]);
        assert_eq!((records.len(), end), (1, End::Clean));
    }

    #[test]
    fn a_checksum_mismatch_ends_the_file_there() {
        let file = file_of(&[(1, b"good"), (2, b"flipped"), (3, b"after")]);
        let second = 8 + record_bytes(4) as usize;
        // Any flipped byte of the second record (length, its checksum, time, body, checksum).
        for at in second..second + record_bytes(7) as usize {
            let mut bad = file.clone();
            bad[at] ^= 0x40;
            let (records, end) = read_all(&bad);
            assert_eq!(records.len(), 1, "flip at {at}");
            assert_eq!(&records[0].body[..], b"good");
            assert_eq!(end, End::Corrupt, "flip at {at}");
        }
    }

    #[test]
    fn an_impossible_length_is_corrupt_not_an_allocation() {
        let mut file = FILE_MAGIC.to_vec();
        let len = (u32::MAX).to_be_bytes();
        file.extend_from_slice(&len);
        file.extend_from_slice(&crc32(&len).to_be_bytes());
        file.extend_from_slice(&[0u8; 8]);
        assert_eq!(read_all(&file), (vec![], End::Corrupt));
    }

    #[test]
    fn a_foreign_or_short_header_is_refused() {
        assert!(!read_header(&mut &b"SLUHIN"[..]).unwrap());
        assert!(!read_header(&mut &b"NOTHINTS"[..]).unwrap());
        assert!(read_header(&mut &FILE_MAGIC[..]).unwrap());
    }

    #[test]
    fn file_names_carry_host_and_sequence_and_sort_by_age() {
        let host = Uuid::from_u128(0x1234);
        let a = file_name(host, 9);
        let b = file_name(host, 10);
        assert!(a < b);
        assert_eq!(parse_file_name(&a), Some((host, 9)));
        assert_eq!(parse_file_name("x-1.hints"), None);
        assert_eq!(parse_file_name(&a.replace(".hints", ".tmp")), None);
    }
}
