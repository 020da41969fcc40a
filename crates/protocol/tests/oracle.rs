//! Property tests against an independent implementation of the protocol, the
//! `cassandra-protocol` crate: requests it encodes must decode with ours to the same fields,
//! and requests and responses we encode must decode with it to the same fields, with and
//! without lz4/snappy compression.

use std::collections::HashMap;
use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use cassandra_protocol::compression::Compression as OCompression;
use cassandra_protocol::consistency::Consistency as OConsistency;
use cassandra_protocol::frame::events::{
    SchemaChangeOptions, SchemaChangeTarget as OTarget, SchemaChangeType as OChangeType,
    ServerEvent, SimpleServerEvent, StatusChangeType, TopologyChangeType,
};
use cassandra_protocol::frame::message_auth_response::BodyReqAuthResponse;
use cassandra_protocol::frame::message_batch::{
    BatchQuery as OBatchQuery, BatchQuerySubj, BatchType, BodyReqBatch,
};
use cassandra_protocol::frame::message_error::{ErrorType, WriteType as OWriteType};
use cassandra_protocol::frame::message_execute::BodyReqExecuteOwned;
use cassandra_protocol::frame::message_options::BodyReqOptions;
use cassandra_protocol::frame::message_prepare::BodyReqPrepare;
use cassandra_protocol::frame::message_query::BodyReqQuery;
use cassandra_protocol::frame::message_register::BodyReqRegister;
use cassandra_protocol::frame::message_request::RequestBody;
use cassandra_protocol::frame::message_response::ResponseBody;
use cassandra_protocol::frame::message_result::{
    ColSpec, ColType, ColTypeOption, ColTypeOptionValue, ResResultBody,
    RowsMetadata as ORowsMetadata,
};
use cassandra_protocol::frame::message_startup::BodyReqStartup;
use cassandra_protocol::frame::{
    Direction, Envelope, Flags, Opcode as OOpcode, Serialize, Version,
};
use cassandra_protocol::query::{QueryParams, QueryValues};
use cassandra_protocol::types::value::Value as OValue;
use cassandra_protocol::types::{CBytes, CBytesShort};
use proptest::prelude::*;
use sluice_protocol::response::{
    encode_auth_success, encode_authenticate, encode_detailed_error, encode_error, encode_event,
    encode_ready, encode_result, encode_supported, Event, StatusChange, TopologyChange,
};
use sluice_protocol::wire::put_bytes;
use sluice_protocol::*;
use sluice_types::{CqlType, NativeType};

const MAX: usize = 1 << 20;

// ---------------------------------------------------------------- strategies

fn consistency() -> impl Strategy<Value = Consistency> {
    (0u16..=10).prop_map(|c| Consistency::from_code(c).unwrap())
}

fn to_oracle_cl(c: Consistency) -> OConsistency {
    OConsistency::try_from(c as i16).unwrap()
}

fn compression() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Lz4),
        Just(Compression::Snappy)
    ]
}

fn to_oracle_compression(c: Compression) -> OCompression {
    match c {
        Compression::None => OCompression::None,
        Compression::Lz4 => OCompression::Lz4,
        Compression::Snappy => OCompression::Snappy,
    }
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => prop::collection::vec(any::<u8>(), 0..40).prop_map(|v| Value::Set(Bytes::from(v))),
        1 => Just(Value::Null),
        1 => Just(Value::Unset),
    ]
}

fn to_oracle_value(v: &Value) -> OValue {
    match v {
        Value::Set(b) => OValue::Some(b.to_vec()),
        Value::Null => OValue::Null,
        Value::Unset => OValue::NotSet,
    }
}

fn ident() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,10}"
}

fn native() -> impl Strategy<Value = NativeType> {
    prop::sample::select(NativeType::ALL.to_vec())
}

fn cql_type() -> impl Strategy<Value = CqlType> {
    native()
        .prop_map(CqlType::Native)
        .prop_recursive(3, 24, 3, |inner| {
            prop_oneof![
                inner.clone().prop_map(|t| CqlType::List(Box::new(t))),
                inner.clone().prop_map(|t| CqlType::Set(Box::new(t))),
                (inner.clone(), inner.clone())
                    .prop_map(|(k, v)| CqlType::Map(Box::new(k), Box::new(v))),
                prop::collection::vec(inner.clone(), 1..4).prop_map(CqlType::Tuple),
                inner.clone().prop_map(|t| CqlType::Frozen(Box::new(t))),
                (
                    ident(),
                    ident(),
                    prop::collection::vec((ident(), inner), 1..4)
                )
                    .prop_map(|(keyspace, name, fields)| CqlType::Udt {
                        keyspace,
                        name,
                        fields
                    }),
            ]
        })
}

fn column_specs(max: usize) -> impl Strategy<Value = Vec<ColumnSpec>> {
    // Either all in one table (global spec) or spread over a few tables.
    (
        any::<bool>(),
        prop::collection::vec((ident(), ident(), ident(), cql_type()), 0..max),
    )
        .prop_map(|(same_table, cols)| {
            cols.into_iter()
                .map(|(ks, t, name, ty)| ColumnSpec {
                    keyspace: if same_table { "ks".into() } else { ks },
                    table: if same_table { "tbl".into() } else { t },
                    name,
                    ty,
                })
                .collect()
        })
}

// ---------------------------------------------------------------- helpers

/// Frames an oracle-encoded request body and decodes it with our decoder, feeding the bytes
/// in the given chunk sizes.
fn decode_ours(
    opcode: OOpcode,
    body: Vec<u8>,
    stream: i16,
    compression: Compression,
    chunks: &[usize],
) -> Request {
    let envelope = Envelope::new(
        Version::V4,
        Direction::Request,
        Flags::empty(),
        opcode,
        stream,
        body,
        None,
        vec![],
    );
    // STARTUP is never compressed.
    let oc = if opcode == OOpcode::Startup {
        OCompression::None
    } else {
        to_oracle_compression(compression)
    };
    let raw = envelope.encode_with(oc).unwrap();
    let mut dec = FrameDecoder::new(MAX as u32);
    let mut buf = BytesMut::new();
    let mut rest = &raw[..];
    let mut chunk_iter = chunks.iter().cycle();
    let frame = loop {
        if let Some(f) = dec.decode(&mut buf).unwrap() {
            break f;
        }
        assert!(!rest.is_empty(), "decoder wants more than the frame");
        let n = (*chunk_iter.next().unwrap()).clamp(1, rest.len());
        buf.extend_from_slice(&rest[..n]);
        rest = &rest[n..];
    };
    assert!(rest.is_empty() && buf.is_empty());
    assert_eq!(frame.header.stream, stream);
    frame.into_request(compression, MAX).unwrap()
}

/// Parses one of our response frames with the oracle and checks the envelope fields.
fn parse_oracle(raw: &[u8], stream: i16, opcode: OOpcode, c: Compression) -> ResponseBody {
    let parsed = Envelope::from_buffer(raw, to_oracle_compression(c)).unwrap();
    assert_eq!(parsed.envelope_len, raw.len());
    let env = parsed.envelope;
    assert_eq!(env.version, Version::V4);
    assert_eq!(env.direction, Direction::Response);
    assert_eq!(env.stream_id, stream);
    assert_eq!(env.opcode, opcode);
    env.response_body().unwrap()
}

fn strip_frozen(t: &CqlType) -> CqlType {
    match t {
        CqlType::Native(n) => CqlType::Native(*n),
        CqlType::List(t) => CqlType::List(Box::new(strip_frozen(t))),
        CqlType::Set(t) => CqlType::Set(Box::new(strip_frozen(t))),
        CqlType::Map(k, v) => CqlType::Map(Box::new(strip_frozen(k)), Box::new(strip_frozen(v))),
        CqlType::Tuple(ts) => CqlType::Tuple(ts.iter().map(strip_frozen).collect()),
        CqlType::Frozen(t) => strip_frozen(t),
        CqlType::Udt {
            keyspace,
            name,
            fields,
        } => CqlType::Udt {
            keyspace: keyspace.clone(),
            name: name.clone(),
            fields: fields
                .iter()
                .map(|(n, t)| (n.clone(), strip_frozen(t)))
                .collect(),
        },
    }
}

fn from_oracle_type(o: &ColTypeOption) -> CqlType {
    use NativeType as N;
    let boxed = |v: &ColTypeOption| Box::new(from_oracle_type(v));
    let native = |n| CqlType::Native(n);
    match (o.id, &o.value) {
        (ColType::List, Some(ColTypeOptionValue::CList(t))) => CqlType::List(boxed(t)),
        (ColType::Set, Some(ColTypeOptionValue::CSet(t))) => CqlType::Set(boxed(t)),
        (ColType::Map, Some(ColTypeOptionValue::CMap(k, v))) => CqlType::Map(boxed(k), boxed(v)),
        (ColType::Tuple, Some(ColTypeOptionValue::TupleType(t))) => {
            CqlType::Tuple(t.types.iter().map(from_oracle_type).collect())
        }
        (ColType::Udt, Some(ColTypeOptionValue::UdtType(u))) => CqlType::Udt {
            keyspace: u.ks.clone(),
            name: u.udt_name.clone(),
            fields: u
                .descriptions
                .iter()
                .map(|(n, t)| (n.clone(), from_oracle_type(t)))
                .collect(),
        },
        (ColType::Ascii, _) => native(N::Ascii),
        (ColType::Bigint, _) => native(N::Bigint),
        (ColType::Blob, _) => native(N::Blob),
        (ColType::Boolean, _) => native(N::Boolean),
        (ColType::Counter, _) => native(N::Counter),
        (ColType::Decimal, _) => native(N::Decimal),
        (ColType::Double, _) => native(N::Double),
        (ColType::Float, _) => native(N::Float),
        (ColType::Int, _) => native(N::Int),
        (ColType::Timestamp, _) => native(N::Timestamp),
        (ColType::Uuid, _) => native(N::Uuid),
        (ColType::Varchar, _) => native(N::Text),
        (ColType::Varint, _) => native(N::Varint),
        (ColType::Timeuuid, _) => native(N::Timeuuid),
        (ColType::Inet, _) => native(N::Inet),
        (ColType::Date, _) => native(N::Date),
        (ColType::Time, _) => native(N::Time),
        (ColType::Smallint, _) => native(N::Smallint),
        (ColType::Tinyint, _) => native(N::Tinyint),
        (ColType::Duration, _) => native(N::Duration),
        other => panic!("unexpected oracle type {other:?}"),
    }
}

/// Checks oracle column specs against ours, including where the table spec came from.
fn check_specs(
    ours: &[ColumnSpec],
    global: Option<&cassandra_protocol::frame::message_result::TableSpec>,
    theirs: &[ColSpec],
) {
    assert_eq!(ours.len(), theirs.len());
    let all_same = ours
        .iter()
        .all(|c| c.keyspace == ours[0].keyspace && c.table == ours[0].table);
    assert_eq!(global.is_some(), !ours.is_empty() && all_same);
    for (o, t) in ours.iter().zip(theirs) {
        let spec = global.or(t.table_spec.as_ref()).unwrap();
        assert_eq!(spec.ks_name, o.keyspace);
        assert_eq!(spec.table_name, o.table);
        assert_eq!(t.name, o.name);
        assert_eq!(from_oracle_type(&t.col_type), strip_frozen(&o.ty));
    }
}

fn check_rows_metadata(ours: &RowsMetadata, theirs: &ORowsMetadata) {
    use cassandra_protocol::frame::message_result::RowsMetadataFlags as F;
    assert_eq!(theirs.flags.contains(F::NO_METADATA), ours.no_metadata);
    assert_eq!(
        theirs.flags.contains(F::HAS_MORE_PAGES),
        ours.paging_state.is_some()
    );
    assert_eq!(
        theirs.paging_state.as_ref().and_then(|p| p.as_slice()),
        ours.paging_state.as_deref()
    );
    if ours.no_metadata {
        assert_eq!(theirs.columns_count as usize, ours.column_count);
        assert!(theirs.col_specs.is_empty());
    } else {
        assert_eq!(theirs.columns_count as usize, ours.columns.len());
        check_specs(
            &ours.columns,
            theirs.global_table_spec.as_ref(),
            &theirs.col_specs,
        );
    }
}

// ---------------------------------------------------------------- requests

#[derive(Debug, Clone)]
struct Params {
    consistency: Consistency,
    values: Option<Vec<Value>>,
    named: bool,
    page_size: Option<i32>,
    paging_state: Option<Vec<u8>>,
    serial: Option<Consistency>,
    timestamp: Option<i64>,
}

fn params() -> impl Strategy<Value = Params> {
    (
        consistency(),
        prop::option::of(prop::collection::vec(value(), 0..8)),
        any::<bool>(),
        prop::option::of(any::<i32>()),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
        prop::option::of(prop_oneof![
            Just(Consistency::Serial),
            Just(Consistency::LocalSerial)
        ]),
        prop::option::of(any::<i64>()),
    )
        .prop_map(
            |(consistency, values, named, page_size, paging_state, serial, timestamp)| Params {
                consistency,
                values,
                named,
                page_size,
                paging_state,
                serial,
                timestamp,
            },
        )
}

impl Params {
    fn names(&self) -> Vec<String> {
        let n = self.values.as_ref().map_or(0, Vec::len);
        (0..n).map(|i| format!("n{i}")).collect()
    }

    fn to_oracle(&self) -> QueryParams {
        let values = self.values.as_ref().map(|vs| {
            if self.named {
                QueryValues::NamedValues(
                    self.names()
                        .into_iter()
                        .zip(vs.iter().map(to_oracle_value))
                        .collect::<HashMap<_, _>>(),
                )
            } else {
                QueryValues::SimpleValues(vs.iter().map(to_oracle_value).collect())
            }
        });
        QueryParams {
            consistency: to_oracle_cl(self.consistency),
            with_names: self.named && self.values.is_some(),
            values,
            page_size: self.page_size,
            paging_state: self.paging_state.clone().map(CBytes::new),
            serial_consistency: self.serial.map(to_oracle_cl),
            timestamp: self.timestamp,
            keyspace: None,
            now_in_seconds: None,
        }
    }

    fn check(&self, got: &QueryParameters) {
        assert_eq!(got.consistency, self.consistency);
        assert_eq!(got.page_size, self.page_size);
        assert_eq!(got.paging_state.as_deref(), self.paging_state.as_deref());
        assert_eq!(got.serial_consistency, self.serial);
        assert_eq!(got.default_timestamp, self.timestamp);
        assert!(!got.skip_metadata);
        let want = self.values.clone().unwrap_or_default();
        if self.named && self.values.is_some() {
            // The oracle sends names in hash-map order: compare as a map.
            let names = got.names.as_ref().expect("names");
            assert_eq!(names.len(), got.values.len());
            let got_map: HashMap<_, _> = names.iter().cloned().zip(got.values.clone()).collect();
            let want_map: HashMap<_, _> = self.names().into_iter().zip(want).collect();
            assert_eq!(got_map, want_map);
        } else {
            assert_eq!(got.names, None);
            assert_eq!(got.values, want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn query_from_oracle(
        query in "\\PC{0,60}",
        p in params(),
        stream in 0i16..=i16::MAX,
        c in compression(),
        chunks in prop::collection::vec(1usize..64, 1..4),
    ) {
        let body = RequestBody::Query(BodyReqQuery { query: query.clone(), query_params: p.to_oracle() })
            .serialize_to_vec(Version::V4);
        match decode_ours(OOpcode::Query, body, stream, c, &chunks) {
            Request::Query { query: q, params } => {
                prop_assert_eq!(&q[..], query.as_bytes());
                p.check(&params);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn execute_from_oracle(
        id in prop::collection::vec(any::<u8>(), 0..32),
        p in params(),
        stream in 0i16..=i16::MAX,
        c in compression(),
        chunks in prop::collection::vec(1usize..64, 1..4),
    ) {
        let body = RequestBody::Execute(BodyReqExecuteOwned {
            id: CBytesShort::new(id.clone()),
            result_metadata_id: None,
            query_parameters: p.to_oracle(),
        })
        .serialize_to_vec(Version::V4);
        match decode_ours(OOpcode::Execute, body, stream, c, &chunks) {
            Request::Execute { id: got, params } => {
                prop_assert_eq!(&got[..], &id[..]);
                p.check(&params);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn batch_from_oracle(
        kind in 0u8..3,
        entries in prop::collection::vec(
            (any::<bool>(), "\\PC{0,30}", prop::collection::vec(any::<u8>(), 0..20),
             prop::collection::vec(value(), 0..5)),
            0..6),
        cl in consistency(),
        serial in prop::option::of(Just(Consistency::LocalSerial)),
        ts in prop::option::of(any::<i64>()),
        c in compression(),
    ) {
        let batch_type = match kind { 0 => BatchType::Logged, 1 => BatchType::Unlogged, _ => BatchType::Counter };
        let queries = entries.iter().map(|(prepared, text, id, vals)| OBatchQuery {
            subject: if *prepared {
                BatchQuerySubj::PreparedId(CBytesShort::new(id.clone()))
            } else {
                BatchQuerySubj::QueryString(text.clone())
            },
            values: QueryValues::SimpleValues(vals.iter().map(to_oracle_value).collect()),
        }).collect();
        let body = RequestBody::Batch(BodyReqBatch {
            batch_type,
            queries,
            consistency: to_oracle_cl(cl),
            serial_consistency: serial.map(to_oracle_cl),
            timestamp: ts,
            keyspace: None,
            now_in_seconds: None,
        }).serialize_to_vec(Version::V4);
        let Request::Batch(b) = decode_ours(OOpcode::Batch, body, 1, c, &[1000]) else {
            panic!("not a batch")
        };
        prop_assert_eq!(b.batch_type, kind);
        prop_assert_eq!(b.consistency, cl);
        prop_assert_eq!(b.serial_consistency, serial);
        prop_assert_eq!(b.default_timestamp, ts);
        prop_assert_eq!(b.entries.len(), entries.len());
        for (got, (prepared, text, id, vals)) in b.entries.iter().zip(&entries) {
            match &got.statement {
                BatchQuery::Prepared(g) => { prop_assert!(*prepared); prop_assert_eq!(&g[..], &id[..]); }
                BatchQuery::Text(g) => { prop_assert!(!*prepared); prop_assert_eq!(&g[..], text.as_bytes()); }
            }
            prop_assert_eq!(&got.values, vals);
        }
    }

    #[test]
    fn startup_prepare_register_auth_options_from_oracle(
        opts in prop::collection::hash_map("[A-Z_]{1,12}", "\\PC{0,12}", 0..6),
        query in "\\PC{0,80}",
        events in prop::collection::vec(0u8..3, 0..4),
        token in prop::option::of(prop::collection::vec(any::<u8>(), 0..30)),
        c in compression(),
    ) {
        let body = RequestBody::Startup(BodyReqStartup { map: opts.clone() }).serialize_to_vec(Version::V4);
        let Request::Startup(got) = decode_ours(OOpcode::Startup, body, 0, Compression::None, &[7]) else { panic!() };
        prop_assert_eq!(got.into_iter().collect::<HashMap<_, _>>(), opts);

        let body = RequestBody::Prepare(BodyReqPrepare { query: query.clone(), keyspace: None })
            .serialize_to_vec(Version::V4);
        let got = decode_ours(OOpcode::Prepare, body, 3, c, &[5]);
        prop_assert_eq!(got, Request::Prepare { query: Bytes::from(query.clone()) });

        let oevents: Vec<_> = events.iter().map(|e| match e {
            0 => SimpleServerEvent::TopologyChange,
            1 => SimpleServerEvent::StatusChange,
            _ => SimpleServerEvent::SchemaChange,
        }).collect();
        let body = RequestBody::Register(BodyReqRegister { events: oevents }).serialize_to_vec(Version::V4);
        let Request::Register(got) = decode_ours(OOpcode::Register, body, 3, c, &[5]) else { panic!() };
        let mut want: Vec<EventType> = Vec::new();
        for e in &events {
            let t = match e { 0 => EventType::TopologyChange, 1 => EventType::StatusChange, _ => EventType::SchemaChange };
            if !want.contains(&t) { want.push(t); }
        }
        prop_assert_eq!(got, want);

        let body = RequestBody::AuthResponse(BodyReqAuthResponse {
            data: token.clone().map_or_else(CBytes::new_null, CBytes::new),
        }).serialize_to_vec(Version::V4);
        let got = decode_ours(OOpcode::AuthResponse, body, 2, c, &[3]);
        prop_assert_eq!(got, Request::AuthResponse(token.map(Bytes::from)));

        let body = RequestBody::Options(BodyReqOptions).serialize_to_vec(Version::V4);
        prop_assert_eq!(decode_ours(OOpcode::Options, body, 2, c, &[3]), Request::Options);
    }
}

// ---------------------------------------------------------------- responses

// ---------------------------------------------------------------- requests we encode

impl Params {
    /// The same parameters as our request type.
    fn ours(&self) -> QueryParameters {
        QueryParameters {
            consistency: self.consistency,
            names: (self.named && self.values.is_some()).then(|| self.names()),
            values: self.values.clone().unwrap_or_default(),
            skip_metadata: false,
            page_size: self.page_size,
            paging_state: self.paging_state.clone().map(Bytes::from),
            serial_consistency: self.serial,
            default_timestamp: self.timestamp,
        }
    }

    /// What the oracle should read from our encoding: an empty positional list is sent
    /// without the values flag, which reads as no values at all.
    fn oracle_reads(&self) -> QueryParams {
        let mut q = self.to_oracle();
        if !q.with_names && self.values.as_ref().is_some_and(Vec::is_empty) {
            q.values = None;
        }
        q
    }
}

/// Encodes `request` with our codec and decodes it with the oracle, checking the envelope.
fn oracle_reads_ours(request: &Request, stream: i16, c: Compression) -> RequestBody {
    let mut buf = BytesMut::from(&b"??"[..]);
    request.encode_frame(stream, c, &mut buf);
    assert_eq!(&buf[..2], b"??", "encoders append");
    let raw = &buf[2..];
    let sent_plain = matches!(request, Request::Startup(_) | Request::Options);
    let oc = if sent_plain {
        OCompression::None
    } else {
        to_oracle_compression(c)
    };
    let parsed = Envelope::from_buffer(raw, oc).unwrap();
    assert_eq!(parsed.envelope_len, raw.len());
    let env = parsed.envelope;
    assert_eq!(env.version, Version::V4);
    assert_eq!(env.direction, Direction::Request);
    assert_eq!(env.stream_id, stream);
    assert_eq!(
        env.flags.contains(Flags::COMPRESSION),
        !sent_plain && c != Compression::None
    );
    env.request_body().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn query_to_oracle(query in "\\PC{0,60}", p in params(), stream in 0i16..=i16::MAX, c in compression()) {
        let ours = Request::Query { query: Bytes::from(query.clone()), params: p.ours() };
        let RequestBody::Query(got) = oracle_reads_ours(&ours, stream, c) else { panic!("not a QUERY") };
        prop_assert_eq!(got, BodyReqQuery { query, query_params: p.oracle_reads() });
    }

    #[test]
    fn execute_to_oracle(id in prop::collection::vec(any::<u8>(), 0..32), p in params(), stream in 0i16..=i16::MAX, c in compression()) {
        let ours = Request::Execute { id: Bytes::from(id.clone()), params: p.ours() };
        let RequestBody::Execute(got) = oracle_reads_ours(&ours, stream, c) else { panic!("not an EXECUTE") };
        prop_assert_eq!(got, BodyReqExecuteOwned {
            id: CBytesShort::new(id),
            result_metadata_id: None,
            query_parameters: p.oracle_reads(),
        });
    }

    #[test]
    fn batch_to_oracle(
        kind in 0u8..3,
        entries in prop::collection::vec(
            (any::<bool>(), "\\PC{0,30}", prop::collection::vec(any::<u8>(), 0..20),
             prop::collection::vec(value(), 0..5)),
            0..6),
        cl in consistency(),
        serial in prop::option::of(Just(Consistency::LocalSerial)),
        ts in prop::option::of(any::<i64>()),
        c in compression(),
    ) {
        let ours = Request::Batch(BatchRequest {
            batch_type: kind,
            entries: entries.iter().map(|(prepared, text, id, values)| BatchEntry {
                statement: if *prepared {
                    BatchQuery::Prepared(Bytes::from(id.clone()))
                } else {
                    BatchQuery::Text(Bytes::from(text.clone()))
                },
                values: values.clone(),
            }).collect(),
            consistency: cl,
            serial_consistency: serial,
            default_timestamp: ts,
        });
        let RequestBody::Batch(got) = oracle_reads_ours(&ours, 7, c) else { panic!("not a BATCH") };
        let batch_type = match kind { 0 => BatchType::Logged, 1 => BatchType::Unlogged, _ => BatchType::Counter };
        let queries = entries.iter().map(|(prepared, text, id, vals)| OBatchQuery {
            subject: if *prepared {
                BatchQuerySubj::PreparedId(CBytesShort::new(id.clone()))
            } else {
                BatchQuerySubj::QueryString(text.clone())
            },
            values: QueryValues::SimpleValues(vals.iter().map(to_oracle_value).collect()),
        }).collect();
        prop_assert_eq!(got, BodyReqBatch {
            batch_type,
            queries,
            consistency: to_oracle_cl(cl),
            serial_consistency: serial.map(to_oracle_cl),
            timestamp: ts,
            keyspace: None,
            now_in_seconds: None,
        });
    }

    #[test]
    fn startup_prepare_register_auth_options_to_oracle(
        opts in prop::collection::hash_map("[A-Z_]{1,12}", "\\PC{0,12}", 0..6),
        query in "\\PC{0,80}",
        events in prop::sample::subsequence(vec![0u8, 1, 2], 0..=3),
        token in prop::option::of(prop::collection::vec(any::<u8>(), 0..30)),
        c in compression(),
    ) {
        let startup = Request::Startup(opts.clone().into_iter().collect());
        let RequestBody::Startup(got) = oracle_reads_ours(&startup, 0, c) else { panic!() };
        prop_assert_eq!(got.map, opts);

        let prepare = Request::Prepare { query: Bytes::from(query.clone()) };
        let RequestBody::Prepare(got) = oracle_reads_ours(&prepare, 3, c) else { panic!() };
        prop_assert_eq!(got, BodyReqPrepare { query, keyspace: None });

        let ours: Vec<EventType> = events.iter().map(|e| match e {
            0 => EventType::TopologyChange, 1 => EventType::StatusChange, _ => EventType::SchemaChange,
        }).collect();
        let RequestBody::Register(got) = oracle_reads_ours(&Request::Register(ours), 3, c) else { panic!() };
        let want: Vec<_> = events.iter().map(|e| match e {
            0 => SimpleServerEvent::TopologyChange,
            1 => SimpleServerEvent::StatusChange,
            _ => SimpleServerEvent::SchemaChange,
        }).collect();
        prop_assert_eq!(got.events, want);

        let auth = Request::AuthResponse(token.clone().map(Bytes::from));
        let RequestBody::AuthResponse(got) = oracle_reads_ours(&auth, 2, c) else { panic!() };
        prop_assert_eq!(got.data, token.map_or_else(CBytes::new_null, CBytes::new));

        prop_assert!(matches!(oracle_reads_ours(&Request::Options, 2, c), RequestBody::Options(_)));
    }
}

fn rows_metadata(max_cols: usize) -> impl Strategy<Value = RowsMetadata> {
    (
        column_specs(max_cols),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
        any::<bool>(),
        0usize..5,
    )
        .prop_map(|(columns, paging, no_metadata, hidden)| {
            let column_count = if no_metadata { hidden } else { columns.len() };
            RowsMetadata {
                columns: if no_metadata {
                    vec![].into()
                } else {
                    columns.into()
                },
                column_count,
                paging_state: paging.map(Bytes::from),
                no_metadata,
            }
        })
}

/// A predicate on the oracle's decoded error.
type ErrorCheck = Box<dyn Fn(&ErrorType) -> bool>;

fn encoded(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
    // Some unrelated bytes first: encoders must append, not overwrite.
    let mut buf = BytesMut::from(&b"??"[..]);
    f(&mut buf);
    assert_eq!(&buf[..2], b"??");
    buf[2..].to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn rows_to_oracle(
        meta in rows_metadata(5),
        cells in prop::collection::vec(prop::option::of(prop::collection::vec(any::<u8>(), 0..200)), 0..60),
        stream in any::<i16>(),
        c in compression(),
    ) {
        let cols = meta.column_count;
        let row_count = cells.len().checked_div(cols).unwrap_or(0);
        let mut body = BytesMut::new();
        for cell in cells.iter().take(row_count * cols) {
            put_bytes(&mut body, cell.as_deref());
        }
        let rows = Rows { metadata: meta.clone(), row_count: row_count as u32, body: body.freeze() };
        let raw = encoded(|b| encode_result(b, stream, &ResultMessage::Rows(rows), c));
        let ResponseBody::Result(ResResultBody::Rows(r)) = parse_oracle(&raw, stream, OOpcode::Result, c) else {
            panic!("not rows")
        };
        check_rows_metadata(&meta, &r.metadata);
        prop_assert_eq!(r.rows_count as usize, row_count);
        let got: Vec<Option<Vec<u8>>> = r.rows_content.into_iter().flatten().map(|b| b.into_bytes()).collect();
        prop_assert_eq!(&got[..], &cells[..row_count * cols]);
    }

    #[test]
    fn prepared_to_oracle(
        id in prop::collection::vec(any::<u8>(), 16),
        binds in column_specs(6),
        pk in prop::collection::vec(0u16..10, 0..3),
        lwt in any::<bool>(),
        result in rows_metadata(4),
        stream in any::<i16>(),
        c in compression(),
    ) {
        let result = RowsMetadata { paging_state: None, ..result };
        let msg = ResultMessage::Prepared {
            id: Bytes::from(id.clone()),
            metadata: PreparedMetadata { columns: binds.clone(), pk_indexes: pk.clone(), lwt },
            result_metadata: result.clone(),
        };
        let raw = encoded(|b| encode_result(b, stream, &msg, c));
        let ResponseBody::Result(ResResultBody::Prepared(p)) = parse_oracle(&raw, stream, OOpcode::Result, c) else {
            panic!("not prepared")
        };
        prop_assert_eq!(p.id.into_bytes().unwrap(), id);
        prop_assert_eq!(p.metadata.pk_indexes, pk.iter().map(|&i| i as i16).collect::<Vec<_>>());
        check_specs(&binds, p.metadata.global_table_spec.as_ref(), &p.metadata.col_specs);
        check_rows_metadata(&result, &p.result_metadata);
        // The LWT bit is the top bit of the bind metadata flags, right after the id.
        let flags_at = 9 + 4 + 2 + 16;
        if c == Compression::None {
            prop_assert_eq!(raw[flags_at] & 0x80 != 0, lwt);
        }
    }

    #[test]
    fn void_keyspace_schema_change_to_oracle(
        ks in ident(),
        t in ident(),
        change in 0u8..3,
        target in 0u8..3,
        stream in any::<i16>(),
        c in compression(),
    ) {
        let raw = encoded(|b| encode_result(b, stream, &ResultMessage::Void, c));
        prop_assert_eq!(parse_oracle(&raw, stream, OOpcode::Result, c), ResponseBody::Result(ResResultBody::Void));

        let raw = encoded(|b| encode_result(b, stream, &ResultMessage::SetKeyspace(ks.clone()), c));
        let ResponseBody::Result(ResResultBody::SetKeyspace(s)) = parse_oracle(&raw, stream, OOpcode::Result, c) else { panic!() };
        prop_assert_eq!(s.body, ks.clone());

        let (ct, oct) = match change {
            0 => (SchemaChangeType::Created, OChangeType::Created),
            1 => (SchemaChangeType::Updated, OChangeType::Updated),
            _ => (SchemaChangeType::Dropped, OChangeType::Dropped),
        };
        let (tg, otg, oopts) = match target {
            0 => (SchemaChangeTarget::Keyspace(ks.clone()), OTarget::Keyspace, SchemaChangeOptions::Keyspace(ks.clone())),
            1 => (SchemaChangeTarget::Table(ks.clone(), t.clone()), OTarget::Table, SchemaChangeOptions::TableType(ks.clone(), t.clone())),
            _ => (SchemaChangeTarget::Type(ks.clone(), t.clone()), OTarget::Type, SchemaChangeOptions::TableType(ks.clone(), t.clone())),
        };
        let sc = SchemaChange { change: ct, target: tg };
        let raw = encoded(|b| encode_result(b, stream, &ResultMessage::SchemaChange(sc.clone()), c));
        let ResponseBody::Result(ResResultBody::SchemaChange(o)) = parse_oracle(&raw, stream, OOpcode::Result, c) else { panic!() };
        prop_assert_eq!((o.change_type, o.target, o.options.clone()), (oct, otg, oopts.clone()));

        let raw = encoded(|b| encode_event(b, &Event::SchemaChange(sc), c));
        let ResponseBody::Event(e) = parse_oracle(&raw, -1, OOpcode::Event, c) else { panic!() };
        let ServerEvent::SchemaChange(o) = e.event else { panic!() };
        prop_assert_eq!((o.change_type, o.target, o.options), (oct, otg, oopts));
    }

    #[test]
    fn events_to_oracle(
        ip in prop_oneof![any::<[u8; 4]>().prop_map(std::net::IpAddr::from), any::<[u8; 16]>().prop_map(std::net::IpAddr::from)],
        port in any::<u16>(),
        kind in 0u8..4,
        c in compression(),
    ) {
        let addr = SocketAddr::new(ip, port);
        let ev = match kind {
            0 => Event::StatusChange(StatusChange::Up(addr)),
            1 => Event::StatusChange(StatusChange::Down(addr)),
            2 => Event::TopologyChange(TopologyChange::NewNode(addr)),
            _ => Event::TopologyChange(TopologyChange::RemovedNode(addr)),
        };
        let raw = encoded(|b| encode_event(b, &ev, c));
        let ResponseBody::Event(e) = parse_oracle(&raw, -1, OOpcode::Event, c) else { panic!() };
        match (kind, e.event) {
            (0, ServerEvent::StatusChange(s)) => prop_assert_eq!((s.change_type, s.addr), (StatusChangeType::Up, addr)),
            (1, ServerEvent::StatusChange(s)) => prop_assert_eq!((s.change_type, s.addr), (StatusChangeType::Down, addr)),
            (2, ServerEvent::TopologyChange(s)) => prop_assert_eq!((s.change_type, s.addr), (TopologyChangeType::NewNode, addr)),
            (3, ServerEvent::TopologyChange(s)) => prop_assert_eq!((s.change_type, s.addr), (TopologyChangeType::RemovedNode, addr)),
            (k, other) => prop_assert!(false, "{} {:?}", k, other),
        }
    }

    #[test]
    fn errors_to_oracle(
        cl in consistency(),
        a in any::<i32>(),
        b in any::<i32>(),
        present in any::<bool>(),
        // CAS is left out: the oracle reads v5's `<contentions>` after CAS even on v4, where
        // the v4 spec (and Sluice) has no such field.
        wt in 0u8..5,
        id in prop::collection::vec(any::<u8>(), 0..=16),
        ks in ident(),
        table in "[a-z]{0,8}",
        msg in "\\PC{0,40}",
        stream in any::<i16>(),
        c in compression(),
    ) {
        let write_type = [WriteType::Simple, WriteType::Batch, WriteType::UnloggedBatch, WriteType::Counter, WriteType::BatchLog, WriteType::Cas][wt as usize];
        let owt = [OWriteType::Simple, OWriteType::Batch, OWriteType::UnloggedBatch, OWriteType::Counter, OWriteType::BatchLog, OWriteType::Cas][wt as usize].clone();
        let cases: Vec<(ErrorResponse, ErrorCheck)> = vec![
            (ErrorResponse::new(DbError::Overloaded, "o"), Box::new(|t| matches!(t, ErrorType::Overloaded))),
            (ErrorResponse::new(DbError::ServerError, "o"), Box::new(|t| matches!(t, ErrorType::Server))),
            (ErrorResponse::new(DbError::ProtocolError, "o"), Box::new(|t| matches!(t, ErrorType::Protocol))),
            (ErrorResponse::new(DbError::SyntaxError, "o"), Box::new(|t| matches!(t, ErrorType::Syntax))),
            (ErrorResponse::new(DbError::Invalid, "o"), Box::new(|t| matches!(t, ErrorType::Invalid))),
            (ErrorResponse::new(DbError::ConfigError, "o"), Box::new(|t| matches!(t, ErrorType::Config))),
            (ErrorResponse::new(DbError::BadCredentials, "o"), Box::new(|t| matches!(t, ErrorType::Authentication))),
            (ErrorResponse::new(DbError::Unauthorized, "o"), Box::new(|t| matches!(t, ErrorType::Unauthorized))),
            (ErrorResponse::new(DbError::IsBootstrapping, "o"), Box::new(|t| matches!(t, ErrorType::IsBootstrapping))),
            (ErrorResponse::new(DbError::TruncateError, "o"), Box::new(|t| matches!(t, ErrorType::Truncate))),
            (ErrorResponse::new(DbError::ReadFailure, "o"), Box::new(|t| matches!(t, ErrorType::ReadFailure(_)))),
            (ErrorResponse::new(DbError::WriteFailure, "o"), Box::new(|t| matches!(t, ErrorType::WriteFailure(_)))),
            (ErrorResponse::new(DbError::FunctionFailure, "o"), Box::new(|t| matches!(t, ErrorType::FunctionFailure(_)))),
            (
                ErrorResponse { error: DbError::Unavailable { consistency: cl, required: a, alive: b }, message: "u" },
                Box::new(move |t| matches!(t, ErrorType::Unavailable(e) if e.cl == to_oracle_cl(cl) && e.required == a && e.alive == b)),
            ),
            (
                ErrorResponse { error: DbError::WriteTimeout { consistency: cl, received: a, block_for: b, write_type }, message: "w" },
                Box::new(move |t| matches!(t, ErrorType::WriteTimeout(e) if e.cl == to_oracle_cl(cl) && e.received == a && e.block_for == b && e.write_type == owt)),
            ),
            (
                ErrorResponse { error: DbError::ReadTimeout { consistency: cl, received: a, block_for: b, data_present: present }, message: "r" },
                Box::new(move |t| matches!(t, ErrorType::ReadTimeout(e) if e.cl == to_oracle_cl(cl) && e.received == a && e.block_for == b && e.replica_has_responded() == present)),
            ),
            (
                sluice_protocol::response::unprepared_error(&id),
                Box::new({ let id = id.clone(); move |t| matches!(t, ErrorType::Unprepared(e) if e.id.clone().into_bytes() == Some(id.clone())) }),
            ),
        ];
        for (e, check) in cases {
            let raw = encoded(|buf| encode_error(buf, stream, &e, c));
            let ResponseBody::Error(body) = parse_oracle(&raw, stream, OOpcode::Error, c) else { panic!() };
            prop_assert_eq!(body.message.as_str(), e.message);
            prop_assert!(check(&body.ty), "{:?} -> {:?}", e, body.ty);
        }
        // Pre-encoded templates, including the Config_error rate-limit fallback.
        let pre = PreencodedErrors::new();
        for (t, ok) in [
            (&pre.overloaded, (|t: &ErrorType| matches!(t, ErrorType::Overloaded)) as fn(&ErrorType) -> bool),
            (&pre.write_timeout, |t| matches!(t, ErrorType::WriteTimeout(e) if e.write_type == OWriteType::Simple && e.received == 0 && e.block_for == 1)),
            (&pre.read_timeout, |t| matches!(t, ErrorType::ReadTimeout(e) if !e.replica_has_responded() && e.received == 0 && e.block_for == 1)),
            (&pre.rate_limit_read_config, |t| matches!(t, ErrorType::Config)),
            (&pre.rate_limit_write_config, |t| matches!(t, ErrorType::Config)),
        ] {
            let raw = encoded(|buf| {
                t.append(buf, stream);
            });
            let ResponseBody::Error(body) = parse_oracle(&raw, stream, OOpcode::Error, Compression::None) else { panic!() };
            prop_assert!(ok(&body.ty), "{:?}", body.ty);
        }
        // Detailed errors: owned message and Already_exists.
        let d = DetailedError::already_exists(ks.clone(), table.clone(), msg.clone());
        let raw = encoded(|buf| encode_detailed_error(buf, stream, &d, c));
        let ResponseBody::Error(body) = parse_oracle(&raw, stream, OOpcode::Error, c) else { panic!() };
        prop_assert_eq!(body.message, msg);
        let ErrorType::AlreadyExists(ae) = body.ty else { panic!() };
        prop_assert_eq!((ae.ks, ae.table), (ks, table));
    }

    #[test]
    fn handshake_responses_to_oracle(
        opts in prop::collection::vec(("[A-Z_]{1,10}", prop::collection::vec("[a-z0-9./=]{0,10}", 0..4)), 0..6),
        token in prop::option::of(prop::collection::vec(any::<u8>(), 0..20)),
        class in "[a-zA-Z.]{1,60}",
        stream in any::<i16>(),
        c in compression(),
    ) {
        let raw = encoded(|b| encode_ready(b, stream));
        prop_assert_eq!(parse_oracle(&raw, stream, OOpcode::Ready, Compression::None), ResponseBody::Ready);

        let raw = encoded(|b| encode_supported(b, stream, &opts));
        let ResponseBody::Supported(s) = parse_oracle(&raw, stream, OOpcode::Supported, Compression::None) else { panic!() };
        let want: HashMap<String, Vec<String>> = opts.iter().cloned().collect();
        prop_assert_eq!(s.data, want);

        let raw = encoded(|b| encode_authenticate(b, stream, &class));
        let ResponseBody::Authenticate(a) = parse_oracle(&raw, stream, OOpcode::Authenticate, Compression::None) else { panic!() };
        prop_assert_eq!(a.data, class);

        let raw = encoded(|b| encode_auth_success(b, stream, token.as_deref(), c));
        let ResponseBody::AuthSuccess(a) = parse_oracle(&raw, stream, OOpcode::AuthSuccess, c) else { panic!() };
        prop_assert_eq!(a.data.into_bytes(), token);
    }

    #[test]
    fn compression_round_trips_with_oracle(data in prop::collection::vec(any::<u8>(), 0..5000)) {
        for (ours, theirs) in [(Compression::Lz4, OCompression::Lz4), (Compression::Snappy, OCompression::Snappy)] {
            let mut out = BytesMut::new();
            ours.compress_into(&data, &mut out);
            prop_assert_eq!(theirs.decode(out.to_vec()).unwrap(), data.clone());
            let theirs_enc = theirs.encode(&data).unwrap();
            prop_assert_eq!(ours.decompress(&theirs_enc, MAX).unwrap(), data.clone());
        }
    }
}

// ---------------------------------------------------------------- robustness

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Random bytes through the frame decoder and request decoder (with every compression)
    /// must produce frames or errors, never panics.
    #[test]
    fn random_bytes_never_panic(
        data in prop::collection::vec(any::<u8>(), 0..300),
        c in compression(),
    ) {
        let mut dec = FrameDecoder::new(4096);
        let mut buf = BytesMut::from(&data[..]);
        while let Ok(Some(frame)) = dec.decode(&mut buf) {
            let _ = frame.into_request(c, 4096);
        }
    }

    /// Random bodies behind a valid header of every request opcode.
    #[test]
    fn random_bodies_never_panic(
        opcode in prop::sample::select(vec![0x01u8, 0x05, 0x07, 0x09, 0x0A, 0x0B, 0x0D, 0x0F]),
        flags in any::<u8>(),
        body in prop::collection::vec(any::<u8>(), 0..200),
        c in compression(),
    ) {
        let mut raw = vec![0x04, flags, 0, 1, opcode];
        raw.extend_from_slice(&(body.len() as u32).to_be_bytes());
        raw.extend_from_slice(&body);
        let mut dec = FrameDecoder::new(4096);
        let mut buf = BytesMut::from(&raw[..]);
        let frame = dec.decode(&mut buf).unwrap().unwrap();
        let b = frame.body.clone();
        let _ = peek_execute_id(&frame.header, &b);
        let _ = peek_query_text(&frame.header, &b);
        let _ = peek_consistency(&frame.header, &b);
        let _ = frame.into_request(c, 4096);
    }
}
