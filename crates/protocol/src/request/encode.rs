//! Request encoding (v4 §4.1), the inverse of [`decode_request`](super::decode_request): what a
//! client sends. The server never encodes requests; the load generator, the test harnesses and
//! the tools do, so that every request frame Sluice's own code builds goes through one codec
//! that the decoder is tested against.
//!
//! Writers never fail. Counts that the wire cannot carry (more than 65,535 values or entries)
//! are cut to what fits, which the decoder then reads as a shorter request; such requests are
//! far beyond the frame cap and never built by the tools.

use bytes::{BufMut, BytesMut};

use crate::compression::Compression;
use crate::frame::{Opcode, FLAG_COMPRESSION, HEADER_LEN, REQUEST_VERSION};
use crate::messages::{BatchQuery, BatchRequest, EventType, QueryParameters, Request, Value};
use crate::request::{
    QUERY_FLAG_DEFAULT_TIMESTAMP, QUERY_FLAG_NAMES, QUERY_FLAG_PAGE_SIZE, QUERY_FLAG_PAGING_STATE,
    QUERY_FLAG_SERIAL_CONSISTENCY, QUERY_FLAG_SKIP_METADATA, QUERY_FLAG_VALUES,
};
use crate::wire::{
    put_bytes, put_consistency, put_int, put_long, put_short, put_short_bytes, put_string,
    put_string_list, put_string_map, put_u8,
};

/// The most elements a `[short]` count can announce.
const MAX_COUNT: usize = u16::MAX as usize;

impl EventType {
    /// The name REGISTER sends for this event type.
    pub const fn name(self) -> &'static str {
        match self {
            EventType::TopologyChange => "TOPOLOGY_CHANGE",
            EventType::StatusChange => "STATUS_CHANGE",
            EventType::SchemaChange => "SCHEMA_CHANGE",
        }
    }
}

impl Value {
    /// Appends this `[value]`: its bytes with an int length, or length -1 (null) or -2 (unset).
    pub fn encode(&self, buf: &mut BytesMut) {
        match self {
            Value::Set(b) => put_bytes(buf, Some(&b[..])),
            Value::Null => put_int(buf, -1),
            Value::Unset => put_int(buf, -2),
        }
    }
}

/// Appends a `[short]` count followed by each value (positional values of BATCH entries).
fn encode_values(values: &[Value], buf: &mut BytesMut) {
    debug_assert!(
        values.len() <= MAX_COUNT,
        "more values than a [short] counts"
    );
    let values = &values[..values.len().min(MAX_COUNT)];
    put_short(buf, values.len() as u16);
    for v in values {
        v.encode(buf);
    }
}

impl QueryParameters {
    /// The `<flags>` byte these parameters are sent with. Values are announced when there are
    /// any, or when names are given (an empty named list then decodes as the same empty list).
    pub fn flags(&self) -> u8 {
        let mut flags = 0;
        if !self.values.is_empty() || self.names.is_some() {
            flags |= QUERY_FLAG_VALUES;
        }
        if self.names.is_some() {
            flags |= QUERY_FLAG_NAMES;
        }
        if self.skip_metadata {
            flags |= QUERY_FLAG_SKIP_METADATA;
        }
        if self.page_size.is_some() {
            flags |= QUERY_FLAG_PAGE_SIZE;
        }
        if self.paging_state.is_some() {
            flags |= QUERY_FLAG_PAGING_STATE;
        }
        if self.serial_consistency.is_some() {
            flags |= QUERY_FLAG_SERIAL_CONSISTENCY;
        }
        if self.default_timestamp.is_some() {
            flags |= QUERY_FLAG_DEFAULT_TIMESTAMP;
        }
        flags
    }

    /// Appends `<query_parameters>` (QUERY after its string, EXECUTE after its id). `names`,
    /// when present, must have one entry per value.
    pub fn encode(&self, buf: &mut BytesMut) {
        put_consistency(buf, self.consistency);
        let flags = self.flags();
        put_u8(buf, flags);
        if flags & QUERY_FLAG_VALUES != 0 {
            match &self.names {
                Some(names) => {
                    debug_assert_eq!(names.len(), self.values.len(), "one name per value");
                    let n = names.len().min(self.values.len()).min(MAX_COUNT);
                    put_short(buf, n as u16);
                    for (name, value) in names.iter().zip(&self.values).take(n) {
                        put_string(buf, name);
                        value.encode(buf);
                    }
                }
                None => encode_values(&self.values, buf),
            }
        }
        if let Some(page_size) = self.page_size {
            put_int(buf, page_size);
        }
        if let Some(state) = &self.paging_state {
            put_bytes(buf, Some(&state[..]));
        }
        if let Some(serial) = self.serial_consistency {
            put_consistency(buf, serial);
        }
        if let Some(timestamp) = self.default_timestamp {
            put_long(buf, timestamp);
        }
    }
}

impl BatchRequest {
    /// Appends a BATCH body. Entries carry positional values only: v4 cannot name them.
    pub fn encode(&self, buf: &mut BytesMut) {
        put_u8(buf, self.batch_type);
        debug_assert!(
            self.entries.len() <= MAX_COUNT,
            "more entries than a [short] counts"
        );
        let entries = &self.entries[..self.entries.len().min(MAX_COUNT)];
        put_short(buf, entries.len() as u16);
        for entry in entries {
            match &entry.statement {
                BatchQuery::Text(text) => {
                    put_u8(buf, 0);
                    put_bytes(buf, Some(&text[..]));
                }
                BatchQuery::Prepared(id) => {
                    put_u8(buf, 1);
                    put_short_bytes(buf, id);
                }
            }
            encode_values(&entry.values, buf);
        }
        put_consistency(buf, self.consistency);
        let mut flags = 0;
        if self.serial_consistency.is_some() {
            flags |= QUERY_FLAG_SERIAL_CONSISTENCY;
        }
        if self.default_timestamp.is_some() {
            flags |= QUERY_FLAG_DEFAULT_TIMESTAMP;
        }
        put_u8(buf, flags);
        if let Some(serial) = self.serial_consistency {
            put_consistency(buf, serial);
        }
        if let Some(timestamp) = self.default_timestamp {
            put_long(buf, timestamp);
        }
    }
}

impl Request {
    /// The opcode this request is sent with.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Request::Options => Opcode::Options,
            Request::Startup(_) => Opcode::Startup,
            Request::AuthResponse(_) => Opcode::AuthResponse,
            Request::Register(_) => Opcode::Register,
            Request::Query { .. } => Opcode::Query,
            Request::Prepare { .. } => Opcode::Prepare,
            Request::Execute { .. } => Opcode::Execute,
            Request::Batch(_) => Opcode::Batch,
        }
    }

    /// Appends the message body (no custom payload). Query text is written as given, so that
    /// tests can send text that is not UTF-8.
    pub fn encode_body(&self, buf: &mut BytesMut) {
        match self {
            Request::Options => {}
            Request::Startup(options) => put_string_map(buf, options),
            Request::AuthResponse(token) => put_bytes(buf, token.as_deref()),
            Request::Register(events) => {
                let names: arrayvec::ArrayVec<&str, 3> =
                    events.iter().take(3).map(|e| e.name()).collect();
                debug_assert!(
                    events.len() <= 3,
                    "at most one REGISTER entry per event type"
                );
                put_string_list(buf, &names);
            }
            Request::Query { query, params } => {
                put_bytes(buf, Some(&query[..]));
                params.encode(buf);
            }
            Request::Prepare { query } => put_bytes(buf, Some(&query[..])),
            Request::Execute { id, params } => {
                put_short_bytes(buf, id);
                params.encode(buf);
            }
            Request::Batch(batch) => batch.encode(buf),
        }
    }

    /// Appends a whole v4 request frame on `stream`. With a compression other than `None`
    /// the body is compressed and flag 0x01 set, except for STARTUP and OPTIONS, which are
    /// sent before compression is negotiated.
    pub fn encode_frame(&self, stream: i16, compression: Compression, buf: &mut BytesMut) {
        let start = buf.len();
        let [s0, s1] = stream.to_be_bytes();
        buf.put_slice(&[REQUEST_VERSION, 0, s0, s1, self.opcode() as u8, 0, 0, 0, 0]);
        let compress = compression != Compression::None
            && !matches!(self, Request::Startup(_) | Request::Options);
        if compress {
            let mut plain = BytesMut::new();
            self.encode_body(&mut plain);
            compression.compress_into(&plain, buf);
            buf[start + 1] |= FLAG_COMPRESSION;
        } else {
            self.encode_body(buf);
        }
        let body_len = buf.len() - start - HEADER_LEN;
        let len = u32::try_from(body_len).unwrap_or(u32::MAX);
        buf[start + 5..start + HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    }

    /// This request as one uncompressed frame on `stream`.
    pub fn to_frame(&self, stream: i16) -> BytesMut {
        let mut buf = BytesMut::with_capacity(HEADER_LEN + 64);
        self.encode_frame(stream, Compression::None, &mut buf);
        buf
    }

    /// A STARTUP asking for CQL 3.0.0 and, unless `None`, `compression`.
    pub fn startup(compression: Compression) -> Request {
        let mut options = vec![("CQL_VERSION".to_owned(), "3.0.0".to_owned())];
        if let Some(name) = compression.name() {
            options.push(("COMPRESSION".to_owned(), name.to_owned()));
        }
        Request::Startup(options)
    }

    /// A QUERY of `text` at consistency ONE with no values and no other parameters. The text
    /// is sent as given (tests send text that is not UTF-8).
    pub fn query(text: impl Into<bytes::Bytes>) -> Request {
        Request::Query {
            query: text.into(),
            params: QueryParameters::default(),
        }
    }

    /// An UNLOGGED BATCH of text `statements` without values, at consistency ONE.
    pub fn unlogged_batch(statements: &[&str]) -> Request {
        Request::Batch(crate::messages::BatchRequest {
            batch_type: 1,
            entries: statements
                .iter()
                .map(|s| crate::messages::BatchEntry {
                    statement: crate::messages::BatchQuery::Text(bytes::Bytes::copy_from_slice(
                        s.as_bytes(),
                    )),
                    values: Vec::new(),
                })
                .collect(),
            consistency: crate::messages::Consistency::One,
            serial_consistency: None,
            default_timestamp: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameDecoder;
    use crate::messages::{BatchEntry, Consistency};
    use crate::request::decode_request;
    use bytes::Bytes;
    use proptest::prelude::*;

    const MAX: usize = 1 << 20;

    fn consistency() -> impl Strategy<Value = Consistency> {
        (0u16..=10).prop_map(|c| Consistency::from_code(c).unwrap())
    }

    fn compression() -> impl Strategy<Value = Compression> {
        prop_oneof![
            Just(Compression::None),
            Just(Compression::Lz4),
            Just(Compression::Snappy)
        ]
    }

    fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
        prop::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
    }

    fn text(max: usize) -> impl Strategy<Value = Bytes> {
        prop::string::string_regex(&format!("\\PC{{0,{max}}}"))
            .unwrap()
            .prop_map(Bytes::from)
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            6 => bytes(40).prop_map(Value::Set),
            1 => Just(Value::Null),
            1 => Just(Value::Unset),
        ]
    }

    fn params() -> impl Strategy<Value = QueryParameters> {
        (
            consistency(),
            prop::collection::vec(value(), 0..10),
            any::<bool>(),
            any::<bool>(),
            prop::option::of(any::<i32>()),
            prop::option::of(bytes(20)),
            prop::option::of(consistency()),
            prop::option::of(any::<i64>()),
        )
            .prop_map(
                |(
                    consistency,
                    values,
                    named,
                    skip_metadata,
                    page_size,
                    paging_state,
                    serial,
                    ts,
                )| {
                    QueryParameters {
                        consistency,
                        names: named.then(|| (0..values.len()).map(|i| format!("n{i}")).collect()),
                        values,
                        skip_metadata,
                        page_size,
                        paging_state,
                        serial_consistency: serial,
                        default_timestamp: ts,
                    }
                },
            )
    }

    fn batch() -> impl Strategy<Value = BatchRequest> {
        let entry = (
            prop_oneof![
                text(30).prop_map(BatchQuery::Text),
                bytes(20).prop_map(BatchQuery::Prepared)
            ],
            prop::collection::vec(value(), 0..5),
        )
            .prop_map(|(statement, values)| BatchEntry { statement, values });
        (
            0u8..3,
            prop::collection::vec(entry, 0..6),
            consistency(),
            prop::option::of(consistency()),
            prop::option::of(any::<i64>()),
        )
            .prop_map(
                |(batch_type, entries, consistency, serial, ts)| BatchRequest {
                    batch_type,
                    entries,
                    consistency,
                    serial_consistency: serial,
                    default_timestamp: ts,
                },
            )
    }

    fn event_types() -> impl Strategy<Value = Vec<EventType>> {
        prop::sample::subsequence(
            vec![
                EventType::TopologyChange,
                EventType::StatusChange,
                EventType::SchemaChange,
            ],
            0..=3,
        )
        .prop_shuffle()
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            Just(Request::Options),
            prop::collection::vec(("[A-Z_]{1,12}", "\\PC{0,12}"), 0..5).prop_map(Request::Startup),
            prop::option::of(bytes(30)).prop_map(Request::AuthResponse),
            event_types().prop_map(Request::Register),
            (text(80), params()).prop_map(|(query, params)| Request::Query { query, params }),
            text(80).prop_map(|query| Request::Prepare { query }),
            (bytes(32), params()).prop_map(|(id, params)| Request::Execute { id, params }),
            batch().prop_map(Request::Batch),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn encoded_requests_decode_to_themselves(
            request in request(),
            stream in any::<i16>(),
            compression in compression(),
        ) {
            let mut buf = BytesMut::new();
            request.encode_frame(stream, compression, &mut buf);
            let frame = FrameDecoder::new(MAX as u32).decode(&mut buf).unwrap().unwrap();
            prop_assert!(buf.is_empty(), "one whole frame");
            prop_assert_eq!(frame.header.stream, stream);
            prop_assert_eq!(frame.header.opcode, request.opcode());
            let compressed = frame.header.is_compressed();
            let sent_plain = compression == Compression::None
                || matches!(request, Request::Startup(_) | Request::Options);
            prop_assert_eq!(compressed, !sent_plain);
            prop_assert_eq!(frame.into_request(compression, MAX), Ok(request.clone()));

            // The body alone decodes the same way, and every cut of it is an error or a shorter
            // request, never a panic.
            let mut body = BytesMut::new();
            request.encode_body(&mut body);
            let body = body.freeze();
            let header = crate::frame::FrameHeader {
                version: REQUEST_VERSION,
                flags: 0,
                stream,
                opcode: request.opcode(),
                length: body.len() as u32,
            };
            prop_assert_eq!(decode_request(&header, body.clone()), Ok(request.clone()));
            for cut in 0..body.len() {
                let _ = decode_request(&header, body.slice(..cut));
            }
        }
    }

    #[test]
    fn frames_are_the_bytes_the_spec_lays_out() {
        // QUERY "SELECT 1" at ONE, no flags, on stream 0x0102.
        let frame = Request::query("SELECT 1").to_frame(0x0102);
        let mut want = vec![0x04, 0x00, 0x01, 0x02, 0x07, 0, 0, 0, 15];
        want.extend_from_slice(&[0, 0, 0, 8]);
        want.extend_from_slice(b"SELECT 1");
        want.extend_from_slice(&[0x00, 0x01, 0x00]);
        assert_eq!(&frame[..], &want[..]);

        // EXECUTE of id [7, 7] at QUORUM with one value, a null and an unset, page size 100.
        let frame = Request::Execute {
            id: Bytes::from_static(&[7, 7]),
            params: QueryParameters {
                consistency: Consistency::Quorum,
                values: vec![
                    Value::Set(Bytes::from_static(b"ab")),
                    Value::Null,
                    Value::Unset,
                ],
                page_size: Some(100),
                ..QueryParameters::default()
            },
        }
        .to_frame(-1);
        let body: &[u8] = &[
            0, 2, 7, 7, // id
            0, 4,    // QUORUM
            0x05, // values, page size
            0, 3, 0, 0, 0, 2, b'a', b'b', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0xfe, // values
            0, 0, 0, 100, // page size
        ];
        assert_eq!(&frame[..4], &[0x04, 0x00, 0xff, 0xff]);
        assert_eq!(frame[4], Opcode::Execute as u8);
        assert_eq!(&frame[5..9], &(body.len() as u32).to_be_bytes());
        assert_eq!(&frame[9..], body);

        // STARTUP stays plain even when lz4 is asked for: it is what negotiates it.
        let frame = Request::startup(Compression::Lz4).to_frame(1);
        let mut plain = BytesMut::new();
        Request::startup(Compression::Lz4).encode_frame(1, Compression::Lz4, &mut plain);
        assert_eq!(frame, plain);
        assert_eq!(frame[1], 0);
    }

    #[test]
    fn compressed_frames_carry_the_flag_and_the_compressed_length() {
        let request = Request::query("SELECT * FROM ks.t WHERE k = 1 ".repeat(40));
        for compression in [Compression::Lz4, Compression::Snappy] {
            let mut buf = BytesMut::new();
            request.encode_frame(9, compression, &mut buf);
            assert_eq!(buf[1], FLAG_COMPRESSION);
            let len = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) as usize;
            assert_eq!(len, buf.len() - HEADER_LEN);
            assert!(
                len < request.to_frame(9).len() / 4,
                "{compression:?} shrinks repetition"
            );
        }
    }
}
