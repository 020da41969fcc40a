//! The opaque paging state: where the next page resumes, bound to its statement.
//!
//! Layout (big-endian): magic `0x5C`, version 1, statement hash (u64), remaining LIMIT
//! (u32, MAX = none), then a position tag and its fields. Decoding is fully checked: a
//! tampered or foreign state is an Invalid error, never a panic.

use bytes::{BufMut, Bytes, BytesMut};
use sluice_protocol::{DbError, DetailedError};
use std::ops::Bound;

const MAGIC: u8 = 0x5C;
const VERSION: u8 = 1;
const NONE: u32 = u32::MAX;

/// Where the next page starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Position {
    /// System tables: rows already returned.
    Offset(u32),
    /// The `index`-th partition of the statement's partition list.
    Partition {
        /// Partition index.
        index: u32,
        /// Last clustering key returned in it (None = from its start).
        after: Option<Vec<Bytes>>,
        /// Per-partition limit left in it.
        ppl_left: Option<u32>,
    },
    /// A scan resuming from a token bound.
    ScanToken(Bound<i64>),
    /// A scan resuming inside a partition.
    ScanResume {
        /// Its token.
        token: i64,
        /// Its key.
        key: Bytes,
        /// Last clustering key returned (None = from its start).
        after: Option<Vec<Bytes>>,
        /// Per-partition limit left in it.
        ppl_left: Option<u32>,
    },
}

/// A decoded paging state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PagingState {
    /// Hash of the statement the state belongs to.
    pub stmt: u64,
    /// Rows left under LIMIT.
    pub limit_left: Option<u32>,
    /// Position.
    pub pos: Position,
}

fn put_opt(out: &mut BytesMut, v: Option<u32>) {
    out.put_u32(v.unwrap_or(NONE));
}

fn put_key(out: &mut BytesMut, after: &Option<Vec<Bytes>>) {
    match after {
        None => out.put_u8(0),
        Some(parts) => {
            out.put_u8(1);
            out.put_u16(parts.len() as u16);
            for p in parts {
                out.put_u32(p.len() as u32);
                out.put_slice(p);
            }
        }
    }
}

impl PagingState {
    /// Serializes the state.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(64);
        out.put_u8(MAGIC);
        out.put_u8(VERSION);
        out.put_u64(self.stmt);
        put_opt(&mut out, self.limit_left);
        match &self.pos {
            Position::Offset(n) => {
                out.put_u8(0);
                out.put_u32(*n);
            }
            Position::Partition {
                index,
                after,
                ppl_left,
            } => {
                out.put_u8(1);
                out.put_u32(*index);
                put_opt(&mut out, *ppl_left);
                put_key(&mut out, after);
            }
            Position::ScanToken(b) => {
                out.put_u8(2);
                match b {
                    Bound::Unbounded => {
                        out.put_u8(0);
                        out.put_i64(0);
                    }
                    Bound::Included(t) => {
                        out.put_u8(1);
                        out.put_i64(*t);
                    }
                    Bound::Excluded(t) => {
                        out.put_u8(2);
                        out.put_i64(*t);
                    }
                }
            }
            Position::ScanResume {
                token,
                key,
                after,
                ppl_left,
            } => {
                out.put_u8(3);
                out.put_i64(*token);
                out.put_u32(key.len() as u32);
                out.put_slice(key);
                put_opt(&mut out, *ppl_left);
                put_key(&mut out, after);
            }
        }
        out.freeze()
    }

    /// Parses a state, checking that it belongs to statement `stmt`.
    pub fn decode(b: &Bytes, stmt: u64) -> Result<PagingState, DetailedError> {
        let mut r = Reader { b, pos: 0 };
        let st = r.state().ok_or_else(bad)?;
        if r.pos != b.len() {
            return Err(bad());
        }
        if st.stmt != stmt {
            return Err(DetailedError::new(
                DbError::Invalid,
                "The paging state does not belong to this statement",
            ));
        }
        Ok(st)
    }
}

fn bad() -> DetailedError {
    DetailedError::new(DbError::Invalid, "Invalid paging state")
}

struct Reader<'a> {
    b: &'a Bytes,
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.b.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn opt(&mut self) -> Option<Option<u32>> {
        let v = self.u32()?;
        Some((v != NONE).then_some(v))
    }
    fn bytes(&mut self) -> Option<Bytes> {
        let n = self.u32()? as usize;
        let start = self.pos;
        self.take(n)?;
        Some(self.b.slice(start..start + n))
    }
    fn key(&mut self) -> Option<Option<Vec<Bytes>>> {
        match self.u8()? {
            0 => Some(None),
            1 => {
                let n = self.u16()? as usize;
                let mut parts = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    parts.push(self.bytes()?);
                }
                Some(Some(parts))
            }
            _ => None,
        }
    }
    fn state(&mut self) -> Option<PagingState> {
        if self.u8()? != MAGIC || self.u8()? != VERSION {
            return None;
        }
        let stmt = self.u64()?;
        let limit_left = self.opt()?;
        let pos = match self.u8()? {
            0 => Position::Offset(self.u32()?),
            1 => {
                let index = self.u32()?;
                let ppl_left = self.opt()?;
                let after = self.key()?;
                Position::Partition {
                    index,
                    after,
                    ppl_left,
                }
            }
            2 => {
                let kind = self.u8()?;
                let t = self.u64()? as i64;
                Position::ScanToken(match kind {
                    0 => Bound::Unbounded,
                    1 => Bound::Included(t),
                    2 => Bound::Excluded(t),
                    _ => return None,
                })
            }
            3 => {
                let token = self.u64()? as i64;
                let key = self.bytes()?;
                let ppl_left = self.opt()?;
                let after = self.key()?;
                Position::ScanResume {
                    token,
                    key,
                    after,
                    ppl_left,
                }
            }
            _ => return None,
        };
        Some(PagingState {
            stmt,
            limit_left,
            pos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<PagingState> {
        vec![
            PagingState {
                stmt: 1,
                limit_left: None,
                pos: Position::Offset(5),
            },
            PagingState {
                stmt: 2,
                limit_left: Some(10),
                pos: Position::Partition {
                    index: 3,
                    after: Some(vec![Bytes::from_static(b"ck"), Bytes::new()]),
                    ppl_left: Some(2),
                },
            },
            PagingState {
                stmt: 3,
                limit_left: None,
                pos: Position::ScanToken(Bound::Excluded(-5)),
            },
            PagingState {
                stmt: 4,
                limit_left: Some(1),
                pos: Position::ScanResume {
                    token: i64::MIN,
                    key: Bytes::from_static(b"pk"),
                    after: None,
                    ppl_left: None,
                },
            },
        ]
    }

    #[test]
    fn round_trips() {
        for s in samples() {
            let enc = s.encode();
            assert_eq!(PagingState::decode(&enc, s.stmt).unwrap(), s);
        }
    }

    #[test]
    fn foreign_and_truncated_states_are_rejected() {
        for s in samples() {
            let enc = s.encode();
            assert!(PagingState::decode(&enc, s.stmt + 1).is_err());
            for cut in 0..enc.len() {
                assert!(PagingState::decode(&enc.slice(..cut), s.stmt).is_err());
            }
            let mut longer = enc.to_vec();
            longer.push(0);
            assert!(PagingState::decode(&Bytes::from(longer), s.stmt).is_err());
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut x: u64 = 0x1234_5678;
        for len in 0..200 {
            let mut v = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.push(x as u8);
            }
            if len > 2 {
                v[0] = MAGIC;
                v[1] = VERSION;
            }
            let _ = PagingState::decode(&Bytes::from(v), 0);
        }
    }
}
