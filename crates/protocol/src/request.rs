//! Request bodies (v4 §4.1): OPTIONS, STARTUP, AUTH_RESPONSE, REGISTER, QUERY, PREPARE,
//! EXECUTE, BATCH. Decoding is here (values and query strings are `Bytes` slices of the
//! body); encoding, for clients, tools and tests, is in [`encode`] beside it.

use bytes::Bytes;

use crate::compression::Compression;
use crate::frame::{Frame, FrameHeader, Opcode, FLAG_CUSTOM_PAYLOAD};
use crate::messages::{
    BatchEntry, BatchQuery, BatchRequest, BoundValues, EventType, QueryParameters, Request, Value,
    ValueRef,
};
use crate::wire::{DecodeError, Reader};

pub mod encode;

/// QUERY/EXECUTE flag: values follow.
pub const QUERY_FLAG_VALUES: u8 = 0x01;
/// QUERY/EXECUTE flag: skip result metadata.
pub const QUERY_FLAG_SKIP_METADATA: u8 = 0x02;
/// QUERY/EXECUTE flag: page size follows.
pub const QUERY_FLAG_PAGE_SIZE: u8 = 0x04;
/// QUERY/EXECUTE flag: paging state follows.
pub const QUERY_FLAG_PAGING_STATE: u8 = 0x08;
/// QUERY/EXECUTE/BATCH flag: serial consistency follows.
pub const QUERY_FLAG_SERIAL_CONSISTENCY: u8 = 0x10;
/// QUERY/EXECUTE/BATCH flag: default timestamp follows.
pub const QUERY_FLAG_DEFAULT_TIMESTAMP: u8 = 0x20;
/// QUERY/EXECUTE/BATCH flag: values are named.
pub const QUERY_FLAG_NAMES: u8 = 0x40;

/// Smallest encoding of one `[value]` (its length int).
const MIN_VALUE_LEN: usize = 4;

/// Decodes a request body (already decompressed) according to its header's opcode.
/// A custom payload (flag 0x04) is skipped. Never panics on malformed input.
pub fn decode_request(header: &FrameHeader, body: Bytes) -> Result<Request, DecodeError> {
    let mut r = Reader::new(&body);
    if header.flags & FLAG_CUSTOM_PAYLOAD != 0 {
        r.skip_bytes_map()?;
    }
    match header.opcode {
        Opcode::Options => Ok(Request::Options),
        Opcode::Startup => r.read_string_map().map(Request::Startup),
        Opcode::AuthResponse => r.read_bytes().map(Request::AuthResponse),
        Opcode::Register => decode_register(&mut r),
        Opcode::Query => {
            let query = r.read_long_string_bytes()?;
            let params = decode_query_parameters(&mut r)?;
            Ok(Request::Query { query, params })
        }
        Opcode::Prepare => Ok(Request::Prepare {
            query: r.read_long_string_bytes()?,
        }),
        Opcode::Execute => {
            let id = r.read_short_bytes()?;
            let params = decode_query_parameters(&mut r)?;
            Ok(Request::Execute { id, params })
        }
        Opcode::Batch => decode_batch(&mut r).map(Request::Batch),
        _ => Err(DecodeError("opcode is not a request")),
    }
}

impl Frame {
    /// Decompresses (if flag 0x01 is set; output bounded by `max_len`) and decodes the body.
    pub fn into_request(
        self,
        compression: Compression,
        max_len: usize,
    ) -> Result<Request, DecodeError> {
        let body = compression.decompress_body(&self.header, self.body, max_len)?;
        decode_request(&self.header, body)
    }
}

fn decode_register(r: &mut Reader<'_>) -> Result<Request, DecodeError> {
    let mut types = Vec::with_capacity(3);
    r.read_string_list_with(|name| {
        let t = match name {
            "TOPOLOGY_CHANGE" => EventType::TopologyChange,
            "STATUS_CHANGE" => EventType::StatusChange,
            "SCHEMA_CHANGE" => EventType::SchemaChange,
            _ => return Err(DecodeError("unknown event type in REGISTER")),
        };
        if !types.contains(&t) {
            types.push(t);
        }
        Ok(())
    })?;
    Ok(Request::Register(types))
}

/// Reads `n` positional `[value]`s, checking first that they can fit in the body.
fn read_values(r: &mut Reader<'_>) -> Result<Vec<Value>, DecodeError> {
    let n = r.read_count(MIN_VALUE_LEN)?;
    let mut values = Vec::with_capacity(n);
    for _ in 0..n {
        values.push(r.read_value()?);
    }
    Ok(values)
}

/// Decodes `<query_parameters>` (QUERY after the string, EXECUTE after the id).
pub fn decode_query_parameters(r: &mut Reader<'_>) -> Result<QueryParameters, DecodeError> {
    let consistency = r.read_consistency()?;
    let flags = r.read_u8()?;
    let mut params = QueryParameters {
        consistency,
        skip_metadata: flags & QUERY_FLAG_SKIP_METADATA != 0,
        ..QueryParameters::default()
    };
    if flags & QUERY_FLAG_VALUES != 0 {
        if flags & QUERY_FLAG_NAMES != 0 {
            let n = r.read_count(2 + MIN_VALUE_LEN)?;
            let mut names = Vec::with_capacity(n);
            let mut values = Vec::with_capacity(n);
            for _ in 0..n {
                names.push(r.read_string()?.to_owned());
                values.push(r.read_value()?);
            }
            params.names = Some(names);
            params.values = values;
        } else {
            params.values = read_values(r)?;
        }
    }
    if flags & QUERY_FLAG_PAGE_SIZE != 0 {
        params.page_size = Some(r.read_int()?);
    }
    if flags & QUERY_FLAG_PAGING_STATE != 0 {
        params.paging_state = r.read_bytes()?;
    }
    if flags & QUERY_FLAG_SERIAL_CONSISTENCY != 0 {
        params.serial_consistency = Some(r.read_consistency()?);
    }
    if flags & QUERY_FLAG_DEFAULT_TIMESTAMP != 0 {
        params.default_timestamp = Some(r.read_long()?);
    }
    Ok(params)
}

fn decode_batch(r: &mut Reader<'_>) -> Result<BatchRequest, DecodeError> {
    let batch_type = r.read_u8()?;
    if batch_type > 2 {
        return Err(DecodeError("unknown BATCH type"));
    }
    // Smallest entry: kind byte + empty short bytes + value count.
    let n = r.read_count(1 + 2 + 2)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let statement = match r.read_u8()? {
            0 => BatchQuery::Text(r.read_long_string_bytes()?),
            1 => BatchQuery::Prepared(r.read_short_bytes()?),
            _ => return Err(DecodeError("unknown BATCH statement kind")),
        };
        let values = read_values(r)?;
        entries.push(BatchEntry { statement, values });
    }
    let consistency = r.read_consistency()?;
    let flags = r.read_u8()?;
    if flags & QUERY_FLAG_NAMES != 0 {
        // v4 spec: named values in BATCH are not supported (CASSANDRA-10246). The names would
        // precede each value, so this body cannot have been parsed correctly.
        return Err(DecodeError("named values are not supported in BATCH"));
    }
    let serial_consistency = if flags & QUERY_FLAG_SERIAL_CONSISTENCY != 0 {
        Some(r.read_consistency()?)
    } else {
        None
    };
    let default_timestamp = if flags & QUERY_FLAG_DEFAULT_TIMESTAMP != 0 {
        Some(r.read_long()?)
    } else {
        None
    };
    Ok(BatchRequest {
        batch_type,
        entries,
        consistency,
        serial_consistency,
        default_timestamp,
    })
}

/// The prepared id of an EXECUTE body without decoding its values (for statement-cache and
/// routing decisions before full decode). `body` must be decompressed.
pub fn peek_execute_id(header: &FrameHeader, body: &Bytes) -> Result<Bytes, DecodeError> {
    read_execute_id(header, body).map(|(id, _)| id)
}

/// An EXECUTE body's prepared id, and a reader positioned after it.
fn read_execute_id<'b>(
    header: &FrameHeader,
    body: &'b Bytes,
) -> Result<(Bytes, Reader<'b>), DecodeError> {
    if header.opcode != Opcode::Execute {
        return Err(DecodeError("not an EXECUTE"));
    }
    let mut r = Reader::new(body);
    if header.flags & FLAG_CUSTOM_PAYLOAD != 0 {
        r.skip_bytes_map()?;
    }
    let id = r.read_short_bytes()?;
    Ok((id, r))
}

/// How many leading positional values [`ExecuteHead::read`] reads.
pub const VALUE_PREFIX: usize = 8;

/// The leading positional values of an EXECUTE body, borrowed from the body where they lie
/// (no allocation, no reference count), and its statement id ([`ExecuteHead::read`]): enough
/// to find the statement, its deadline and its partition (for the rate limiter) before the
/// full decode, so that a request turned away there is never decoded further.
#[derive(Debug, Clone)]
pub struct ExecuteHead<'b> {
    /// The body the values are read from.
    body: &'b Bytes,
    /// Inline and initialised only as far as read; `Copy` values, so nothing to drop.
    values: arrayvec::ArrayVec<ValueRef<'b>, VALUE_PREFIX>,
    complete: bool,
}

impl<'b> ExecuteHead<'b> {
    /// A head of `body`, not read yet (no values, not complete).
    pub fn new(body: &'b Bytes) -> ExecuteHead<'b> {
        ExecuteHead {
            body,
            values: arrayvec::ArrayVec::new(),
            complete: false,
        }
    }

    /// The leading positional values read (all of them when [`Self::complete`]).
    pub fn values(&self) -> &[ValueRef<'b>] {
        &self.values
    }

    /// True when [`Self::values`] holds every bound value: they are positional and at
    /// most [`VALUE_PREFIX`]. Otherwise only the full decode has them.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Reads the body's id and up to [`VALUE_PREFIX`] positional values into `self` (filled
    /// in place: the head is a few hundred bytes, not worth moving), and returns the prepared
    /// statement id, borrowed from the body (looking it up needs no copy). The body must be
    /// decompressed. Never panics on malformed input; the full decode reports the precise
    /// error.
    pub fn read(&mut self, header: &FrameHeader) -> Result<&'b [u8], DecodeError> {
        self.values.clear();
        self.complete = false;
        if header.opcode != Opcode::Execute {
            return Err(DecodeError("not an EXECUTE"));
        }
        let mut r = Reader::new(self.body);
        if header.flags & FLAG_CUSTOM_PAYLOAD != 0 {
            r.skip_bytes_map()?;
        }
        let id = r.read_short_bytes_borrowed()?;
        r.read_consistency()?;
        let flags = r.read_u8()?;
        if flags & QUERY_FLAG_VALUES == 0 {
            self.complete = true;
        } else if flags & QUERY_FLAG_NAMES == 0 {
            let n = r.read_count(MIN_VALUE_LEN)?;
            for _ in 0..n.min(VALUE_PREFIX) {
                self.values.push(r.read_value_borrowed()?);
            }
            self.complete = n <= VALUE_PREFIX;
        }
        Ok(id)
    }
}

impl BoundValues for ExecuteHead<'_> {
    #[inline]
    fn count(&self) -> usize {
        self.values.len()
    }

    #[inline]
    fn value(&self, index: usize) -> Option<ValueRef<'_>> {
        self.values.get(index).copied()
    }

    /// The values as slices of the body, on the stack: the same reference counts the
    /// full decode takes, paid only by statements that need decoded values to route.
    fn with_decoded<R>(&self, f: impl FnOnce(&[Value]) -> R) -> R {
        let decoded: arrayvec::ArrayVec<Value, VALUE_PREFIX> = self
            .values
            .iter()
            .map(|v| match v {
                ValueRef::Set(bytes) => Value::Set(self.body.slice_ref(bytes)),
                ValueRef::Null => Value::Null,
                ValueRef::Unset => Value::Unset,
            })
            .collect();
        f(&decoded)
    }
}

/// The (UTF-8 validated) text of a QUERY or PREPARE body without decoding its parameters.
pub fn peek_query_text(header: &FrameHeader, body: &Bytes) -> Result<Bytes, DecodeError> {
    if !matches!(header.opcode, Opcode::Query | Opcode::Prepare) {
        return Err(DecodeError("not a QUERY or PREPARE"));
    }
    let mut r = Reader::new(body);
    if header.flags & FLAG_CUSTOM_PAYLOAD != 0 {
        r.skip_bytes_map()?;
    }
    r.read_long_string_bytes()
}

/// The consistency level of a QUERY/EXECUTE/BATCH body, or `None` for other opcodes and
/// malformed bodies. A BATCH requires a scan past its entries; QUERY/EXECUTE are O(1).
pub fn peek_consistency(header: &FrameHeader, body: &Bytes) -> Option<crate::Consistency> {
    let mut r = Reader::new(body);
    if header.flags & FLAG_CUSTOM_PAYLOAD != 0 {
        r.skip_bytes_map().ok()?;
    }
    match header.opcode {
        Opcode::Query => {
            r.read_long_string_bytes().ok()?;
        }
        Opcode::Execute => {
            r.read_short_bytes().ok()?;
        }
        Opcode::Batch => return decode_batch(&mut r).ok().map(|b| b.consistency),
        _ => return None,
    }
    r.read_consistency().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::Consistency;
    use crate::wire::*;
    use bytes::{BufMut, BytesMut};

    fn hdr(opcode: Opcode, flags: u8, len: usize) -> FrameHeader {
        FrameHeader {
            version: 0x04,
            flags,
            stream: 1,
            opcode,
            length: len as u32,
        }
    }

    fn decode(opcode: Opcode, body: BytesMut) -> Result<Request, DecodeError> {
        let body = body.freeze();
        decode_request(&hdr(opcode, 0, body.len()), body)
    }

    #[test]
    fn options_startup_auth_register() {
        assert_eq!(
            decode(Opcode::Options, BytesMut::new()),
            Ok(Request::Options)
        );

        let mut b = BytesMut::new();
        put_string_map(&mut b, &[("CQL_VERSION", "3.0.0"), ("COMPRESSION", "lz4")]);
        assert_eq!(
            decode(Opcode::Startup, b),
            Ok(Request::Startup(vec![
                ("CQL_VERSION".into(), "3.0.0".into()),
                ("COMPRESSION".into(), "lz4".into())
            ]))
        );

        let mut b = BytesMut::new();
        put_bytes(&mut b, Some(b"\0user\0pw"));
        assert_eq!(
            decode(Opcode::AuthResponse, b),
            Ok(Request::AuthResponse(Some(Bytes::from_static(
                b"\0user\0pw"
            ))))
        );
        let mut b = BytesMut::new();
        put_bytes(&mut b, None);
        assert_eq!(
            decode(Opcode::AuthResponse, b),
            Ok(Request::AuthResponse(None))
        );

        let mut b = BytesMut::new();
        put_string_list(
            &mut b,
            &["TOPOLOGY_CHANGE", "STATUS_CHANGE", "SCHEMA_CHANGE"],
        );
        assert_eq!(
            decode(Opcode::Register, b),
            Ok(Request::Register(vec![
                EventType::TopologyChange,
                EventType::StatusChange,
                EventType::SchemaChange
            ]))
        );
        let mut b = BytesMut::new();
        put_string_list(&mut b, &["CLIENT_ROUTES_CHANGE"]);
        assert!(decode(Opcode::Register, b).is_err());
    }

    #[test]
    fn query_with_every_flag() {
        let mut b = BytesMut::new();
        put_long_string(&mut b, "SELECT v FROM ks.t WHERE k = ?");
        put_consistency(&mut b, Consistency::LocalQuorum);
        put_u8(&mut b, 0x01 | 0x02 | 0x04 | 0x08 | 0x10 | 0x20);
        put_short(&mut b, 3);
        put_bytes(&mut b, Some(&7i32.to_be_bytes()));
        put_int(&mut b, -1);
        put_int(&mut b, -2);
        put_int(&mut b, 5000);
        put_bytes(&mut b, Some(b"state"));
        put_consistency(&mut b, Consistency::LocalSerial);
        put_long(&mut b, 1_700_000_000_000_000);
        let Request::Query { query, params } = decode(Opcode::Query, b).unwrap() else {
            panic!("not a query")
        };
        assert_eq!(&query[..], b"SELECT v FROM ks.t WHERE k = ?");
        assert_eq!(
            params,
            QueryParameters {
                consistency: Consistency::LocalQuorum,
                values: vec![
                    Value::Set(Bytes::copy_from_slice(&7i32.to_be_bytes())),
                    Value::Null,
                    Value::Unset
                ],
                names: None,
                skip_metadata: true,
                page_size: Some(5000),
                paging_state: Some(Bytes::from_static(b"state")),
                serial_consistency: Some(Consistency::LocalSerial),
                default_timestamp: Some(1_700_000_000_000_000),
            }
        );
    }

    #[test]
    fn query_with_named_values_and_no_flags() {
        let mut b = BytesMut::new();
        put_long_string(&mut b, "INSERT INTO t (k, v) VALUES (:k, :v)");
        put_consistency(&mut b, Consistency::One);
        put_u8(&mut b, 0x41);
        put_short(&mut b, 2);
        put_string(&mut b, "k");
        put_bytes(&mut b, Some(b"a"));
        put_string(&mut b, "v");
        put_int(&mut b, -2);
        let Request::Query { params, .. } = decode(Opcode::Query, b).unwrap() else {
            panic!()
        };
        assert_eq!(params.names, Some(vec!["k".to_owned(), "v".to_owned()]));
        assert_eq!(
            params.values,
            vec![Value::Set(Bytes::from_static(b"a")), Value::Unset]
        );

        let mut b = BytesMut::new();
        put_long_string(&mut b, "SELECT now() FROM system.local");
        put_consistency(&mut b, Consistency::One);
        put_u8(&mut b, 0);
        let Request::Query { params, .. } = decode(Opcode::Query, b).unwrap() else {
            panic!()
        };
        assert_eq!(params, QueryParameters::default());
    }

    #[test]
    fn execute_head_reads_a_bounded_prefix_that_matches_the_full_decode() {
        let body_with = |n: u16, flags: u8| {
            let mut b = BytesMut::new();
            put_short_bytes(&mut b, &[7; 16]);
            put_consistency(&mut b, Consistency::One);
            put_u8(&mut b, flags);
            if flags & QUERY_FLAG_VALUES != 0 {
                put_short(&mut b, n);
                for i in 0..n {
                    if flags & QUERY_FLAG_NAMES != 0 {
                        put_string(&mut b, "x");
                    }
                    match i % 4 {
                        // Null and unset between set values: each kind is read in place.
                        2 => put_bytes(&mut b, None),
                        3 => put_int(&mut b, -2),
                        _ => put_bytes(&mut b, Some(&[i as u8])),
                    }
                }
            }
            b.freeze()
        };
        for (n, flags, complete, len) in [
            (0, 0, true, 0),
            (3, QUERY_FLAG_VALUES, true, 3),
            (8, QUERY_FLAG_VALUES, true, 8),
            (10, QUERY_FLAG_VALUES, false, 8),
            (2, QUERY_FLAG_VALUES | QUERY_FLAG_NAMES, false, 0),
        ] {
            let body = body_with(n, flags);
            let h = hdr(Opcode::Execute, 0, body.len());
            let mut head = ExecuteHead::new(&body);
            head.read(&h).unwrap();
            assert_eq!(
                (head.complete(), head.values().len(), head.count()),
                (complete, len, len),
                "{n} {flags}"
            );
            let Ok(Request::Execute { params, .. }) = decode_request(&h, body.clone()) else {
                panic!("full decode")
            };
            let full: Vec<ValueRef<'_>> = params.values.iter().map(Value::borrowed).collect();
            assert_eq!(head.values(), &full[..len]);
            for i in 0..len + 1 {
                assert_eq!(head.value(i), params.values[..len].value(i), "{n} {i}");
            }
            // Decoded from the head: the full decode's values, still slices of the body.
            head.with_decoded(|decoded| {
                assert_eq!(decoded, &params.values[..len]);
                for v in decoded {
                    if let Value::Set(b) = v {
                        let within = body.as_ptr_range();
                        assert!(within.contains(&b.as_ptr()), "a slice of the body");
                    }
                }
            });
            // Truncated anywhere: an error (or, for named values, which it does not read, an
            // incomplete head), never a panic and never a complete head.
            for cut in 0..body.len() {
                let short = body.slice(..cut);
                let mut head = ExecuteHead::new(&short);
                let read = head.read(&h);
                assert!(read.is_err() || !head.complete(), "cut {cut}");
            }
        }
        let body = body_with(1, QUERY_FLAG_VALUES);
        let mut head = ExecuteHead::new(&body);
        assert!(head.read(&hdr(Opcode::Query, 0, body.len())).is_err());
        assert!(!head.complete());
    }

    #[test]
    fn execute_and_prepare() {
        let mut b = BytesMut::new();
        put_short_bytes(&mut b, &[0xAB; 16]);
        put_consistency(&mut b, Consistency::Quorum);
        put_u8(&mut b, 0x01);
        put_short(&mut b, 1);
        put_bytes(&mut b, Some(b"v"));
        let body = b.freeze();
        let h = hdr(Opcode::Execute, 0, body.len());
        assert_eq!(&peek_execute_id(&h, &body).unwrap()[..], &[0xAB; 16]);
        let mut head = ExecuteHead::new(&body);
        assert_eq!(head.read(&h).unwrap(), &[0xAB; 16]);
        assert!(head.complete());
        assert_eq!(head.values(), &[ValueRef::Set(b"v")]);
        // Borrowed where it lies, not copied.
        if let [ValueRef::Set(v)] = head.values() {
            assert_eq!(v.as_ptr(), body[body.len() - 1..].as_ptr());
        }
        assert_eq!(peek_consistency(&h, &body), Some(Consistency::Quorum));
        let req = decode_request(&h, body.clone()).unwrap();
        let Request::Execute { id, params } = req else {
            panic!()
        };
        assert_eq!(&id[..], &[0xAB; 16]);
        assert_eq!(params.values, vec![Value::Set(Bytes::from_static(b"v"))]);
        // Values are slices of the frame body, not copies.
        if let Value::Set(v) = &params.values[0] {
            assert_eq!(v.as_ptr(), body[body.len() - 1..].as_ptr());
        }

        let mut b = BytesMut::new();
        put_long_string(&mut b, "SELECT * FROM ks.t");
        let body = b.freeze();
        let h = hdr(Opcode::Prepare, 0, body.len());
        assert_eq!(
            &peek_query_text(&h, &body).unwrap()[..],
            b"SELECT * FROM ks.t"
        );
        assert_eq!(
            decode_request(&h, body),
            Ok(Request::Prepare {
                query: Bytes::from_static(b"SELECT * FROM ks.t")
            })
        );
    }

    #[test]
    fn batch_of_text_and_prepared() {
        let mut b = BytesMut::new();
        put_u8(&mut b, 1);
        put_short(&mut b, 2);
        put_u8(&mut b, 0);
        put_long_string(&mut b, "INSERT INTO t (k) VALUES (?)");
        put_short(&mut b, 1);
        put_bytes(&mut b, Some(b"k1"));
        put_u8(&mut b, 1);
        put_short_bytes(&mut b, &[1; 16]);
        put_short(&mut b, 0);
        put_consistency(&mut b, Consistency::LocalOne);
        put_u8(&mut b, 0x30);
        put_consistency(&mut b, Consistency::Serial);
        put_long(&mut b, 42);
        assert_eq!(
            decode(Opcode::Batch, b),
            Ok(Request::Batch(BatchRequest {
                batch_type: 1,
                entries: vec![
                    BatchEntry {
                        statement: BatchQuery::Text(Bytes::from_static(
                            b"INSERT INTO t (k) VALUES (?)"
                        )),
                        values: vec![Value::Set(Bytes::from_static(b"k1"))],
                    },
                    BatchEntry {
                        statement: BatchQuery::Prepared(Bytes::from_static(&[1; 16])),
                        values: vec![],
                    },
                ],
                consistency: Consistency::LocalOne,
                serial_consistency: Some(Consistency::Serial),
                default_timestamp: Some(42),
            }))
        );
    }

    #[test]
    fn custom_payload_is_skipped() {
        let mut b = BytesMut::new();
        put_short(&mut b, 1);
        put_string(&mut b, "tablets-routing-v1");
        put_bytes(&mut b, Some(b"xyz"));
        put_long_string(&mut b, "SELECT 1");
        let body = b.freeze();
        let h = hdr(Opcode::Prepare, FLAG_CUSTOM_PAYLOAD, body.len());
        assert_eq!(
            decode_request(&h, body),
            Ok(Request::Prepare {
                query: Bytes::from_static(b"SELECT 1")
            })
        );
    }

    #[test]
    fn malformed_bodies_are_errors() {
        // Invalid UTF-8 in the query.
        let mut b = BytesMut::new();
        put_int(&mut b, 2);
        b.put_slice(&[0xC3, 0x28]);
        assert!(decode(Opcode::Prepare, b).is_err());
        // Unknown consistency.
        let mut b = BytesMut::new();
        put_long_string(&mut b, "x");
        put_short(&mut b, 0x0F);
        put_u8(&mut b, 0);
        assert!(decode(Opcode::Query, b).is_err());
        // A value count that cannot fit.
        let mut b = BytesMut::new();
        put_short_bytes(&mut b, &[1; 16]);
        put_consistency(&mut b, Consistency::One);
        put_u8(&mut b, 0x01);
        put_short(&mut b, 60_000);
        put_int(&mut b, 1);
        assert_eq!(
            decode(Opcode::Execute, b),
            Err(DecodeError("element count exceeds message body"))
        );
        // Value length below -2.
        let mut b = BytesMut::new();
        put_short_bytes(&mut b, &[1; 16]);
        put_consistency(&mut b, Consistency::One);
        put_u8(&mut b, 0x01);
        put_short(&mut b, 1);
        put_int(&mut b, -7);
        assert!(decode(Opcode::Execute, b).is_err());
        // Batch: bad type, bad kind, names flag.
        let mut b = BytesMut::new();
        put_u8(&mut b, 3);
        put_short(&mut b, 0);
        assert!(decode(Opcode::Batch, b).is_err());
        let mut b = BytesMut::new();
        put_u8(&mut b, 0);
        put_short(&mut b, 1);
        put_u8(&mut b, 2);
        put_short(&mut b, 0);
        put_short(&mut b, 0);
        assert!(decode(Opcode::Batch, b).is_err());
        let mut b = BytesMut::new();
        put_u8(&mut b, 0);
        put_short(&mut b, 0);
        put_consistency(&mut b, Consistency::One);
        put_u8(&mut b, 0x40);
        assert!(decode(Opcode::Batch, b).is_err());
        // Response opcode as a request.
        assert!(decode(Opcode::Ready, BytesMut::new()).is_err());
    }

    #[test]
    fn every_truncation_of_valid_bodies_fails_without_panic() {
        let mut b = BytesMut::new();
        put_long_string(&mut b, "SELECT v FROM ks.t WHERE k = ?");
        put_consistency(&mut b, Consistency::LocalQuorum);
        put_u8(&mut b, 0x7F);
        put_short(&mut b, 1);
        put_string(&mut b, "k");
        put_bytes(&mut b, Some(b"abc"));
        put_int(&mut b, 100);
        put_bytes(&mut b, Some(b"state"));
        put_consistency(&mut b, Consistency::Serial);
        put_long(&mut b, 9);
        let body = b.freeze();
        let h = hdr(Opcode::Query, 0, body.len());
        assert!(decode_request(&h, body.clone()).is_ok());
        for cut in 0..body.len() {
            assert!(decode_request(&h, body.slice(..cut)).is_err(), "cut {cut}");
        }
    }
}
