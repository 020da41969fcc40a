//! Storage-level tests: writes, reads, scans, durability and crash recovery on a temp dir.

use crate::*;
use bytes::Bytes;
use sluice_types::{CqlType, NativeType};
use std::ops::Bound;
use std::time::Duration;

const T1: TableId = [1; 16];
const T2: TableId = [2; 16];

fn open_at(path: &std::path::Path, durability: Durability) -> Storage {
    Storage::open(StorageConfig {
        path: path.to_path_buf(),
        durability,
        cache_bytes: 8 << 20,
    })
    .unwrap()
}

fn open(durability: Durability) -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let s = open_at(dir.path(), durability);
    (dir, s)
}

fn periodic() -> Durability {
    Durability::Periodic {
        interval: Duration::from_millis(50),
    }
}

fn int(v: i32) -> Bytes {
    Bytes::copy_from_slice(&v.to_be_bytes())
}

fn text(v: &str) -> Bytes {
    Bytes::copy_from_slice(v.as_bytes())
}

/// Table (pk, c1 int ASC, c2 text DESC, v...).
fn layout() -> TableLayout {
    TableLayout {
        id: T1,
        clustering: vec![
            (CqlType::Native(NativeType::Int), Order::Asc),
            (CqlType::Native(NativeType::Text), Order::Desc),
        ],
    }
}

fn layout_no_ck(id: TableId) -> TableLayout {
    TableLayout {
        id,
        clustering: vec![],
    }
}

fn mutation(table: TableId, token: i64, pk: &str) -> Mutation {
    Mutation {
        table,
        token,
        partition_key: text(pk),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows: vec![],
    }
}

fn cell(column: ColumnId, value: &str, timestamp: i64) -> CellWrite {
    CellWrite {
        column,
        path: None,
        value: CellValue::Live(text(value)),
        timestamp,
        expiry: None,
    }
}

fn insert_row(clustering: Vec<Bytes>, cells: Vec<CellWrite>, timestamp: i64) -> RowMutation {
    RowMutation {
        clustering,
        liveness: Some(Liveness {
            timestamp,
            expiry: None,
        }),
        deletion: None,
        collection_deletions: vec![],
        cells,
    }
}

fn ck(c1: i32, c2: &str) -> Vec<Bytes> {
    vec![int(c1), text(c2)]
}

fn read_all(s: &Storage, l: &TableLayout, token: i64, pk: &str, now: u32) -> PartitionRead {
    s.read_partition(
        l,
        token,
        pk.as_bytes(),
        &ClusteringSlice::all(),
        None,
        usize::MAX,
        now,
    )
    .unwrap()
}

fn keys(read: &PartitionRead) -> Vec<Vec<Bytes>> {
    read.rows.iter().map(|r| r.clustering.clone()).collect()
}

fn value(row: &ReadRow, column: ColumnId) -> Option<Bytes> {
    row.cells
        .iter()
        .find(|c| c.column == column && c.path.is_none())
        .map(|c| c.value.clone())
}

/// Writes rows (c1, c2) for c1 in 0..n1, c2 in names into partition "p".
fn fill(s: &Storage, l: &TableLayout, n1: i32, names: &[&str]) {
    let mut m = mutation(T1, 7, "p");
    for c1 in 0..n1 {
        for c2 in names {
            m.rows.push(insert_row(
                ck(c1, c2),
                vec![cell(1, &format!("{c1}{c2}"), 1)],
                1,
            ));
        }
    }
    s.apply(&[(l, m)]).unwrap();
}

#[test]
fn lww_through_storage() {
    let (_d, s) = open(periodic());
    let l = layout_no_ck(T2);
    let write = |v: &str, ts: i64| {
        let mut m = mutation(T2, 1, "k");
        m.rows.push(RowMutation {
            cells: vec![cell(1, v, ts)],
            ..Default::default()
        });
        s.apply(&[(&l, m)]).unwrap();
    };
    write("new", 20);
    write("old", 10);
    let r = read_all(&s, &l, 1, "k", 0);
    assert_eq!(value(&r.rows[0], 1), Some(text("new")));
    write("a", 20);
    assert_eq!(
        value(&read_all(&s, &l, 1, "k", 0).rows[0], 1),
        Some(text("new"))
    );
    write("z", 20);
    assert_eq!(
        value(&read_all(&s, &l, 1, "k", 0).rows[0], 1),
        Some(text("z"))
    );
    // The row has no liveness marker: it exists only through its live cell.
    assert!(!read_all(&s, &l, 1, "k", 0).rows[0].has_liveness);
}

#[test]
fn clustering_order_asc_desc_and_prefix_slices() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill(&s, &l, 4, &["a", "b", "c"]);
    let all = read_all(&s, &l, 7, "p", 0);
    let expected: Vec<_> = (0..4)
        .flat_map(|c1| ["c", "b", "a"].map(|c2| ck(c1, c2)))
        .collect();
    assert_eq!(keys(&all), expected);
    assert!(!all.more);

    // c1 > 1 AND c1 <= 2, plus c1 = 0 AND c2 >= 'b' (two ranges in clustering order).
    let slice = ClusteringSlice {
        ranges: vec![
            (Bound::Included(ck(0, "c")), Bound::Included(ck(0, "b"))),
            (Bound::Excluded(vec![int(1)]), Bound::Included(vec![int(2)])),
        ],
        reversed: false,
    };
    let r = s
        .read_partition(&l, 7, b"p", &slice, None, usize::MAX, 0)
        .unwrap();
    assert_eq!(
        keys(&r),
        vec![ck(0, "c"), ck(0, "b"), ck(2, "c"), ck(2, "b"), ck(2, "a")]
    );

    // Reversed, with paging via `after` and a limit.
    let rev = ClusteringSlice {
        reversed: true,
        ..slice
    };
    let page1 = s.read_partition(&l, 7, b"p", &rev, None, 3, 0).unwrap();
    assert_eq!(keys(&page1), vec![ck(2, "a"), ck(2, "b"), ck(2, "c")]);
    assert!(page1.more);
    let after = page1.rows.last().unwrap().clustering.clone();
    let page2 = s
        .read_partition(&l, 7, b"p", &rev, Some(&after), 3, 0)
        .unwrap();
    assert_eq!(keys(&page2), vec![ck(0, "b"), ck(0, "c")]);
    assert!(!page2.more);

    // Forward paging over the whole partition visits every row once.
    let mut seen = Vec::new();
    let mut after: Option<Vec<Bytes>> = None;
    loop {
        let p = s
            .read_partition(&l, 7, b"p", &ClusteringSlice::all(), after.as_deref(), 5, 0)
            .unwrap();
        seen.extend(keys(&p));
        if !p.more {
            break;
        }
        after = Some(p.rows.last().unwrap().clustering.clone());
    }
    assert_eq!(seen, expected);
}

#[test]
fn tombstones_cell_row_range_partition() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill(&s, &l, 4, &["a", "b"]);
    // Cell tombstone on (0, a) column 1; the row stays through its liveness.
    let mut m = mutation(T1, 7, "p");
    m.rows.push(RowMutation {
        clustering: ck(0, "a"),
        cells: vec![CellWrite {
            value: CellValue::Tombstone,
            ..cell(1, "", 2)
        }],
        ..Default::default()
    });
    // Row deletion of (0, b).
    m.rows.push(RowMutation {
        clustering: ck(0, "b"),
        deletion: Some(2),
        ..Default::default()
    });
    // Range deletion c1 >= 2 (prefix bound).
    m.range_deletions.push(RangeDeletion {
        start: Bound::Included(vec![int(2)]),
        end: Bound::Unbounded,
        timestamp: 2,
    });
    s.apply(&[(&l, m)]).unwrap();
    let r = read_all(&s, &l, 7, "p", 0);
    assert_eq!(keys(&r), vec![ck(0, "a"), ck(1, "b"), ck(1, "a")]);
    assert!(r.rows[0].cells.is_empty() && r.rows[0].has_liveness);

    // A newer write inside the deleted range is visible again.
    let mut m = mutation(T1, 7, "p");
    m.rows
        .push(insert_row(ck(3, "z"), vec![cell(1, "new", 3)], 3));
    s.apply(&[(&l, m)]).unwrap();
    assert_eq!(keys(&read_all(&s, &l, 7, "p", 0)).len(), 4);

    // Partition deletion at 3 hides everything written at or before 3.
    let mut m = mutation(T1, 7, "p");
    m.partition_deletion = Some(3);
    s.apply(&[(&l, m)]).unwrap();
    let r = read_all(&s, &l, 7, "p", 0);
    assert!(r.rows.is_empty() && r.static_row.is_none());
}

#[test]
fn ttl_expiry_by_now_secs() {
    let (_d, s) = open(periodic());
    let l = layout_no_ck(T2);
    let mut m = mutation(T2, 3, "k");
    m.rows.push(RowMutation {
        liveness: Some(Liveness {
            timestamp: 1,
            expiry: Some((1_000, 100)),
        }),
        cells: vec![
            CellWrite {
                expiry: Some((1_000, 100)),
                ..cell(1, "short", 1)
            },
            cell(2, "forever", 1),
        ],
        ..Default::default()
    });
    s.apply(&[(&l, m)]).unwrap();
    let before = read_all(&s, &l, 3, "k", 999);
    assert_eq!(before.rows[0].cells.len(), 2);
    assert_eq!(before.rows[0].cells[0].expiry, Some((1_000, 100)));
    let after = read_all(&s, &l, 3, "k", 1_000);
    assert_eq!(after.rows.len(), 1);
    assert!(!after.rows[0].has_liveness);
    assert_eq!(value(&after.rows[0], 2), Some(text("forever")));
    assert_eq!(value(&after.rows[0], 1), None);
}

#[test]
fn counters_accumulate() {
    let (_d, s) = open(periodic());
    let l = layout_no_ck(T2);
    for (i, d) in [5i64, 7, -2].into_iter().enumerate() {
        let mut m = mutation(T2, 9, "c");
        m.rows.push(RowMutation {
            cells: vec![CellWrite {
                value: CellValue::CounterDelta(d),
                ..cell(4, "", i as i64)
            }],
            ..Default::default()
        });
        s.apply(&[(&l, m)]).unwrap();
    }
    let r = read_all(&s, &l, 9, "c", 0);
    assert_eq!(
        value(&r.rows[0], 4),
        Some(Bytes::copy_from_slice(&10i64.to_be_bytes()))
    );
}

#[test]
fn collection_elements_and_collection_deletion() {
    let (_d, s) = open(periodic());
    let l = layout_no_ck(T2);
    let elem = |k: &str, v: &str, ts: i64| CellWrite {
        path: Some(text(k)),
        ..cell(3, v, ts)
    };
    let mut m = mutation(T2, 5, "m");
    m.rows.push(RowMutation {
        cells: vec![elem("b", "2", 1), elem("a", "1", 1)],
        ..Default::default()
    });
    s.apply(&[(&l, m)]).unwrap();
    let r = read_all(&s, &l, 5, "m", 0);
    let paths: Vec<_> = r.rows[0]
        .cells
        .iter()
        .map(|c| c.path.clone().unwrap())
        .collect();
    assert_eq!(paths, vec![text("a"), text("b")]);
    // Overwrite the whole collection: deletion at ts 4, new element at ts 5.
    let mut m = mutation(T2, 5, "m");
    m.rows.push(RowMutation {
        collection_deletions: vec![(3, 4)],
        cells: vec![elem("c", "3", 5)],
        ..Default::default()
    });
    s.apply(&[(&l, m)]).unwrap();
    let r = read_all(&s, &l, 5, "m", 0);
    let paths: Vec<_> = r.rows[0]
        .cells
        .iter()
        .map(|c| c.path.clone().unwrap())
        .collect();
    assert_eq!(paths, vec![text("c")]);
}

#[test]
fn static_row_read_and_deleted() {
    let (_d, s) = open(periodic());
    let l = layout();
    let mut m = mutation(T1, 7, "p");
    m.static_row = Some(RowMutation {
        cells: vec![cell(9, "s", 1)],
        ..Default::default()
    });
    s.apply(&[(&l, m)]).unwrap();
    let r = read_all(&s, &l, 7, "p", 0);
    assert!(r.rows.is_empty());
    assert_eq!(value(r.static_row.as_ref().unwrap(), 9), Some(text("s")));
    let mut m = mutation(T1, 7, "p");
    m.partition_deletion = Some(1);
    s.apply(&[(&l, m)]).unwrap();
    assert!(read_all(&s, &l, 7, "p", 0).static_row.is_none());
}

#[test]
fn meta_store_and_reopen_persist() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_at(dir.path(), Durability::Batch);
        s.meta_put(b"ks/a", b"1").unwrap();
        s.meta_put(b"ks/b", b"2").unwrap();
        s.meta_put(b"other", b"3").unwrap();
        s.meta_delete(b"ks/a").unwrap();
        let l = layout();
        fill(&s, &l, 2, &["x"]);
        s.close().unwrap();
        assert_eq!(s.meta_put(b"x", b"y"), Err(StorageError::Closed));
    }
    let s = open_at(dir.path(), Durability::Batch);
    assert_eq!(
        s.meta_scan(b"ks/").unwrap(),
        vec![(b"ks/b".to_vec(), b"2".to_vec())]
    );
    assert_eq!(
        keys(&read_all(&s, &layout(), 7, "p", 0)),
        vec![ck(0, "x"), ck(1, "x")]
    );
}

#[test]
fn malformed_mutations_are_rejected_without_writing() {
    let (_d, s) = open(periodic());
    let l = layout();
    let mut m = mutation(T1, 7, "p");
    m.rows.push(insert_row(vec![int(1)], vec![], 1));
    assert!(s.apply(&[(&l, m)]).is_err());
    let mut m = mutation(T1, 7, "p");
    m.rows.push(insert_row(
        vec![Bytes::from_static(&[1, 2]), text("a")],
        vec![],
        1,
    ));
    assert!(s.apply(&[(&l, m)]).is_err());
    assert!(read_all(&s, &l, 7, "p", 0).rows.is_empty());
}
