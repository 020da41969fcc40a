//! Storage-level tests: writes, reads, scans, durability and crash recovery on a temp dir.

use crate::*;
use bytes::Bytes;
use sluice_types::{CqlType, NativeType};
use std::ops::Bound;
use std::time::Duration;

const T1: TableId = [1; 16];
const T2: TableId = [2; 16];

/// Stores per test storage: several, so that every test also covers partitions spread
/// over stores (scans merge them, batches span them).
const STORES: usize = 3;

fn open_at(path: &std::path::Path, durability: Durability) -> Storage {
    open_with_stores(path, durability, STORES)
}

fn open_with_stores(path: &std::path::Path, durability: Durability, stores: usize) -> Storage {
    Storage::open(StorageConfig {
        path: path.to_path_buf(),
        durability,
        cache_bytes: 8 << 20,
        stores,
    })
    .unwrap()
}

fn open(durability: Durability) -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let s = open_at(dir.path(), durability);
    (dir, s)
}

/// A storage of one store: for tests of one journal and its sync thread.
fn open_one_store(durability: Durability) -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let s = open_with_stores(dir.path(), durability, 1);
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
        regular: None,
        gc_grace_seconds: crate::DEFAULT_GC_GRACE_SECONDS,
    }
}

fn layout_no_ck(id: TableId) -> TableLayout {
    TableLayout {
        id,
        clustering: vec![],
        regular: None,
        gc_grace_seconds: crate::DEFAULT_GC_GRACE_SECONDS,
    }
}

/// A table without clustering columns whose regular columns are 1 and 2 (simple) and 3 (a
/// list): whole-row writes can skip the read.
fn layout_replaceable(id: TableId) -> TableLayout {
    TableLayout {
        id,
        clustering: vec![],
        regular: Some(std::sync::Arc::new(RegularColumns::new(vec![
            (1, false),
            (2, false),
            (3, true),
        ]))),
        gc_grace_seconds: crate::DEFAULT_GC_GRACE_SECONDS,
    }
}

/// An INSERT of the whole row of `layout_replaceable`: columns 1 and 2, and list 3 deleted
/// first then given one element.
fn whole_row(token: i64, pk: &str, v: &str, ts: i64) -> Mutation {
    let mut m = mutation(T2, token, pk);
    let mut row = insert_row(vec![], vec![cell(1, v, ts), cell(2, v, ts)], ts);
    row.collection_deletions.push((3, ts - 1));
    row.cells.push(CellWrite {
        path: Some(Bytes::copy_from_slice(&ts.to_be_bytes())),
        ..cell(3, v, ts)
    });
    m.rows.push(row);
    m
}

/// (column, value, timestamp) of every live cell of the partition's only row.
fn cells_of(s: &Storage, l: &TableLayout, token: i64, pk: &str) -> Vec<(u16, String, i64)> {
    let r = read_all(s, l, token, pk, 0);
    assert_eq!(r.rows.len(), 1);
    r.rows[0]
        .cells
        .iter()
        .map(|c| {
            let v = String::from_utf8(c.value.to_vec()).unwrap();
            (c.column, v, c.timestamp)
        })
        .collect()
}

#[test]
fn whole_row_writes_newer_than_their_stripe_skip_the_read_and_others_merge() {
    let (_d, s) = open(periodic());
    let l = layout_replaceable(T2);
    let apply = |m: Mutation| s.apply(&[(&l, m)]).unwrap();
    apply(whole_row(1, "k", "a", 10));
    assert_eq!(s.replaced_row_count(), 1, "first write of a fresh store");
    // After each write: how many rows were replaced whole so far, and the row's cells.
    let check = |replaced: u64, cells: [(u16, &str, i64); 3]| {
        assert_eq!(s.replaced_row_count(), replaced);
        let want: Vec<(u16, String, i64)> = cells
            .iter()
            .map(|&(c, v, ts)| (c, v.to_string(), ts))
            .collect();
        assert_eq!(cells_of(&s, &l, 1, "k"), want);
    };
    // Only column 1: merges, column 2 and the list stay.
    let mut m = mutation(T2, 1, "k");
    m.rows.push(insert_row(vec![], vec![cell(1, "b", 20)], 20));
    apply(m);
    check(1, [(1, "b", 20), (2, "a", 10), (3, "a", 10)]);
    // Whole, but older than what the stripe holds: merges, the newer column 1 stays.
    apply(whole_row(1, "k", "c", 15));
    check(1, [(1, "b", 20), (2, "c", 15), (3, "c", 15)]);
    // Whole and newest: replaces (the old list element is gone with the rest).
    apply(whole_row(1, "k", "d", 30));
    check(2, [(1, "d", 30), (2, "d", 30), (3, "d", 30)]);
    // A list written without deleting it first does not cover the column: merges.
    let mut m = whole_row(1, "k", "e", 40);
    m.rows[0].collection_deletions.clear();
    apply(m);
    assert_eq!(s.replaced_row_count(), 2);
    assert_eq!(cells_of(&s, &l, 1, "k").len(), 4, "both list elements");
    // Without liveness (an UPDATE) the stored row marker must stay: merges.
    let mut m = whole_row(1, "k", "f", 50);
    m.rows[0].liveness = None;
    apply(m);
    assert_eq!(s.replaced_row_count(), 2);
    assert!(read_all(&s, &l, 1, "k", 0).rows[0].has_liveness);
    // A retired column set (the schema changed): merges.
    l.retire_regular_columns();
    apply(whole_row(1, "k", "g", 60));
    assert_eq!(s.replaced_row_count(), 2);
    assert_eq!(cells_of(&s, &l, 1, "k")[0], (1, "g".into(), 60));
}

#[test]
fn timestamp_ceiling_keeps_older_whole_rows_merging_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout_replaceable(T2);
    {
        let s = open_at(dir.path(), periodic());
        s.apply(&[(&l, whole_row(1, "k", "new", 1_000))]).unwrap();
        s.close().unwrap();
    }
    {
        // The stripes start at the persisted ceiling: an older whole row merges and loses.
        let s = open_at(dir.path(), periodic());
        s.apply(&[(&l, whole_row(1, "k", "old", 500))]).unwrap();
        assert_eq!(s.replaced_row_count(), 0);
        assert_eq!(cells_of(&s, &l, 1, "k")[0], (1, "new".into(), 1_000));
        // Past the ceiling's headroom a whole row replaces again.
        // (The list deletion is at `ts - 1`, which must be above the ceiling too.)
        let later = 1_000 + 10_000_000 + 2;
        s.apply(&[(&l, whole_row(2, "j", "x", later))]).unwrap();
        assert_eq!(s.replaced_row_count(), 1);
        // A database without a persisted ceiling (as written before there was one).
        s.meta_delete(b"storage/timestamp-ceiling").unwrap();
        s.close().unwrap();
    }
    let s = open_at(dir.path(), periodic());
    s.apply(&[(&l, whole_row(1, "k", "old", 900))]).unwrap();
    assert_eq!(
        s.replaced_row_count(),
        0,
        "the scan found the newest stored timestamp"
    );
    assert_eq!(cells_of(&s, &l, 1, "k")[0], (1, "new".into(), 1_000));
}

/// A write that does not replace its row is merged with the stored row before the locks;
/// the commit uses that merge only if the key still holds the value it was made from.
#[test]
fn rows_merged_ahead_stand_only_over_the_value_they_were_merged_with() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout_replaceable(T2);
    let store = crate::store::Store::open(dir.path(), periodic(), 8 << 20).unwrap();
    let commit = |m: Mutation| {
        let prepared = crate::store::Store::prepare(&[(&l, m)]).unwrap();
        store.commit(prepared, None).unwrap();
    };
    let update = |column: ColumnId, v: &str, ts: i64| {
        let mut m = mutation(T2, 1, "k");
        m.rows.push(RowMutation {
            liveness: None,
            ..insert_row(vec![], vec![cell(column, v, ts)], ts)
        });
        m
    };
    let cells = |store: &crate::store::Store| -> Vec<(u16, String, i64)> {
        let read = store
            .read_partition(&l, 1, b"k", &ClusteringSlice::all(), None, 1, 0)
            .unwrap();
        let row = &read.rows[0];
        assert!(row.has_liveness, "the INSERT's row marker stays");
        row.cells
            .iter()
            .map(|c| {
                (
                    c.column,
                    String::from_utf8_lossy(&c.value).into(),
                    c.timestamp,
                )
            })
            .collect()
    };
    commit(whole_row(1, "k", "a", 10));
    // Nothing written in between: the commit stores the very bytes merged ahead.
    let mut prepared = crate::store::Store::prepare(&[(&l, update(1, "b", 20))]).unwrap();
    store.merge_ahead(&mut prepared).unwrap();
    let merged = prepared.merged_ahead();
    assert_eq!(merged.len(), 1);
    store.commit(prepared, None).unwrap();
    let ((table, key), value) = &merged[0];
    let stored = store.stored_value(table, key).unwrap();
    assert!(std::ptr::eq(stored.as_ptr(), value.as_ptr()));
    assert_eq!(
        cells(&store),
        [
            (1, "b".into(), 20),
            (2, "a".into(), 10),
            (3, "a".into(), 10)
        ]
    );
    // Another write lands between the merge and the locks: the commit merges again, and
    // keeps that write (a stale merge would bring column 2's "a" back).
    let mut prepared = crate::store::Store::prepare(&[(&l, update(1, "c", 30))]).unwrap();
    store.merge_ahead(&mut prepared).unwrap();
    let merged = prepared.merged_ahead();
    assert_eq!(merged.len(), 1);
    commit(update(2, "x", 25));
    store.commit(prepared, None).unwrap();
    let ((table, key), value) = &merged[0];
    let stored = store.stored_value(table, key).unwrap();
    assert!(!std::ptr::eq(stored.as_ptr(), value.as_ptr()));
    assert_eq!(
        cells(&store),
        [
            (1, "c".into(), 30),
            (2, "x".into(), 25),
            (3, "a".into(), 10)
        ]
    );
    // A key with nothing stored has nothing to merge with.
    let mut m = mutation(T2, 2, "new");
    m.rows.push(insert_row(vec![], vec![cell(1, "n", 40)], 40));
    let mut prepared = crate::store::Store::prepare(&[(&l, m)]).unwrap();
    store.merge_ahead(&mut prepared).unwrap();
    assert!(prepared.merged_ahead().is_empty());
    store.close().unwrap();
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
fn at_equal_timestamps_an_expiring_cell_beats_one_without_ttl() {
    let (_d, s) = open(periodic());
    let l = layout_no_ck(T2);
    let write = |v: &str, ts: i64, expiry: Option<(u32, u32)>| {
        let mut c = cell(1, v, ts);
        c.expiry = expiry;
        let mut m = mutation(T2, 1, "k");
        m.rows.push(RowMutation {
            cells: vec![c],
            ..Default::default()
        });
        s.apply(&[(&l, m)]).unwrap();
    };
    let read = || value(&read_all(&s, &l, 1, "k", 0).rows[0], 1);
    // As Cassandra (CASSANDRA-14592): the expiring cell wins whatever the values.
    write("a", 20, Some((1_000, 100)));
    write("z", 20, None);
    assert_eq!(read(), Some(text("a")));
    // Of two expiring cells the later expiry wins, then the greater value.
    write("b", 20, Some((999, 100)));
    assert_eq!(read(), Some(text("a")));
    write("c", 20, Some((2_000, 100)));
    assert_eq!(read(), Some(text("c")));
    write("d", 20, Some((2_000, 100)));
    assert_eq!(read(), Some(text("d")));
    write("b", 20, Some((2_000, 100)));
    assert_eq!(read(), Some(text("d")));
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

    // Point reads of full keys (several points in one slice, one missing).
    let points = ClusteringSlice {
        ranges: [ck(1, "b"), ck(1, "zz"), ck(3, "a")]
            .into_iter()
            .map(|k| (Bound::Included(k.clone()), Bound::Included(k)))
            .collect(),
        reversed: false,
    };
    let r = s
        .read_partition(&l, 7, b"p", &points, None, usize::MAX, 0)
        .unwrap();
    assert_eq!(keys(&r), vec![ck(1, "b"), ck(3, "a")]);
    assert_eq!(value(&r.rows[1], 1), Some(text("3a")));
    let r = s
        .read_partition(&l, 7, b"p", &points, Some(&ck(1, "b")), usize::MAX, 0)
        .unwrap();
    assert_eq!(keys(&r), vec![ck(3, "a")]);
    let r = s.read_partition(&l, 7, b"p", &points, None, 1, 0).unwrap();
    assert_eq!((keys(&r), r.more), (vec![ck(1, "b")], true));

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

/// Longest a test waits for the background purge of shadowed rows.
const PURGE_WAIT: Duration = Duration::from_secs(30);

#[test]
fn a_partition_delete_examines_no_row_on_the_committing_thread() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill_big_partition(&s, &l, 2_000, 10_000);
    assert_eq!(s.raw_entry_count(T1), 2_000);
    let examined_before = s.purge_rows_examined();
    let held = s.hold_purgers();
    let mut m = mutation(T1, 7, "big");
    m.partition_deletion = Some(2);
    s.apply(&[(&l, m)]).unwrap();
    assert_eq!(
        s.purge_rows_examined(),
        examined_before,
        "the delete itself examined no row"
    );
    assert_eq!(s.raw_entry_count(T1), 2_001, "the rows are still on disk");
    assert!(
        read_all(&s, &l, 7, "big", 0).rows.is_empty(),
        "and already hidden"
    );
    drop(held);
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(s.purge_rows_examined() - examined_before, 2_000);
    assert_eq!(s.raw_entry_count(T1), 1, "only the header is left");
    assert_eq!(s.dropped_purge_jobs(), 0);
    // A late write under the deletion stays hidden.
    let mut m = mutation(T1, 7, "big");
    m.rows
        .push(insert_row(ck(5, "r"), vec![cell(1, "late", 1)], 1));
    s.apply(&[(&l, m)]).unwrap();
    assert!(read_all(&s, &l, 7, "big", 0).rows.is_empty());
}

#[test]
fn a_restart_before_the_purge_keeps_the_rows_hidden_and_purges_them_after() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout();
    {
        let s = open_at(dir.path(), periodic());
        fill_big_partition(&s, &l, 600, 100);
        fill(&s, &l, 2, &["a"]);
        let _held = s.hold_purgers();
        let mut m = mutation(T1, 7, "big");
        m.partition_deletion = Some(2);
        s.apply(&[(&l, m)]).unwrap();
        let mut m = mutation(T1, 7, "p");
        m.range_deletions.push(RangeDeletion {
            start: Bound::Included(vec![int(1)]),
            end: Bound::Unbounded,
            timestamp: 5,
        });
        s.apply(&[(&l, m)]).unwrap();
        assert_eq!(s.raw_entry_count(T1), 600 + 1 + 2 + 1);
        assert_eq!(
            s.purge_record_count(),
            2,
            "one record per partition deleted"
        );
        s.close().unwrap();
    }
    let s = open_at(dir.path(), periodic());
    assert!(s.wait_purges(PURGE_WAIT));
    assert!(read_all(&s, &l, 7, "big", 0).rows.is_empty());
    assert_eq!(keys(&read_all(&s, &l, 7, "p", 0)), vec![ck(0, "a")]);
    assert_eq!(
        s.raw_entry_count(T1),
        1 + 2,
        "both headers and the live row are left"
    );
    assert_eq!(s.purge_record_count(), 0, "no purge record is left");
}

#[test]
fn a_full_purge_queue_drops_jobs_and_their_records_purge_them_later() {
    let (_d, s) = open_one_store(periodic());
    let l = layout();
    let partitions = crate::store::PURGE_QUEUE_JOBS as i64 + 20;
    for p in 0..partitions {
        let mut m = mutation(T1, p, "q");
        m.rows
            .push(insert_row(ck(0, "a"), vec![cell(1, "v", 1)], 1));
        s.apply(&[(&l, m)]).unwrap();
    }
    {
        let _held = s.hold_purgers();
        for p in 0..partitions {
            let mut m = mutation(T1, p, "q");
            m.partition_deletion = Some(2);
            s.apply(&[(&l, m)]).unwrap();
        }
        assert_eq!(s.dropped_purge_jobs(), 20);
    }
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(
        s.raw_entry_count(T1),
        partitions as usize,
        "every row is purged, the dropped jobs' too; the headers stay"
    );
    assert_eq!(s.purge_record_count(), 0);
}

#[test]
fn deletions_purge_the_rows_they_shadow() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill(&s, &l, 4, &["a", "b", "c"]);
    assert_eq!(s.raw_entry_count(T1), 12);
    // A row newer than the coming deletions survives them, physically and visibly.
    let mut m = mutation(T1, 7, "p");
    m.rows
        .push(insert_row(ck(2, "new"), vec![cell(1, "n", 9)], 9));
    s.apply(&[(&l, m)]).unwrap();
    // Range deletion of c1 in [1, 2] at ts 5: six old rows go, the header comes.
    let mut m = mutation(T1, 7, "p");
    m.range_deletions.push(RangeDeletion {
        start: Bound::Included(vec![int(1)]),
        end: Bound::Included(vec![int(2)]),
        timestamp: 5,
    });
    s.apply(&[(&l, m)]).unwrap();
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(s.raw_entry_count(T1), 13 - 6 + 1);
    // Partition deletion at ts 5: everything old goes; the header and the newer row stay.
    let mut m = mutation(T1, 7, "p");
    m.partition_deletion = Some(5);
    s.apply(&[(&l, m)]).unwrap();
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(s.raw_entry_count(T1), 2);
    assert_eq!(keys(&read_all(&s, &l, 7, "p", 0)), vec![ck(2, "new")]);
    // A late write under the deletion stays hidden although its old row was purged.
    let mut m = mutation(T1, 7, "p");
    m.rows
        .push(insert_row(ck(0, "a"), vec![cell(1, "late", 4)], 4));
    s.apply(&[(&l, m)]).unwrap();
    assert_eq!(keys(&read_all(&s, &l, 7, "p", 0)), vec![ck(2, "new")]);
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

/// The partition header (static row, range tombstones) applies the same whether a read
/// takes it from the range that starts at the partition's first row or looks it up apart
/// (reversed reads, slices that start later, resumed pages).
#[test]
fn every_read_shape_sees_the_partition_header() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill(&s, &l, 4, &["a", "b"]);
    let mut m = mutation(T1, 7, "p");
    m.static_row = Some(RowMutation {
        cells: vec![cell(9, "s", 5)],
        ..Default::default()
    });
    // Hides c1 = 1 (written at 1).
    m.range_deletions.push(RangeDeletion {
        start: Bound::Included(vec![int(1)]),
        end: Bound::Included(vec![int(1)]),
        timestamp: 2,
    });
    s.apply(&[(&l, m)]).unwrap();
    let read = |slice: &ClusteringSlice, after: Option<&[Bytes]>, limit: usize| {
        s.read_partition(&l, 7, b"p", slice, after, limit, 0)
            .unwrap()
    };
    let expected = vec![
        ck(0, "b"),
        ck(0, "a"),
        ck(2, "b"),
        ck(2, "a"),
        ck(3, "b"),
        ck(3, "a"),
    ];
    let whole = read(&ClusteringSlice::all(), None, usize::MAX);
    assert_eq!(keys(&whole), expected);
    let reversed = ClusteringSlice {
        reversed: true,
        ..ClusteringSlice::all()
    };
    let back = read(&reversed, None, usize::MAX);
    assert_eq!(
        keys(&back),
        expected.iter().rev().cloned().collect::<Vec<_>>()
    );
    let later = ClusteringSlice {
        ranges: vec![(Bound::Included(vec![int(1)]), Bound::Unbounded)],
        reversed: false,
    };
    assert_eq!(
        keys(&read(&later, None, usize::MAX)),
        expected[2..].to_vec()
    );
    let first_page = read(&ClusteringSlice::all(), None, 2);
    assert!(first_page.more);
    let resumed = read(&ClusteringSlice::all(), Some(&expected[1]), usize::MAX);
    assert_eq!(keys(&resumed), expected[2..].to_vec());
    for r in [&whole, &back, &first_page, &resumed, &read(&later, None, 1)] {
        assert_eq!(value(r.static_row.as_ref().unwrap(), 9), Some(text("s")));
    }
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
fn open_creates_missing_directories() {
    let dir = tempfile::tempdir().unwrap();
    let s = open_at(&dir.path().join("a/b/data"), Durability::Batch);
    s.meta_put(b"k", b"v").unwrap();
    s.close().unwrap();
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
    let mut m = mutation(T2, 7, "p");
    m.rows.push(insert_row(ck(1, "a"), vec![], 1));
    assert!(s.apply(&[(&l, m)]).is_err());
    assert!(read_all(&s, &l, 7, "p", 0).rows.is_empty());
}

/// Writes partitions "p0".."p{n}" (token = index * 10) into T1: partition i has i rows
/// (so "p0" is empty unless it has a static row); even partitions get a static row.
/// The token of partition `p{i}`: ascending with `i`, and spread over the stores (three
/// consecutive ones land in three different stores of three), so that one batch spans
/// stores and scans merge them.
fn spread_token(i: i64) -> i64 {
    i * (3 << 49)
}

fn fill_partitions(s: &Storage, l: &TableLayout, n: i64) {
    let mut batch = Vec::new();
    for i in 0..n {
        let mut m = mutation(T1, spread_token(i), &format!("p{i}"));
        for r in 0..i as i32 {
            m.rows
                .push(insert_row(ck(r, "x"), vec![cell(1, "v", 1)], 1));
        }
        if i % 2 == 0 {
            m.static_row = Some(RowMutation {
                cells: vec![cell(9, "s", 1)],
                ..Default::default()
            });
        }
        batch.push((l, m));
    }
    s.apply(&batch).unwrap();
}

/// Counts result rows the way the engine does: each row, or 1 for a static-only partition.
fn scan_rows(page: &ScanPage) -> usize {
    page.partitions
        .iter()
        .map(|p| {
            p.read
                .rows
                .len()
                .max(usize::from(p.read.static_row.is_some()))
        })
        .sum()
}

#[test]
fn scan_pages_across_partitions_and_resumes() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill_partitions(&s, &l, 6);
    // Another table's data must not leak in.
    let mut other = mutation(T2, 15, "q");
    other
        .rows
        .push(insert_row(vec![], vec![cell(1, "o", 1)], 1));
    s.apply(&[(&layout_no_ck(T2), other)]).unwrap();

    let full = s
        .scan(
            &l,
            &ScanStart::Token(Bound::Unbounded),
            Bound::Unbounded,
            usize::MAX,
            0,
        )
        .unwrap();
    assert!(full.next.is_none());
    let names: Vec<_> = full
        .partitions
        .iter()
        .map(|p| p.partition_key.clone())
        .collect();
    assert_eq!(names, ["p0", "p1", "p2", "p3", "p4", "p5"].map(text));
    // Rows 0 + 1 + 2 + 3 + 4 + 5, plus "p0" which has only a static row.
    assert_eq!(scan_rows(&full), 16);

    // Page through with every limit: the union is the full scan, no duplicates.
    for limit in 1..=17 {
        let mut start = ScanStart::Token(Bound::Unbounded);
        let mut seen: Vec<(Bytes, Vec<Bytes>)> = Vec::new();
        let mut statics = 0;
        loop {
            let page = s.scan(&l, &start, Bound::Unbounded, limit, 0).unwrap();
            assert!(scan_rows(&page) <= limit, "limit {limit}");
            for p in &page.partitions {
                if p.read.rows.is_empty() {
                    statics += 1;
                }
                for r in &p.read.rows {
                    seen.push((p.partition_key.clone(), r.clustering.clone()));
                }
            }
            match page.next {
                Some(n) => start = n,
                None => break,
            }
        }
        let expected: Vec<_> = full
            .partitions
            .iter()
            .flat_map(|p| {
                p.read
                    .rows
                    .iter()
                    .map(|r| (p.partition_key.clone(), r.clustering.clone()))
            })
            .collect();
        assert_eq!(seen, expected, "limit {limit}");
        assert_eq!(statics, 1, "limit {limit}");
    }

    // Token bounds: (p1, p4] holds p2, p3, p4.
    let page = s
        .scan(
            &l,
            &ScanStart::Token(Bound::Excluded(spread_token(1))),
            Bound::Included(spread_token(4)),
            100,
            0,
        )
        .unwrap();
    let names: Vec<_> = page
        .partitions
        .iter()
        .map(|p| p.partition_key.clone())
        .collect();
    assert_eq!(names, ["p2", "p3", "p4"].map(text));
    // A resumed partition carries its static row but does not count it again.
    let page = s
        .scan(
            &l,
            &ScanStart::Resume {
                token: spread_token(4),
                partition_key: text("p4"),
                after: Some(ck(1, "x")),
            },
            Bound::Excluded(spread_token(5)),
            100,
            0,
        )
        .unwrap();
    assert_eq!(page.partitions.len(), 1);
    assert_eq!(keys(&page.partitions[0].read), vec![ck(2, "x"), ck(3, "x")]);
    assert!(page.partitions[0].read.static_row.is_some());
}

#[test]
fn scan_skips_deleted_partitions_and_expired_rows() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill_partitions(&s, &l, 4);
    let mut m = mutation(T1, spread_token(2), "p2");
    m.partition_deletion = Some(5);
    s.apply(&[(&l, m)]).unwrap();
    let page = s
        .scan(
            &l,
            &ScanStart::Token(Bound::Unbounded),
            Bound::Unbounded,
            100,
            0,
        )
        .unwrap();
    let names: Vec<_> = page
        .partitions
        .iter()
        .map(|p| p.partition_key.clone())
        .collect();
    assert_eq!(names, ["p0", "p1", "p3"].map(text));
}

#[test]
fn truncate_removes_only_that_table() {
    let (_d, s) = open(periodic());
    let l = layout();
    fill_partitions(&s, &l, 40);
    let mut other = mutation(T2, 15, "q");
    other
        .rows
        .push(insert_row(vec![], vec![cell(1, "o", 1)], 1));
    let l2 = layout_no_ck(T2);
    s.apply(&[(&l2, other)]).unwrap();
    s.truncate(T1).unwrap();
    let page = s
        .scan(
            &l,
            &ScanStart::Token(Bound::Unbounded),
            Bound::Unbounded,
            100,
            0,
        )
        .unwrap();
    assert!(page.partitions.is_empty());
    assert!(read_all(&s, &l, spread_token(1), "p1", 0).rows.is_empty());
    assert_eq!(read_all(&s, &l2, 15, "q", 0).rows.len(), 1);
}

#[test]
fn concurrent_read_modify_write_is_linearizable() {
    let (_d, s) = open(periodic());
    let l = layout_no_ck(T2);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            let l = l.clone();
            std::thread::spawn(move || {
                for i in 0..250 {
                    let mut m = mutation(T2, 77, "ctr");
                    m.rows.push(RowMutation {
                        cells: vec![CellWrite {
                            value: CellValue::CounterDelta(1),
                            ..cell(1, "", i)
                        }],
                        ..Default::default()
                    });
                    s.apply(&[(&l, m)]).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let r = read_all(&s, &l, 77, "ctr", 0);
    assert_eq!(
        value(&r.rows[0], 1),
        Some(Bytes::copy_from_slice(&1000i64.to_be_bytes()))
    );
}

#[test]
fn multi_partition_batches_in_opposite_orders_do_not_deadlock() {
    let (_d, s) = open(periodic());
    let l = layout_no_ck(T2);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let s = s.clone();
            let l = l.clone();
            std::thread::spawn(move || {
                for i in 0..200i64 {
                    // Each batch adds 1 to 8 partition counters, visited in opposite
                    // orders by odd and even threads.
                    let mut parts: Vec<i64> = (0..8).collect();
                    if t % 2 == 1 {
                        parts.reverse();
                    }
                    let muts: Vec<_> = parts
                        .iter()
                        .map(|&p| {
                            let mut m = mutation(T2, p * 1_000_003, &format!("c{p}"));
                            m.rows.push(RowMutation {
                                cells: vec![CellWrite {
                                    value: CellValue::CounterDelta(1),
                                    ..cell(1, "", i)
                                }],
                                ..Default::default()
                            });
                            (&l, m)
                        })
                        .collect();
                    s.apply(&muts).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for p in 0..8i64 {
        let r = read_all(&s, &l, p * 1_000_003, &format!("c{p}"), 0);
        assert_eq!(
            value(&r.rows[0], 1),
            Some(Bytes::copy_from_slice(&800i64.to_be_bytes()))
        );
    }
}

#[test]
fn group_commit_shares_one_fsync_among_waiting_writers() {
    // Deterministic: the sync thread is held while 32 writers apply, so when it is
    // released one fsync must acknowledge all of them.
    const WRITERS: usize = 32;
    let (_d, s) = open_one_store(Durability::Batch);
    let l = layout_no_ck(T2);
    let hold = s.hold_sync();
    let before = s.fsync_count();
    let (tx, rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let s = s.clone();
            let l = l.clone();
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut m = mutation(T2, w as i64, &format!("w{w}"));
                m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
                let t = s.apply(&[(&l, m)]).unwrap();
                tx.send(()).unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(s.wait_durable(t)).unwrap();
            })
        })
        .collect();
    for _ in 0..WRITERS {
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    // Every write is applied (visible) but none is acknowledged durable yet.
    assert_eq!(s.fsync_count(), before);
    assert!(threads.iter().all(|t| !t.is_finished()));
    drop(hold);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(s.fsync_count() - before, 1);
}

#[test]
fn concurrent_durable_writers_all_acknowledged_and_readable() {
    let (_d, s) = open(Durability::Batch);
    let l = layout_no_ck(T2);
    const WRITERS: usize = 16;
    const ROUNDS: usize = 10;
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let s = s.clone();
            let l = l.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                for r in 0..ROUNDS {
                    let mut m = mutation(T2, w as i64, &format!("w{w}"));
                    m.rows.push(RowMutation {
                        cells: vec![cell(r as u16, "x", 1)],
                        ..Default::default()
                    });
                    let t = s.apply(&[(&l, m)]).unwrap();
                    rt.block_on(s.wait_durable(t)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(s.fsync_count() >= 1 && s.fsync_count() <= (WRITERS * ROUNDS) as u64);
    for w in 0..WRITERS {
        let r = read_all(&s, &l, w as i64, &format!("w{w}"), 0);
        assert_eq!(r.rows[0].cells.len(), ROUNDS);
    }
}

#[test]
fn periodic_mode_acknowledges_at_once_and_syncs_in_background() {
    let (_d, s) = open(Durability::Periodic {
        interval: Duration::from_millis(10),
    });
    let l = layout_no_ck(T2);
    let mut m = mutation(T2, 1, "k");
    m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
    let t = s.apply(&[(&l, m)]).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(s.wait_durable(t)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.fsync_count() == 0 {
        assert!(std::time::Instant::now() < deadline, "no background fsync");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `needle` is in a journal file as the OS has it (fjall preallocates the files, so
/// their size says nothing).
fn journal_in_os_contains(dir: &std::path::Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".jnl"))
        .any(|e| {
            let bytes = std::fs::read(e.path()).unwrap();
            bytes.windows(needle.len()).any(|w| w == needle)
        })
}

#[test]
fn periodic_mode_acknowledges_only_what_is_in_the_os_and_flushes_a_turn_at_once() {
    // A long interval: no timed fsync (which also flushes) interferes.
    let (dir, s) = open_one_store(Durability::Periodic {
        interval: Duration::from_secs(3600),
    });
    let l = layout_no_ck(T2);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // One write: appended to the buffer only, in the OS once its wait returns.
    let mut m = mutation(T2, 1, "first-write-marker");
    m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
    let t = s.apply(&[(&l, m)]).unwrap();
    assert!(
        !journal_in_os_contains(&dir.path().join("store-0"), b"first-write-marker"),
        "apply wrote to the OS"
    );
    rt.block_on(s.wait_durable(t)).unwrap();
    assert!(
        journal_in_os_contains(&dir.path().join("store-0"), b"first-write-marker"),
        "acknowledged but not in the OS"
    );
    // Sixty-four writers of one turn: one flush carries them all.
    const WRITERS: i64 = 64;
    let flushes = s.buffer_flush_count();
    let local = tokio::task::LocalSet::new();
    let handles: Vec<_> = (0..WRITERS)
        .map(|w| {
            let s = s.clone();
            let l = l.clone();
            local.spawn_local(async move {
                let mut m = mutation(T2, 10 + w, &format!("turn-writer-{w:02}"));
                m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
                let t = s.apply(&[(&l, m)]).unwrap();
                s.wait_durable(t).await.unwrap();
            })
        })
        .collect();
    local.block_on(&rt, async {
        for h in handles {
            h.await.unwrap();
        }
    });
    assert_eq!(s.buffer_flush_count() - flushes, 1);
    for w in 0..WRITERS {
        let marker = format!("turn-writer-{w:02}");
        assert!(
            journal_in_os_contains(&dir.path().join("store-0"), marker.as_bytes()),
            "{marker}"
        );
    }
    assert_eq!(s.fsync_count(), 0, "no fsync on the write path");
}

#[test]
fn close_makes_pending_tickets_durable_and_refuses_writes() {
    let (_d, s) = open(Durability::Batch);
    let l = layout_no_ck(T2);
    let mut m = mutation(T2, 1, "k");
    m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
    let t = s.apply(&[(&l, m.clone())]).unwrap();
    s.close().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(s.wait_durable(t.clone())).unwrap();
    assert_eq!(s.apply(&[(&l, m)]), Err(StorageError::Closed));
    // A ticket the closed storage never made durable fails instead of hanging.
    assert_eq!(
        rt.block_on(s.wait_durable(t.successor())),
        Err(StorageError::Closed)
    );
}

const CRASH_DIR_ENV: &str = "SLUICE_STORAGE_CRASH_DIR";

/// Child half of `acked_writes_survive_sigkill`: writes until killed, printing each
/// acknowledged (durable) write. Does nothing when run as a normal test.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var(CRASH_DIR_ENV) else {
        return;
    };
    use std::io::Write;
    let s = open_at(std::path::Path::new(&dir), Durability::Batch);
    let l = layout();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut stdout = std::io::stdout().lock();
    for i in 0.. {
        let mut m = mutation(T1, i % 64, &format!("k{}", i % 64));
        m.rows.push(insert_row(
            ck(i as i32, "c"),
            vec![cell(1, &format!("v{i}"), 1)],
            1,
        ));
        let t = s.apply(&[(&l, m)]).unwrap();
        rt.block_on(s.wait_durable(t)).unwrap();
        writeln!(stdout, "ACK {i}").unwrap();
        stdout.flush().unwrap();
    }
}

#[test]
fn acked_writes_survive_sigkill() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::crash_child_writer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CRASH_DIR_ENV, dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut acked = Vec::new();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("ACK ") {
            acked.push(n.parse::<i64>().unwrap());
            if acked.len() == 300 {
                break;
            }
        }
    }
    // SIGKILL: no destructor, no final flush.
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(acked.len(), 300, "child stopped early");

    let s = open_at(dir.path(), Durability::Batch);
    let l = layout();
    for i in acked {
        let pk = format!("k{}", i % 64);
        let r = s
            .read_partition(
                &l,
                i % 64,
                pk.as_bytes(),
                &ClusteringSlice {
                    ranges: vec![(
                        Bound::Included(ck(i as i32, "c")),
                        Bound::Included(ck(i as i32, "c")),
                    )],
                    reversed: false,
                },
                None,
                10,
                0,
            )
            .unwrap();
        assert_eq!(r.rows.len(), 1, "acknowledged write {i} lost");
        assert_eq!(value(&r.rows[0], 1), Some(text(&format!("v{i}"))));
    }
}

#[test]
fn group_commit_fsyncs_fjall_journal_directly() {
    // The side fsync relies on fjall's journal layout; if it changes, this fails (the
    // storage would still be correct, falling back to fjall's locked fsync).
    let (d, s) = open_one_store(Durability::Batch);
    let l = layout_no_ck(T2);
    let mut m = mutation(T2, 1, "k");
    m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
    s.apply(&[(&l, m)]).unwrap();
    let mut syncer = crate::journal_sync::JournalSyncer::new(&d.path().join("store-0"));
    assert_eq!(syncer.sync(), Ok(()));
}

mod model_check {
    //! Random operation sequences on one partition, checked against a model that recomputes
    //! the visible state from the whole operation log (no incremental merging), so the
    //! incremental LWW merge, key encoding and range mapping are tested against an
    //! independent formulation of Cassandra's rules.

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// (c1 ASC int, c2 DESC int).
    fn layout2() -> TableLayout {
        TableLayout {
            id: T1,
            clustering: vec![
                (CqlType::Native(NativeType::Int), Order::Asc),
                (CqlType::Native(NativeType::Int), Order::Desc),
            ],
            // Columns 0..3: `Op::WholeRow` sets them all, so it may skip the read.
            regular: Some(std::sync::Arc::new(RegularColumns::new(vec![
                (0, false),
                (1, false),
                (2, false),
            ]))),
            gc_grace_seconds: crate::DEFAULT_GC_GRACE_SECONDS,
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert {
            key: (i32, i32),
            ts: i64,
            expires: Option<u32>,
        },
        /// An INSERT of every regular column: liveness and the three cells.
        WholeRow {
            key: (i32, i32),
            values: [u8; 3],
            ts: i64,
            expires: Option<u32>,
        },
        Write {
            key: (i32, i32),
            col: u16,
            value: u8,
            ts: i64,
            expires: Option<u32>,
        },
        CellDelete {
            key: (i32, i32),
            col: u16,
            ts: i64,
        },
        RowDelete {
            key: (i32, i32),
            ts: i64,
        },
        RangeDelete {
            lo: Bound<i32>,
            hi: Bound<i32>,
            ts: i64,
        },
        PartitionDelete {
            ts: i64,
        },
    }

    fn bound() -> impl Strategy<Value = Bound<i32>> {
        prop_oneof![
            Just(Bound::Unbounded),
            (-2i32..3).prop_map(Bound::Included),
            (-2i32..3).prop_map(Bound::Excluded),
        ]
    }

    /// Reads happen at `NOW`: expiry 1 is in the past, 3 in the future.
    const NOW: u32 = 2;

    fn expires() -> impl Strategy<Value = Option<u32>> {
        prop_oneof![2 => Just(None), 1 => Just(Some(1)), 1 => Just(Some(3))]
    }

    fn op() -> impl Strategy<Value = Op> {
        let key = (-2i32..3, -2i32..3);
        let ts = 0i64..12;
        prop_oneof![
            3 => (key.clone(), ts.clone(), expires())
                .prop_map(|(key, ts, expires)| Op::Insert { key, ts, expires }),
            3 => (key.clone(), [0u8..3, 0u8..3, 0u8..3], ts.clone(), expires())
                .prop_map(|(key, values, ts, expires)| Op::WholeRow { key, values, ts, expires }),
            6 => (key.clone(), 0u16..3, 0u8..3, ts.clone(), expires())
                .prop_map(|(key, col, value, ts, expires)| Op::Write { key, col, value, ts, expires }),
            2 => (key.clone(), 0u16..3, ts.clone()).prop_map(|(key, col, ts)| Op::CellDelete { key, col, ts }),
            2 => (key, ts.clone()).prop_map(|(key, ts)| Op::RowDelete { key, ts }),
            2 => (bound(), bound(), ts.clone()).prop_map(|(lo, hi, ts)| Op::RangeDelete { lo, hi, ts }),
            1 => ts.prop_map(|ts| Op::PartitionDelete { ts }),
        ]
    }

    fn ckey(k: (i32, i32)) -> Vec<Bytes> {
        vec![int(k.0), int(k.1)]
    }

    /// The mutation of `op`, its timestamps shifted by `base` (each case its own range, so
    /// that the cases sharing one store and its stripes do not hide each other's newest).
    fn to_mutation(op: &Op, token: i64, pk: &str, base: i64) -> Mutation {
        let mut m = mutation(T1, token, pk);
        let op = &shifted(op, base);
        match op {
            // One row with the insert's liveness and the three writes' cells, exactly as
            // the model expands it.
            Op::WholeRow { key, .. } => {
                let mut row = RowMutation {
                    clustering: ckey(*key),
                    ..Default::default()
                };
                for part in expanded(std::slice::from_ref(op)) {
                    // `op` is shifted already.
                    for r in to_mutation(&part, token, pk, 0).rows {
                        row.liveness = row.liveness.or(r.liveness);
                        row.cells.extend(r.cells);
                    }
                }
                m.rows.push(row);
            }
            Op::Insert { key, ts, expires } => m.rows.push(RowMutation {
                clustering: ckey(*key),
                liveness: Some(Liveness {
                    timestamp: *ts,
                    expiry: expires.map(|at| (at, 10)),
                }),
                ..Default::default()
            }),
            Op::Write {
                key,
                col,
                value,
                ts,
                expires,
            } => m.rows.push(RowMutation {
                clustering: ckey(*key),
                cells: vec![CellWrite {
                    column: *col,
                    path: None,
                    value: CellValue::Live(Bytes::from(vec![*value])),
                    timestamp: *ts,
                    expiry: expires.map(|at| (at, 10)),
                }],
                ..Default::default()
            }),
            Op::CellDelete { key, col, ts } => m.rows.push(RowMutation {
                clustering: ckey(*key),
                cells: vec![CellWrite {
                    column: *col,
                    path: None,
                    value: CellValue::Tombstone,
                    timestamp: *ts,
                    expiry: None,
                }],
                ..Default::default()
            }),
            Op::RowDelete { key, ts } => m.rows.push(RowMutation {
                clustering: ckey(*key),
                deletion: Some(*ts),
                ..Default::default()
            }),
            Op::RangeDelete { lo, hi, ts } => m.range_deletions.push(RangeDeletion {
                start: lo.map(|v| vec![int(v)]),
                end: hi.map(|v| vec![int(v)]),
                timestamp: *ts,
            }),
            Op::PartitionDelete { ts } => m.partition_deletion = Some(*ts),
        }
        m
    }

    fn shifted(op: &Op, base: i64) -> Op {
        let mut op = op.clone();
        match &mut op {
            Op::Insert { ts, .. }
            | Op::WholeRow { ts, .. }
            | Op::Write { ts, .. }
            | Op::CellDelete { ts, .. }
            | Op::RowDelete { ts, .. }
            | Op::RangeDelete { ts, .. }
            | Op::PartitionDelete { ts } => *ts += base,
        }
        op
    }

    /// The operations as the model sees them: a whole-row write is an insert and three writes.
    fn expanded(ops: &[Op]) -> Vec<Op> {
        ops.iter()
            .flat_map(|op| match op {
                Op::WholeRow {
                    key,
                    values,
                    ts,
                    expires,
                } => std::iter::once(Op::Insert {
                    key: *key,
                    ts: *ts,
                    expires: *expires,
                })
                .chain((0u16..3).map(|col| Op::Write {
                    key: *key,
                    col,
                    value: values[col as usize],
                    ts: *ts,
                    expires: *expires,
                }))
                .collect::<Vec<_>>(),
                other => vec![other.clone()],
            })
            .collect()
    }

    fn in_bounds(v: i32, lo: &Bound<i32>, hi: &Bound<i32>) -> bool {
        (match lo {
            Bound::Unbounded => true,
            Bound::Included(l) => v >= *l,
            Bound::Excluded(l) => v > *l,
        }) && (match hi {
            Bound::Unbounded => true,
            Bound::Included(h) => v <= *h,
            Bound::Excluded(h) => v < *h,
        })
    }

    /// The visible rows by the model: (key, has_liveness, [(col, value, ts)]), in
    /// clustering order (c1 ascending, c2 descending).
    fn model(ops: &[Op]) -> Vec<((i32, i32), bool, Vec<(u16, u8, i64)>)> {
        let ops = &expanded(ops);
        let keys: BTreeSet<(i32, i32)> = ops
            .iter()
            .filter_map(|op| match op {
                Op::Insert { key, .. }
                | Op::Write { key, .. }
                | Op::CellDelete { key, .. }
                | Op::RowDelete { key, .. } => Some(*key),
                Op::WholeRow { .. } => unreachable!("expanded"),
                _ => None,
            })
            .collect();
        let mut keys: Vec<_> = keys.into_iter().collect();
        keys.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        let mut out = Vec::new();
        for key in keys {
            let deletion = ops
                .iter()
                .filter_map(|op| match op {
                    Op::PartitionDelete { ts } => Some(*ts),
                    Op::RowDelete { key: k, ts } if *k == key => Some(*ts),
                    Op::RangeDelete { lo, hi, ts } if in_bounds(key.0, lo, hi) => Some(*ts),
                    _ => None,
                })
                .max();
            let alive = |ts: i64| deletion.is_none_or(|d| ts > d);
            // Liveness is last-write-wins too; on equal timestamps an expiring one wins,
            // the later expiry first.
            let liveness = ops
                .iter()
                .filter_map(|op| match op {
                    Op::Insert {
                        key: k,
                        ts,
                        expires,
                    } if *k == key => Some((*ts, expires.is_some(), expires.unwrap_or(0))),
                    _ => None,
                })
                .max();
            let has_liveness =
                liveness.is_some_and(|(ts, expiring, at)| alive(ts) && (!expiring || at > NOW));
            let mut cells = Vec::new();
            for col in 0..3u16 {
                // Winner: highest timestamp; on ties a tombstone, then an expiring cell
                // (the later expiry first), then a cell without TTL; then the greater value.
                // An expired winner still hides older values, as the tombstone it has become.
                let winner = ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::Write {
                            key: k,
                            col: c,
                            value,
                            ts,
                            expires,
                        } => (*k == key && *c == col).then_some(match expires {
                            Some(at) => (*ts, 1u8, *at, *value),
                            None => (*ts, 0u8, 0, *value),
                        }),
                        Op::CellDelete { key: k, col: c, ts } if *k == key && *c == col => {
                            Some((*ts, 2u8, 0, 0))
                        }
                        _ => None,
                    })
                    .max();
                if let Some((ts, class, at, value)) = winner {
                    if class < 2 && alive(ts) && (class == 0 || at > NOW) {
                        cells.push((col, value, ts));
                    }
                }
            }
            if has_liveness || !cells.is_empty() {
                out.push((key, has_liveness, cells));
            }
        }
        out
    }

    fn observed(read: &PartitionRead, base: i64) -> Vec<((i32, i32), bool, Vec<(u16, u8, i64)>)> {
        read.rows
            .iter()
            .map(|r| {
                let k = |b: &Bytes| i32::from_be_bytes(b[..].try_into().unwrap());
                let cells = r
                    .cells
                    .iter()
                    .map(|c| (c.column, c.value[0], c.timestamp - base))
                    .collect();
                (
                    (k(&r.clustering[0]), k(&r.clustering[1])),
                    r.has_liveness,
                    cells,
                )
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn storage_matches_log_model(
            ops in proptest::collection::vec(op(), 1..40),
            batch_sizes in proptest::collection::vec(1usize..4, 40),
            lo in bound(),
            hi in bound(),
            reversed: bool,
            limit in 1usize..6,
        ) {
            // One database for all cases (opening one per case dominates the run time);
            // each case writes its own partition.
            static DB: std::sync::OnceLock<(tempfile::TempDir, Storage)> = std::sync::OnceLock::new();
            static NEXT: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
            let s = &DB.get_or_init(|| open(periodic())).1;
            let token = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let pk = format!("part{token}");
            let base = token * 100;
            let l = layout2();
            // Apply in random groups: several mutations of one partition in one apply
            // exercise the pre-lock merge as well as the stored merge.
            let mut rest = &ops[..];
            for n in batch_sizes {
                if rest.is_empty() {
                    break;
                }
                let (now, later) = rest.split_at(n.min(rest.len()));
                let batch: Vec<_> = now.iter().map(|op| (&l, to_mutation(op, token, &pk, base))).collect();
                s.apply(&batch).unwrap();
                rest = later;
            }
            let expected = model(&ops);
            let got = read_all(s, &l, token, &pk, NOW);
            prop_assert_eq!(observed(&got, base), expected.clone());
            // Whole-row writes newer than their stripe took the path without a read by now.
            if token >= 64 {
                prop_assert!(s.replaced_row_count() > 0);
            }

            // A c1 slice, paged with `after`, forward or reversed.
            let mut want: Vec<_> = expected.into_iter().filter(|(k, _, _)| in_bounds(k.0, &lo, &hi)).collect();
            if reversed {
                want.reverse();
            }
            let slice = ClusteringSlice {
                ranges: vec![(lo.map(|v| vec![int(v)]), hi.map(|v| vec![int(v)]))],
                reversed,
            };
            let mut seen = Vec::new();
            let mut after: Option<Vec<Bytes>> = None;
            loop {
                let page = s.read_partition(&l, token, pk.as_bytes(), &slice, after.as_deref(), limit, NOW).unwrap();
                prop_assert!(page.rows.len() <= limit);
                seen.extend(observed(&page, base));
                if !page.more {
                    break;
                }
                after = Some(page.rows.last().unwrap().clustering.clone());
            }
            prop_assert_eq!(seen, want);
        }
    }
}

mod stores {
    //! The data spread over several stores: which store owns what, batches that span
    //! stores and their batchlog, and how a data directory keeps its layout.

    use super::*;

    /// A one-row mutation of partition `p{i}` at `spread_token(i)`.
    fn row_of(i: i64) -> Mutation {
        let mut m = mutation(T2, spread_token(i), &format!("p{i}"));
        m.rows
            .push(insert_row(vec![], vec![cell(1, &format!("v{i}"), 1)], 1));
        m
    }

    fn has_row(s: &Storage, i: i64) -> bool {
        !read_all(s, &layout_no_ck(T2), spread_token(i), &format!("p{i}"), 0)
            .rows
            .is_empty()
    }

    #[test]
    fn partitions_spread_over_the_stores_as_over_the_shards() {
        let (_d, s) = open(periodic());
        assert_eq!(s.store_count(), STORES);
        let owners: Vec<usize> = (0..3).map(|i| s.store_of(spread_token(i))).collect();
        assert_eq!(owners, [0, 1, 2]);
        // The same function routes requests to shards.
        for token in [i64::MIN, -7, 0, 7, spread_token(1), i64::MAX] {
            assert_eq!(
                s.store_of(token),
                sluice_types::token::shard_of(token, STORES as u32, 12) as usize
            );
        }
    }

    #[test]
    fn a_batch_across_stores_is_whole_and_leaves_no_batchlog_once_durable() {
        for durability in [Durability::Batch, periodic()] {
            let (_d, s) = open(durability);
            let l = layout_no_ck(T2);
            let batch: Vec<_> = (0..6).map(|i| (&l, row_of(i))).collect();
            let ticket = s.apply(&batch).unwrap();
            // Visible at once; the record waits in every store the batch touched.
            assert!((0..6).all(|i| has_row(&s, i)));
            assert_eq!(s.batchlog_records(), vec![1; STORES]);
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(s.wait_durable(ticket)).unwrap();
            assert_eq!(s.batchlog_records(), vec![0; STORES]);
            // A batch within one store writes no record.
            let one = [(&l, row_of(0)), (&l, row_of(3))];
            let ticket = s.apply(&one).unwrap();
            assert_eq!(s.batchlog_records(), vec![0; STORES]);
            rt.block_on(s.wait_durable(ticket)).unwrap();
        }
    }

    #[test]
    fn a_batch_cut_short_by_a_crash_is_completed_when_storage_opens() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout_no_ck(T2);
        {
            let s = open_at(dir.path(), Durability::Batch);
            let batch: Vec<_> = (0..3).map(|i| (&l, row_of(i))).collect();
            s.apply_first_part_only(&batch).unwrap();
            // Only the first store's part is there.
            assert_eq!(
                (0..3).map(|i| has_row(&s, i)).collect::<Vec<_>>(),
                [true, false, false]
            );
            assert_eq!(s.batchlog_records(), vec![1, 0, 0]);
            // Partition p1, not yet written by the batch, gets a newer value meanwhile.
            let mut newer = mutation(T2, spread_token(1), "p1");
            newer
                .rows
                .push(insert_row(vec![], vec![cell(1, "newer", 5)], 5));
            s.apply(&[(&l, newer)]).unwrap();
            s.close().unwrap();
        }
        let p1 = |s: &Storage| {
            let read = read_all(s, &l, spread_token(1), "p1", 0);
            value(&read.rows[0], 1)
        };
        let s = open_at(dir.path(), Durability::Batch);
        assert!((0..3).all(|i| has_row(&s, i)), "the batch is completed");
        assert_eq!(
            p1(&s),
            Some(text("newer")),
            "the replay merged by timestamp"
        );
        assert_eq!(s.batchlog_records(), vec![0; STORES]);
        // Replayed once: opening again finds nothing to replay and changes nothing.
        s.close().unwrap();
        drop(s);
        let s = open_at(dir.path(), Durability::Batch);
        assert!((0..3).all(|i| has_row(&s, i)));
        assert_eq!(p1(&s), Some(text("newer")));
        assert_eq!(s.batchlog_records(), vec![0; STORES]);
    }

    #[test]
    fn a_data_directory_keeps_its_number_of_stores() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout_no_ck(T2);
        {
            let s = open_with_stores(dir.path(), Durability::Batch, 2);
            let batch: Vec<_> = (0..4).map(|i| (&l, row_of(i))).collect();
            s.apply(&batch).unwrap();
            s.close().unwrap();
        }
        let s = open_with_stores(dir.path(), Durability::Batch, 5);
        assert_eq!(s.store_count(), 2);
        assert!((0..4).all(|i| has_row(&s, i)));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("STORES")).unwrap(),
            "2\n"
        );
    }

    #[test]
    fn a_directory_from_before_stores_is_one_store() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout_no_ck(T2);
        {
            // What a data directory held before stores: one fjall database at its root.
            let store = crate::store::Store::open(dir.path(), Durability::Batch, 8 << 20).unwrap();
            let prepared = crate::store::Store::prepare(&[(&l, row_of(1))]).unwrap();
            store.commit(prepared, None).unwrap();
            store.close().unwrap();
        }
        let s = open_with_stores(dir.path(), Durability::Batch, 4);
        assert_eq!(s.store_count(), 1);
        assert!(has_row(&s, 1));
        assert!(!dir.path().join("STORES").exists());
    }

    /// Overwrites of a few keys keep the memtable small (the versions they supersede are
    /// dropped), so it never fills; the sync thread still seals it after a bound of journal
    /// bytes, so that fjall flushes it and the journal can rotate instead of growing forever.
    #[test]
    fn overwrites_that_never_fill_the_memtable_still_seal_it_for_the_journal() {
        for durability in [Durability::Batch, periodic()] {
            let dir = tempfile::tempdir().unwrap();
            let l = layout_no_ck(T2);
            let store = crate::store::Store::open_with_journal_bound(
                dir.path(),
                durability,
                8 << 20,
                256 << 10,
            )
            .unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            let big = "x".repeat(1000);
            // 2,000 writes of about 1 KiB to 10 keys: about 2 MiB of journal, 8 bounds' worth.
            for i in 0..2000u32 {
                let mut m = mutation(T2, i64::from(i % 10), &format!("k{}", i % 10));
                let ts = i64::from(i) + 1;
                m.rows.push(insert_row(vec![], vec![cell(1, &big, ts)], ts));
                let prepared = crate::store::Store::prepare(&[(&l, m)]).unwrap();
                let ticket = store.commit(prepared, None).unwrap();
                if i % 200 == 199 {
                    // The sync thread checks after each fsync (batch) or 100 ms (periodic).
                    rt.block_on(store.wait_durable(ticket)).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(120));
                }
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while store.data_table_count() == 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let sealed = store.memtables_sealed_for_journal();
            assert!(sealed >= 4, "{durability:?}: sealed {sealed} memtables");
            assert!(
                store.data_table_count() >= 1,
                "{durability:?}: nothing flushed"
            );
            store.close().unwrap();
        }
    }

    /// A clean close leaves the data in disk tables and no journal to replay: the next start
    /// reads them from disk instead of rebuilding memtables from the journal.
    #[test]
    fn a_clean_close_flushes_the_memtables_to_disk_tables() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout_no_ck(T2);
        let store = crate::store::Store::open(dir.path(), periodic(), 8 << 20).unwrap();
        for i in 0..500i64 {
            let mut m = mutation(T2, i, &format!("k{i}"));
            m.rows
                .push(insert_row(vec![], vec![cell(1, "v", i + 1)], i + 1));
            let prepared = crate::store::Store::prepare(&[(&l, m)]).unwrap();
            store.commit(prepared, None).unwrap();
        }
        assert_eq!(store.data_table_count(), 0, "flushed before the close");
        let journals_before = store.journal_count();
        store.close().unwrap();
        assert!(store.data_table_count() >= 1, "nothing flushed at close");
        assert!(
            store.journal_count() <= journals_before,
            "journals: {} before the close, {} after",
            journals_before,
            store.journal_count()
        );
        drop(store);

        let store = crate::store::Store::open(dir.path(), periodic(), 8 << 20).unwrap();
        for i in [0i64, 250, 499] {
            let read = store
                .read_partition(
                    &l,
                    i,
                    format!("k{i}").as_bytes(),
                    &ClusteringSlice::all(),
                    None,
                    usize::MAX,
                    0,
                )
                .unwrap();
            assert_eq!(read.rows.len(), 1, "row k{i} after the reopen");
        }
        store.close().unwrap();
    }

    #[test]
    fn a_bad_stores_file_is_an_error_not_a_new_layout() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("STORES"), "lots\n").unwrap();
        let opened = Storage::open(StorageConfig {
            path: dir.path().to_path_buf(),
            durability: Durability::Batch,
            cache_bytes: 8 << 20,
            stores: 2,
        });
        assert!(matches!(opened, Err(StorageError::Corrupt(_))));
    }

    #[test]
    fn scans_merge_the_stores_in_token_order() {
        let (_d, s) = open(periodic());
        let l = layout_no_ck(T2);
        // 60 partitions at Murmur3 tokens of their keys, written one by one.
        let mut tokens: Vec<(i64, String)> = (0..60)
            .map(|i| {
                let pk = format!("k{i}");
                (sluice_types::murmur3_token(pk.as_bytes()), pk)
            })
            .collect();
        for (token, pk) in &tokens {
            let mut m = mutation(T2, *token, pk);
            m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
            s.apply(&[(&l, m)]).unwrap();
        }
        let mut per_store = [0usize; STORES];
        for (token, _) in &tokens {
            per_store[s.store_of(*token)] += 1;
        }
        assert!(per_store.iter().all(|&n| n > 0), "{per_store:?}");
        tokens.sort();
        let mut seen = Vec::new();
        let mut start = ScanStart::Token(Bound::Unbounded);
        loop {
            let page = s.scan(&l, &start, Bound::Unbounded, 7, 0).unwrap();
            for p in &page.partitions {
                seen.push((
                    p.token,
                    String::from_utf8(p.partition_key.to_vec()).unwrap(),
                ));
            }
            match page.next {
                Some(next) => start = next,
                None => break,
            }
        }
        assert_eq!(seen, tokens);
    }
}

/// Each table's data lives in keyspaces of its own: TRUNCATE and DROP TABLE switch keyspaces
/// at once and delete the old ones in the background.
mod table_keyspaces {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// Rows per partition of the big table.
    const ROWS_PER_PARTITION: i32 = 1_000;

    /// Writes `partitions` partitions of [`ROWS_PER_PARTITION`] rows each to `l`'s table.
    fn fill_big(s: &Storage, l: &TableLayout, partitions: i64) {
        for p in 0..partitions {
            let mut m = mutation(l.id, spread_token(p), &format!("big{p}"));
            for r in 0..ROWS_PER_PARTITION {
                m.rows
                    .push(insert_row(ck(r, "x"), vec![cell(1, "value", 1)], 1));
            }
            s.apply(&[(l, m)]).unwrap();
        }
    }

    fn write_small(s: &Storage, token: i64, pk: &str) {
        let mut m = mutation(T2, token, pk);
        m.rows
            .push(insert_row(vec![], vec![cell(1, "small", 1)], 1));
        s.apply(&[(&layout_no_ck(T2), m)]).unwrap();
    }

    /// Result rows of the first page (at most 1,000) of a scan of the whole table.
    fn scan_first_page(s: &Storage, l: &TableLayout) -> usize {
        let page = s
            .scan(
                l,
                &ScanStart::Token(Bound::Unbounded),
                Bound::Unbounded,
                1_000,
                0,
            )
            .unwrap();
        scan_rows(&page)
    }

    /// Waits, at most 20 s, until every retired keyspace's files are gone.
    fn wait_for_deletions(s: &Storage) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.pending_table_deletions() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(s.pending_table_deletions(), 0, "deletions left pending");
    }

    /// True when fjall lists none of `names` (store index, name) in their stores.
    fn all_gone(s: &Storage, names: &[(usize, String)]) -> bool {
        let listed = s.keyspace_names();
        names
            .iter()
            .all(|(store, name)| !listed[*store].contains(name))
    }

    /// Keyspace folders on disk over every store.
    fn keyspace_folders(dir: &std::path::Path) -> usize {
        (0..STORES)
            .map(|i| {
                std::fs::read_dir(dir.join(format!("store-{i}")).join("keyspaces"))
                    .unwrap()
                    .count()
            })
            .sum()
    }

    /// Every keyspace folder on disk belongs to a keyspace fjall lists (fjall's own meta
    /// keyspace has one more folder per store).
    fn no_stray_folders(dir: &std::path::Path, s: &Storage) {
        let listed: usize = s.keyspace_names().iter().map(Vec::len).sum();
        assert_eq!(
            keyspace_folders(dir),
            listed + STORES,
            "{:?}",
            s.keyspace_names()
        );
    }

    /// Reads of one partition of another table, in a loop on their own thread, until
    /// stopped: the number done and the slowest one.
    struct Reader {
        stop: Arc<AtomicBool>,
        done: Arc<AtomicU64>,
        thread: std::thread::JoinHandle<Duration>,
    }

    impl Reader {
        fn start(s: &Storage) -> Reader {
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let (s, flag, count) = (s.clone(), stop.clone(), done.clone());
            let thread = std::thread::spawn(move || {
                let mut slowest = Duration::ZERO;
                let l = layout_no_ck(T2);
                while !flag.load(Ordering::Acquire) {
                    let started = Instant::now();
                    assert_eq!(read_all(&s, &l, 7, "other", 0).rows.len(), 1);
                    slowest = slowest.max(started.elapsed());
                    count.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(200));
                }
                slowest
            });
            Reader { stop, done, thread }
        }

        /// Waits until `n` more reads are done than `after`.
        fn wait_for(&self, after: u64, n: u64) -> u64 {
            while self.done.load(Ordering::Relaxed) < after + n {
                std::thread::sleep(Duration::from_millis(1));
            }
            self.done.load(Ordering::Relaxed)
        }

        fn stop(self) -> Duration {
            self.stop.store(true, Ordering::Release);
            self.thread.join().unwrap()
        }
    }

    /// The purge counters follow a TRUNCATE and a DROP TABLE through to their files' removal.
    #[test]
    fn purge_counters_count_the_tables_and_bytes_deleted_in_the_background() {
        let (_dir, s) = open(periodic());
        let l = layout();
        assert_eq!(s.purge_stats(), PurgeStats::default());
        fill_big(&s, &l, 20);
        s.flush_memtables(Duration::from_secs(60));
        s.truncate(l.id).unwrap();
        wait_for_deletions(&s);
        let after_truncate = s.purge_stats();
        assert_eq!(after_truncate.tables_pending, 0);
        // Every store whose keyspace held part of the table (20 partitions spread over them).
        assert_eq!(after_truncate.tables_purged, STORES as u64);
        assert!(
            after_truncate.table_bytes_purged > 20 * 1_000 * 5,
            "{after_truncate:?}"
        );
        assert!(after_truncate.table_purge_steps >= after_truncate.tables_purged);
        fill_big(&s, &l, 2);
        s.drop_table(l.id).unwrap();
        wait_for_deletions(&s);
        let after_drop = s.purge_stats();
        assert_eq!(
            after_drop.tables_purged,
            after_truncate.tables_purged + STORES as u64
        );
        assert!(after_drop.table_bytes_purged >= after_truncate.table_bytes_purged);
        assert!(after_drop.table_purge_steps > after_truncate.table_purge_steps);
        assert_eq!(after_drop.row_purges_queued, 0);
    }

    /// A table with many rows on disk and in memtables is truncated, then filled and dropped,
    /// each in well under a second, while another table's reads go on; its old keyspaces
    /// are then deleted in the background, leaving no folder behind.
    #[test]
    fn truncate_and_drop_take_no_time_on_a_big_table_while_another_table_reads() {
        let (dir, s) = open(periodic());
        let l = layout();
        write_small(&s, 7, "other");
        fill_big(&s, &l, 150);
        // Most of it in disk tables, the rest in memtables.
        s.flush_memtables(Duration::from_secs(60));
        fill_big(&s, &l, 20);
        // Another table with writes in the journal that it does not flush by itself: fjall
        // keeps the journal, and with it the retired keyspaces, until it does.
        write_small(&s, 8, "unflushed");
        // The second fill rewrote 20 of the partitions.
        assert_eq!(s.raw_entry_count(T1), 150 * 1_000);
        let first = s.table_keyspace_names(T1);
        assert_eq!(first.len(), STORES, "the big table is in every store");

        let reader = Reader::start(&s);
        let done = reader.wait_for(0, 10);
        let started = Instant::now();
        s.truncate(T1).unwrap();
        let truncate_took = started.elapsed();
        assert_eq!(scan_first_page(&s, &l), 0, "a truncated table scans empty");
        assert!(read_all(&s, &l, spread_token(3), "big3", 0).rows.is_empty());
        assert_eq!(s.raw_entry_count(T1), 0);
        let second = s.table_keyspace_names(T1);
        assert_eq!(second.len(), STORES);
        assert!(second.iter().all(|n| !first.contains(n)), "fresh keyspaces");

        fill_big(&s, &l, 20);
        assert_eq!(s.raw_entry_count(T1), 20 * 1_000);
        let started = Instant::now();
        s.drop_table(T1).unwrap();
        let drop_took = started.elapsed();
        assert_eq!(scan_first_page(&s, &l), 0, "a dropped table scans empty");
        assert!(
            s.table_keyspace_names(T1).is_empty(),
            "a dropped table has no keyspace"
        );

        reader.wait_for(done, 10);
        let slowest_read = reader.stop();
        eprintln!(
            "truncate {truncate_took:?}, drop {drop_took:?}, slowest concurrent read {slowest_read:?}"
        );
        assert!(
            truncate_took < Duration::from_secs(1),
            "truncate took {truncate_took:?}"
        );
        assert!(
            drop_took < Duration::from_secs(1),
            "drop took {drop_took:?}"
        );
        assert!(
            slowest_read < Duration::from_secs(1),
            "a read took {slowest_read:?}"
        );

        wait_for_deletions(&s);
        let retired: Vec<(usize, String)> = first.into_iter().chain(second).collect();
        assert!(
            all_gone(&s, &retired),
            "{retired:?} in {:?}",
            s.keyspace_names()
        );
        no_stray_folders(dir.path(), &s);
        assert_eq!(read_all(&s, &layout_no_ck(T2), 7, "other", 0).rows.len(), 1);
        s.close().unwrap();
    }

    /// Truncates and drops recorded before a restart hold after it, even when the
    /// background deletion had not run: the old data is not visible and its keyspaces go.
    #[test]
    fn a_restart_in_the_middle_of_a_deletion_shows_no_old_data_and_leaks_no_keyspace() {
        let dir = tempfile::tempdir().unwrap();
        let l = layout();
        let l3 = TableLayout {
            id: [3; 16],
            ..layout()
        };
        let retired = {
            let s = open_at(dir.path(), periodic());
            write_small(&s, 7, "other");
            fill_big(&s, &l, 30);
            fill_big(&s, &l3, 30);
            s.flush_memtables(Duration::from_secs(60));
            let retired: Vec<(usize, String)> = s
                .table_keyspace_names(T1)
                .into_iter()
                .chain(s.table_keyspace_names(l3.id))
                .collect();
            assert_eq!(retired.len(), 2 * STORES, "both tables are in every store");
            let held = s.hold_deleters();
            s.truncate(T1).unwrap();
            s.drop_table(l3.id).unwrap();
            assert_eq!(scan_first_page(&s, &l), 0);
            assert_eq!(scan_first_page(&s, &l3), 0);
            assert_eq!(s.pending_table_deletions(), 2 * STORES);
            // Stopped with the deletions still queued, as by a crash.
            s.close().unwrap();
            drop(held);
            retired
        };
        let s = open_at(dir.path(), periodic());
        assert_eq!(scan_first_page(&s, &l), 0, "truncated data stays gone");
        assert_eq!(s.raw_entry_count(T1), 0);
        assert_eq!(scan_first_page(&s, &l3), 0, "dropped data stays gone");
        assert_eq!(read_all(&s, &layout_no_ck(T2), 7, "other", 0).rows.len(), 1);
        wait_for_deletions(&s);
        assert!(
            all_gone(&s, &retired),
            "{retired:?} in {:?}",
            s.keyspace_names()
        );
        assert!(s.table_keyspace_names(l3.id).is_empty());
        // The truncated table takes writes again; the dropped one discards them.
        fill_big(&s, &l, 2);
        fill_big(&s, &l3, 2);
        assert_eq!(s.raw_entry_count(T1), 2 * 1_000);
        assert_eq!(scan_first_page(&s, &l3), 0);
        assert!(s.table_keyspace_names(l3.id).is_empty());
        no_stray_folders(dir.path(), &s);
        s.close().unwrap();
        drop(s);
        let s = open_at(dir.path(), periodic());
        assert_eq!(s.raw_entry_count(T1), 2 * 1_000);
        assert_eq!(
            scan_first_page(&s, &l3),
            0,
            "a write after the drop stays discarded"
        );
        assert!(s.table_keyspace_names(l3.id).is_empty());
        s.close().unwrap();
    }

    /// A data directory written by an earlier version (every table in one keyspace) is
    /// refused with an error that says so, not read as empty.
    #[test]
    fn a_directory_with_the_shared_keyspace_layout_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = fjall::Database::builder(dir.path()).open().unwrap();
            let data = db
                .keyspace("data", fjall::KeyspaceCreateOptions::default)
                .unwrap();
            data.insert([1u8; 30], b"row").unwrap();
            db.persist(fjall::PersistMode::SyncAll).unwrap();
        }
        let err = Storage::open(StorageConfig {
            path: dir.path().to_path_buf(),
            durability: periodic(),
            cache_bytes: 8 << 20,
            stores: 1,
        })
        .unwrap_err();
        assert!(
            matches!(err, StorageError::Corrupt(m) if m.contains("earlier version")),
            "{err}"
        );
    }
}

/// A partition of `rows` rows of `row_bytes` each under token 7, key "big".
fn fill_big_partition(s: &Storage, l: &TableLayout, rows: i32, row_bytes: usize) {
    let value = "x".repeat(row_bytes);
    for c1 in 0..rows {
        let mut m = mutation(T1, 7, "big");
        m.rows
            .push(insert_row(ck(c1, "r"), vec![cell(1, &value, 1)], 1));
        s.apply(&[(l, m)]).unwrap();
    }
}

#[test]
fn a_partition_of_big_rows_is_read_in_pieces_of_bounded_bytes() {
    let (_d, s) = open(periodic());
    let l = layout();
    let row_bytes = 256 << 10;
    let rows = 40; // 10 MiB, more than twice MAX_READ_BYTES
    fill_big_partition(&s, &l, rows, row_bytes);
    let most_rows = MAX_READ_BYTES / row_bytes + 1;
    let mut after: Option<Vec<Bytes>> = None;
    let mut seen = Vec::new();
    let mut calls = 0;
    loop {
        let read = s
            .read_partition(
                &l,
                7,
                b"big",
                &ClusteringSlice::all(),
                after.as_deref(),
                usize::MAX,
                0,
            )
            .unwrap();
        calls += 1;
        assert!(!read.rows.is_empty());
        assert!(
            read.rows.len() <= most_rows,
            "one read returned {} rows of {row_bytes} bytes",
            read.rows.len()
        );
        for r in &read.rows {
            assert_eq!(value(r, 1).map(|v| v.len()), Some(row_bytes));
            seen.push(r.clustering.clone());
        }
        after = read.rows.last().map(|r| r.clustering.clone());
        if !read.more {
            break;
        }
    }
    assert_eq!(seen, (0..rows).map(|c| ck(c, "r")).collect::<Vec<_>>());
    assert!(calls >= 3, "{calls} reads for 10 MiB");

    // A scan stops at the same bound and resumes inside the partition.
    let mut start = ScanStart::Token(Bound::Unbounded);
    let mut scanned = 0;
    loop {
        let page = s.scan(&l, &start, Bound::Unbounded, usize::MAX, 0).unwrap();
        let n = scan_rows(&page);
        assert!(n <= most_rows, "one scan page returned {n} big rows");
        scanned += n;
        match page.next {
            Some(next) => start = next,
            None => break,
        }
    }
    assert_eq!(scanned, rows as usize);
}

#[test]
fn a_full_disk_refuses_writes_keeps_reads_and_recovers_when_space_is_freed() {
    let (_d, s) = open(periodic());
    let l = layout();
    let write = |v: &str, ts: i64| {
        let mut m = mutation(T1, 7, "p");
        m.rows
            .push(insert_row(ck(1, "a"), vec![cell(1, v, ts)], ts));
        s.apply(&[(&l, m)])
    };
    write("before", 1).unwrap();
    s.set_min_free_disk_bytes(64 << 20);
    s.assume_free_disk_bytes(Some(10 << 20));
    assert_eq!(
        write("refused", 2),
        Err(StorageError::Io(DISK_FULL_MESSAGE))
    );
    let r = read_all(&s, &l, 7, "p", 0);
    assert_eq!(value(&r.rows[0], 1), Some(text("before")), "reads go on");
    s.assume_free_disk_bytes(Some(100 << 20));
    write("after", 3).unwrap();
    let r = read_all(&s, &l, 7, "p", 0);
    assert_eq!(value(&r.rows[0], 1), Some(text("after")));
}

#[test]
fn the_free_space_reserve_counts_the_bytes_waiting_in_memtables() {
    let (_d, s) = open(periodic());
    let l = layout();
    let write = |p: &str, v: &str| {
        let mut m = mutation(T1, 7, p);
        m.rows.push(insert_row(ck(1, "a"), vec![cell(1, v, 1)], 1));
        s.apply(&[(&l, m)])
    };
    s.set_min_free_disk_bytes(64 << 20);
    // 1 MiB above the reserve: room for the first writes.
    s.assume_free_disk_bytes(Some((64 << 20) + (1 << 20)));
    let value = "x".repeat(64 << 10);
    let mut accepted = 0;
    for i in 0..64 {
        match write(&format!("p{i}"), &value) {
            Ok(_) => accepted += 1,
            Err(e) => {
                assert_eq!(e, StorageError::Io(DISK_FULL_MESSAGE));
                break;
            }
        }
        // Sample again, as the guard's thread does every 100 ms.
        s.assume_free_disk_bytes(Some((64 << 20) + (1 << 20)));
    }
    // 64 KiB values fill the 1 MiB in about 16 writes; none of them reached the disk.
    assert!(
        (8..32).contains(&accepted),
        "refused once the memtables held the room left: {accepted} writes accepted"
    );
    let r = read_all(&s, &l, 7, "p0", 0);
    assert_eq!(r.rows.len(), 1, "reads go on");
}

#[test]
fn a_write_over_the_configured_limits_is_refused_before_anything_is_written() {
    let (_d, s) = open(periodic());
    let l = layout();
    s.set_write_limits(WriteLimits::new(100, 150));
    let row = |c1: i32, n: usize| insert_row(ck(c1, "a"), vec![cell(1, &"x".repeat(n), 1)], 1);
    let mut m = mutation(T1, 7, "p");
    m.rows.push(row(1, 100));
    s.apply(&[(&l, m)]).unwrap();
    let mut m = mutation(T1, 7, "p");
    m.rows.push(row(2, 101));
    let e = s.apply(&[(&l, m)]).unwrap_err();
    assert_eq!(
        e,
        StorageError::TooLarge("A cell value is larger than max-value-bytes (100 bytes)")
    );
    // Two cells under the cell limit, over the mutation limit together; in a batch with an
    // acceptable mutation, which is not written either.
    let mut ok = mutation(T1, 8, "q");
    ok.rows.push(row(1, 10));
    let mut m = mutation(T1, 7, "p");
    m.rows.push(row(3, 90));
    m.rows.push(row(4, 90));
    let e = s.apply(&[(&l, ok), (&l, m)]).unwrap_err();
    assert!(
        matches!(e, StorageError::TooLarge(msg) if msg.contains("max-mutation-bytes (150 bytes)"))
    );
    assert_eq!(read_all(&s, &l, 7, "p", 0).rows.len(), 1);
    assert!(read_all(&s, &l, 8, "q", 0).rows.is_empty());
}

#[test]
fn raw_partitions_carry_tombstones_and_converge_replicas() {
    let (_da, a) = open(periodic());
    let (_db, b) = open(periodic());
    let l = layout();
    // Replica a has two rows written at 1; replica b missed them but has a newer deletion
    // of one of them and a row of its own.
    let mut m = mutation(T1, 7, "p");
    m.rows
        .push(insert_row(ck(0, "a"), vec![cell(1, "old", 1)], 1));
    m.rows
        .push(insert_row(ck(1, "b"), vec![cell(1, "kept", 1)], 1));
    a.apply(&[(&l, m)]).unwrap();
    let mut m = mutation(T1, 7, "p");
    m.rows.push(RowMutation {
        clustering: ck(0, "a"),
        deletion: Some(5),
        ..Default::default()
    });
    m.rows
        .push(insert_row(ck(2, "c"), vec![cell(1, "only b", 3)], 3));
    b.apply(&[(&l, m)]).unwrap();

    let raw_a = a.read_raw_partition(T1, 7, b"p").unwrap();
    let raw_b = b.read_raw_partition(T1, 7, b"p").unwrap();
    assert_eq!(raw_a.rows.len(), 2);
    // The deleted row is in b's raw partition although no read returns it.
    assert_eq!(raw_b.rows.len(), 2);
    assert_eq!(keys(&read_all(&b, &l, 7, "p", 0)), vec![ck(2, "c")]);
    assert_ne!(raw_a, raw_b);

    a.apply_raw_partition(&l, 7, b"p", &raw_b).unwrap();
    b.apply_raw_partition(&l, 7, b"p", &raw_a).unwrap();
    // The newer tombstone wins on both: the deleted row is not resurrected.
    let want = vec![ck(1, "b"), ck(2, "c")];
    assert_eq!(keys(&read_all(&a, &l, 7, "p", 0)), want);
    assert_eq!(keys(&read_all(&b, &l, 7, "p", 0)), want);
    assert_eq!(
        a.read_raw_partition(T1, 7, b"p").unwrap(),
        b.read_raw_partition(T1, 7, b"p").unwrap()
    );
    // A partition never written is empty, and a malformed entry is refused, not applied.
    assert!(a.read_raw_partition(T1, 8, b"q").unwrap().is_empty());
    let bad = RawPartition {
        header: None,
        rows: vec![Bytes::from_static(&[0xff, 1, 2])],
    };
    assert!(a.apply_raw_partition(&l, 7, b"p", &bad).is_err());
    assert_eq!(keys(&read_all(&a, &l, 7, "p", 0)), want);
}

#[test]
fn the_group_commit_wait_is_measured_in_batch_mode_and_zero_in_periodic_mode() {
    let l = layout_no_ck(T2);
    let write = |s: &Storage, k: i64| {
        let mut m = mutation(T2, k, "g");
        m.rows.push(insert_row(vec![], vec![cell(1, "v", 1)], 1));
        s.apply(&[(&l, m)]).unwrap()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (_d, s) = open_one_store(Durability::Batch);
    let barrier = s.ack_barrier();
    assert_eq!(barrier.group_commit_wait(None), GroupCommitWait::default());
    for k in 0..4 {
        let t = write(&s, k);
        rt.block_on(s.wait_durable(t)).unwrap();
    }
    // Every write is durable and no fsync runs: a new write waits for one fsync.
    let idle = barrier.group_commit_wait(Some(0));
    assert!(idle.fsync > Duration::ZERO, "the fsyncs were measured");
    assert!(idle.expected >= idle.fsync);
    // Writes pending behind a held sync thread wait at least one bare fsync.
    let hold = s.hold_sync();
    let pending: Vec<_> = (10..20).map(|k| write(&s, k)).collect();
    let waiting = barrier.group_commit_wait(None);
    assert!(waiting.expected >= waiting.fsync && waiting.fsync > Duration::ZERO);
    drop(hold);
    for t in pending {
        rt.block_on(s.wait_durable(t)).unwrap();
    }
    // The test hook replaces the measurement, and `None` restores it.
    let slow = GroupCommitWait {
        expected: Duration::from_millis(40),
        fsync: Duration::from_millis(2),
    };
    s.assume_group_commit_wait(Some(slow));
    assert_eq!(barrier.group_commit_wait(Some(7)), slow);
    s.assume_group_commit_wait(None);
    assert!(barrier.group_commit_wait(None).expected < slow.expected);

    let (_d, p) = open(Durability::Periodic {
        interval: Duration::from_secs(10),
    });
    let t = write(&p, 1);
    rt.block_on(p.wait_durable(t)).unwrap();
    let _pending = write(&p, 2);
    assert_eq!(
        p.ack_barrier().group_commit_wait(None),
        GroupCommitWait::default(),
        "no write waits for an fsync in periodic mode"
    );
}
