//! Timing of a partition delete of big rows through the storage API (ignored by default:
//! it writes 200 MB). Run: `cargo test -p sluice-storage --lib -- --ignored
//! a_partition_delete_of_big_rows_is_timed --nocapture`.

use crate::*;
use bytes::Bytes;
use sluice_types::{CqlType, NativeType};
use std::time::{Duration, Instant};

const T: TableId = [9; 16];
/// Rows and row size, overridable through `SLUICE_DELETE_ROWS` and `SLUICE_DELETE_ROW_BYTES`.
fn shape() -> (i32, usize) {
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let rows = var("SLUICE_DELETE_ROWS", 2_000);
    (
        i32::try_from(rows).unwrap(),
        var("SLUICE_DELETE_ROW_BYTES", 100 << 10),
    )
}

fn mutation() -> Mutation {
    Mutation {
        table: T,
        token: 11,
        partition_key: Bytes::from_static(b"big"),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows: vec![],
    }
}

#[test]
#[ignore = "writes 200 MB; a measurement"]
fn a_partition_delete_of_big_rows_is_timed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(50),
        },
        cache_bytes: 64 << 20,
        stores: 1,
    })
    .unwrap();
    let l = TableLayout {
        id: T,
        clustering: vec![(CqlType::Native(NativeType::Int), Order::Asc)],
        regular: None,
        gc_grace_seconds: 864_000,
    };
    let (rows, row_bytes) = shape();
    let value = Bytes::from(vec![b'x'; row_bytes]);
    for c in 0..rows {
        let mut m = mutation();
        m.rows.push(RowMutation {
            clustering: vec![Bytes::copy_from_slice(&c.to_be_bytes())],
            liveness: Some(Liveness {
                timestamp: 1,
                expiry: None,
            }),
            deletion: None,
            collection_deletions: vec![],
            cells: vec![CellWrite {
                column: 1,
                path: None,
                value: CellValue::Live(value.clone()),
                timestamp: 1,
                expiry: None,
            }],
        });
        s.apply(&[(&l, m)]).unwrap();
    }
    let mut m = mutation();
    m.partition_deletion = Some(2);
    let started = Instant::now();
    s.apply(&[(&l, m)]).unwrap();
    let took = started.elapsed();
    let read = s
        .read_partition(&l, 11, b"big", &ClusteringSlice::all(), None, usize::MAX, 0)
        .unwrap();
    assert!(read.rows.is_empty(), "the partition reads empty at once");
    println!("partition delete of {rows} x {row_bytes} B rows: apply took {took:?}");
    // The background purge: every row examined (and removed) within a bounded wait.
    let deadline = started + Duration::from_secs(120);
    while s.purge_rows_examined() < rows as u64 {
        assert!(
            Instant::now() < deadline,
            "the background purge did not finish"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    println!(
        "background purge done {:?} after the delete",
        started.elapsed()
    );
    s.close().unwrap();
}
