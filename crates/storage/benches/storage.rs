//! Storage micro-benchmarks: a single-row apply (periodic durability, so no fsync on the
//! measured path), a point read of one row, and durable writes in batch mode from 16
//! concurrent writers (group commit: time per acknowledged write).

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use sluice_storage::{
    CellValue, CellWrite, ClusteringSlice, Durability, Liveness, Mutation, Order, RowMutation,
    Storage, StorageConfig, TableLayout,
};
use sluice_types::{CqlType, NativeType};
use std::hint::black_box;
use std::ops::Bound;
use std::time::Duration;

fn layout() -> TableLayout {
    TableLayout {
        id: [3; 16],
        clustering: vec![(CqlType::Native(NativeType::Bigint), Order::Asc)],
        regular: None,
        gc_grace_seconds: sluice_storage::DEFAULT_GC_GRACE_SECONDS,
    }
}

fn single_row(token: i64, ck: i64, ts: i64) -> Mutation {
    Mutation {
        table: [3; 16],
        token,
        partition_key: Bytes::copy_from_slice(&token.to_be_bytes()),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows: vec![RowMutation {
            clustering: vec![Bytes::copy_from_slice(&ck.to_be_bytes())],
            liveness: Some(Liveness {
                timestamp: ts,
                expiry: None,
            }),
            deletion: None,
            collection_deletions: vec![],
            cells: vec![CellWrite {
                column: 1,
                path: None,
                value: CellValue::Live(Bytes::from_static(&[7; 100])),
                timestamp: ts,
                expiry: None,
            }],
        }],
    }
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_secs(10),
        },
        cache_bytes: 64 << 20,
        stores: 1,
    })
    .expect("open storage");
    let layout = layout();
    let mut ts = 0i64;
    c.bench_function("apply_single_row", |b| {
        b.iter(|| {
            ts += 1;
            let m = single_row(ts % 10_000, ts % 16, ts);
            storage.apply(&[(&layout, m)]).expect("apply")
        })
    });
    storage.close().expect("close");

    // Reads get their own database: the apply benchmark leaves many row versions behind.
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_secs(10),
        },
        cache_bytes: 64 << 20,
        stores: 1,
    })
    .expect("open storage");
    for token in 0..10_000 {
        storage
            .apply(&[(&layout, single_row(token, 0, 1))])
            .expect("apply");
    }
    let ck = vec![Bytes::copy_from_slice(&0i64.to_be_bytes())];
    let reads = [
        // A full primary key, as `SELECT ... WHERE pk = ? AND ck = ?` reads it.
        (
            "read_partition_point",
            ClusteringSlice {
                ranges: vec![(Bound::Included(ck.clone()), Bound::Included(ck))],
                reversed: false,
            },
        ),
        // The whole partition, as `SELECT ... WHERE pk = ?` reads it.
        ("read_partition_whole", ClusteringSlice::all()),
    ];
    let mut token = 0i64;
    for (name, slice) in &reads {
        c.bench_function(name, |b| {
            b.iter(|| {
                token = (token + 7919) % 10_000;
                let pk = token.to_be_bytes();
                let read = storage
                    .read_partition(&layout, token, &pk, slice, None, 100, 0)
                    .expect("read");
                black_box(read.rows.len())
            })
        });
    }
    storage.close().expect("close");
}

/// Durable writes from `WRITERS` threads sharing group-commit fsyncs; reports the time per
/// acknowledged write across all writers.
fn bench_group_commit(c: &mut Criterion) {
    const WRITERS: u64 = 16;
    let dir = tempfile::tempdir().expect("temp dir");
    let storage = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability: Durability::Batch,
        cache_bytes: 64 << 20,
        stores: 1,
    })
    .expect("open storage");
    let mut group = c.benchmark_group("group_commit");
    group.sample_size(10);
    group.bench_function("durable_write_16_writers", |b| {
        b.iter_custom(|iters| {
            let per_writer = iters.div_ceil(WRITERS);
            let start = std::time::Instant::now();
            let threads: Vec<_> = (0..WRITERS)
                .map(|w| {
                    let storage = storage.clone();
                    std::thread::spawn(move || {
                        let layout = layout();
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .build()
                            .expect("runtime");
                        for i in 0..per_writer {
                            let token = (w * 1_000_000 + i) as i64;
                            let ticket = storage
                                .apply(&[(&layout, single_row(token, 0, 1))])
                                .expect("apply");
                            rt.block_on(storage.wait_durable(ticket)).expect("durable");
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().expect("writer");
            }
            start
                .elapsed()
                .div_f64((per_writer * WRITERS) as f64 / iters as f64)
        })
    });
    group.finish();
    storage.close().expect("close");
}

criterion_group!(benches, bench, bench_group_commit);
criterion_main!(benches);
