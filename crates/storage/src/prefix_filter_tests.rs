//! Partition reads and the partition-prefix Bloom filters: a read visits only the disk
//! tables that hold its partition, and returns what it returned before.

use crate::*;
use bytes::Bytes;
use sluice_types::{CqlType, NativeType};
use std::time::Duration;

const WIDE: TableId = [8; 16];
const NARROW: TableId = [9; 16];
/// Disk tables per table keyspace: below the leveled strategy's L0 threshold (4), so that
/// no compaction merges them during the test.
const ROUNDS: i64 = 3;

fn open(dir: &std::path::Path) -> Storage {
    Storage::open(StorageConfig {
        path: dir.to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(50),
        },
        cache_bytes: 8 << 20,
        stores: 1,
    })
    .unwrap()
}

fn wide() -> TableLayout {
    TableLayout {
        id: WIDE,
        clustering: vec![(CqlType::Native(NativeType::Int), Order::Asc)],
        regular: None,
        gc_grace_seconds: 864_000,
    }
}

fn narrow() -> TableLayout {
    TableLayout {
        id: NARROW,
        clustering: vec![],
        regular: None,
        gc_grace_seconds: 864_000,
    }
}

fn int(v: i32) -> Bytes {
    Bytes::copy_from_slice(&v.to_be_bytes())
}

fn row(clustering: Vec<Bytes>, v: i32) -> RowMutation {
    RowMutation {
        clustering,
        liveness: Some(Liveness {
            timestamp: 1,
            expiry: None,
        }),
        cells: vec![CellWrite {
            column: 1,
            path: None,
            value: CellValue::Live(int(v)),
            timestamp: 1,
            expiry: None,
        }],
        ..Default::default()
    }
}

fn partition(table: TableId, token: i64, rows: Vec<RowMutation>) -> Mutation {
    Mutation {
        table,
        token,
        partition_key: Bytes::copy_from_slice(&token.to_be_bytes()),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows,
    }
}

/// Round `r` writes the partition at token `10 r`, between two others at `-2000 - r` and
/// `2000 + r`: every disk table's key range covers every round's middle partition, so that
/// only a filter can skip a table for it.
fn tokens(round: i64) -> [i64; 3] {
    [-2000 - round, 10 * round, 2000 + round]
}

/// The cells (column 1 as an int) of the rows a partition read returns, and the data
/// blocks it loaded and the disk tables its filters skipped meanwhile.
fn read(s: &Storage, layout: &TableLayout, token: i64) -> (Vec<i32>, usize, usize) {
    let (blocks, skipped) = s.read_filter_metrics(layout.id);
    let rows = s
        .read_partition(
            layout,
            token,
            &token.to_be_bytes(),
            &ClusteringSlice::all(),
            None,
            usize::MAX,
            0,
        )
        .unwrap()
        .rows
        .iter()
        .map(|r| match &r.cells[..] {
            [cell] if cell.column == 1 => {
                i32::from_be_bytes(cell.value.as_ref().try_into().unwrap())
            }
            other => panic!("unexpected cells {other:?}"),
        })
        .collect();
    let (blocks_after, skipped_after) = s.read_filter_metrics(layout.id);
    (rows, blocks_after - blocks, skipped_after - skipped)
}

#[test]
fn a_partition_read_visits_only_the_disk_tables_that_hold_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let (wide, narrow) = (wide(), narrow());
    for round in 0..ROUNDS {
        for token in tokens(round) {
            let rows = (0..3)
                .map(|c| row(vec![int(c)], token as i32 + c))
                .collect();
            s.apply(&[(&wide, partition(WIDE, token, rows))]).unwrap();
            let only = vec![row(vec![], token as i32)];
            s.apply(&[(&narrow, partition(NARROW, token, only))])
                .unwrap();
        }
        s.flush_memtables(Duration::from_secs(30));
    }
    assert_eq!(
        s.disk_table_count(),
        2 * ROUNDS as usize,
        "one disk table per round"
    );

    for round in 0..ROUNDS {
        let token = 10 * round;
        let t = token as i32;
        // One disk table holds the partition: its data block is the only one loaded. The
        // range read of the wide partition skips the other tables by the prefix filter; the
        // narrow one is read by two gets (header, row) that skip tables by full-key filters:
        // every table for the header, the newer tables for the row.
        assert_eq!(read(&s, &wide, token), (vec![t, t + 1, t + 2], 1, 2));
        let newer = (ROUNDS - 1 - round) as usize;
        assert_eq!(read(&s, &narrow, token), (vec![t], 1, 3 + newer));
    }
    // A partition no table holds loads no data block.
    assert_eq!(read(&s, &wide, 7), (vec![], 0, 3));
    assert_eq!(read(&s, &narrow, 7), (vec![], 0, 6));
    // Every partition reads back.
    for round in 0..ROUNDS {
        for token in tokens(round) {
            let t = token as i32;
            assert_eq!(read(&s, &wide, token).0, vec![t, t + 1, t + 2]);
            assert_eq!(read(&s, &narrow, token).0, vec![t]);
        }
    }

    // After a restart (the extractor is not persisted, the tables' filters are).
    drop(s);
    let s = open(dir.path());
    assert_eq!(read(&s, &wide, 10), (vec![10, 11, 12], 1, 2));
    assert_eq!(read(&s, &narrow, 20), (vec![20], 1, 3));
}
