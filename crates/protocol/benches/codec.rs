//! Cost of the wire codec's hot paths: decoding an EXECUTE, encoding a Rows result, and the
//! rejection paths (pre-encoded template vs. encoding the error value).

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion};
use sluice_protocol::error::OperationType;
use sluice_protocol::preencoded::{PreencodedErrors, OVERLOADED};
use sluice_protocol::response::{encode_error, encode_result};
use sluice_protocol::wire::*;
use sluice_protocol::*;
use sluice_types::{CqlType, NativeType};

fn execute_frame() -> BytesMut {
    let mut body = BytesMut::new();
    put_short_bytes(&mut body, &[0x11; 16]);
    put_consistency(&mut body, Consistency::LocalQuorum);
    put_u8(&mut body, 0x01 | 0x04 | 0x10 | 0x20);
    put_short(&mut body, 3);
    put_bytes(&mut body, Some(&42i64.to_be_bytes()));
    put_bytes(&mut body, Some(&7i64.to_be_bytes()));
    put_bytes(&mut body, Some(&[0xAB; 64]));
    put_int(&mut body, 5000);
    put_consistency(&mut body, Consistency::LocalSerial);
    put_long(&mut body, 1_700_000_000_000_000);
    let mut frame = BytesMut::new();
    frame.extend_from_slice(&[0x04, 0, 0, 9, 0x0A]);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

fn bench_decode(c: &mut Criterion) {
    let raw = execute_frame().freeze();
    let mut dec = FrameDecoder::default();
    let mut buf = BytesMut::with_capacity(raw.len() * 2);
    c.bench_function("decode_execute_3_values", |b| {
        b.iter(|| {
            buf.extend_from_slice(&raw);
            let f = dec.decode(&mut buf).unwrap().unwrap();
            black_box(f.into_request(Compression::None, 1 << 20).unwrap())
        })
    });
}

fn rows(n: usize) -> ResultMessage {
    let col = |name: &str, ty| ColumnSpec {
        keyspace: "ks".into(),
        table: "t".into(),
        name: name.into(),
        ty: CqlType::Native(ty),
    };
    let mut body = BytesMut::new();
    for i in 0..n {
        put_bytes(&mut body, Some(&(i as i64).to_be_bytes()));
        put_bytes(&mut body, Some(b"a value of moderate length, repeated"));
    }
    ResultMessage::Rows(Rows {
        metadata: RowsMetadata {
            columns: vec![col("k", NativeType::Bigint), col("v", NativeType::Text)].into(),
            column_count: 2,
            paging_state: None,
            no_metadata: false,
        },
        row_count: n as u32,
        body: body.freeze(),
    })
}

fn bench_encode(c: &mut Criterion) {
    let one = rows(1);
    let many = rows(100);
    let mut out = BytesMut::with_capacity(1 << 20);
    for (name, msg, comp) in [
        ("encode_rows_1", &one, Compression::None),
        ("encode_rows_100", &many, Compression::None),
        ("encode_rows_100_lz4", &many, Compression::Lz4),
        ("encode_rows_100_snappy", &many, Compression::Snappy),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                encode_result(&mut out, 1, black_box(msg), comp);
                black_box(out.len())
            })
        });
    }
}

fn bench_reject(c: &mut Criterion) {
    let pre = PreencodedErrors::new();
    let mut out = BytesMut::with_capacity(4096);
    c.bench_function("reject_preencoded_overloaded", |b| {
        b.iter(|| {
            out.clear();
            pre.overloaded.append(&mut out, black_box(77));
            black_box(out.len())
        })
    });
    c.bench_function("reject_preencoded_rate_limit", |b| {
        b.iter(|| {
            out.clear();
            pre.rate_limit(OperationType::Write, true)
                .append(&mut out, black_box(77));
            black_box(out.len())
        })
    });
    c.bench_function("reject_encode_overloaded_value", |b| {
        b.iter(|| {
            out.clear();
            encode_error(&mut out, black_box(77), &OVERLOADED, Compression::None);
            black_box(out.len())
        })
    });
}

criterion_group!(benches, bench_decode, bench_encode, bench_reject);
criterion_main!(benches);
