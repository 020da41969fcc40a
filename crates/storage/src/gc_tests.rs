//! Tombstone GC in compaction: what gc_grace_seconds lets a compaction purge, and that a
//! purge brings nothing back.

use crate::*;
use bytes::Bytes;
use sluice_types::{CqlType, NativeType};
use std::time::Duration;

const T: TableId = [7; 16];
const PK: &str = "p";
const TOKEN: i64 = 42;

fn now_secs() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as u32
}

/// A write timestamp (µs) `ago` seconds before now.
fn micros_ago(ago: u32) -> i64 {
    i64::from(now_secs() - ago) * 1_000_000
}

fn layout(gc_grace_seconds: u32) -> TableLayout {
    TableLayout {
        id: T,
        clustering: vec![(CqlType::Native(NativeType::Int), Order::Asc)],
        regular: None,
        gc_grace_seconds,
    }
}

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

fn int(v: i32) -> Bytes {
    Bytes::copy_from_slice(&v.to_be_bytes())
}

fn partition(rows: Vec<RowMutation>) -> Mutation {
    Mutation {
        table: T,
        token: TOKEN,
        partition_key: Bytes::from_static(PK.as_bytes()),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows,
    }
}

/// A row `c` with column 1 set to `v`, written at `timestamp`, expiring as `expiry` says.
fn row(c: i32, v: i32, timestamp: i64, expiry: Option<(u32, u32)>) -> RowMutation {
    RowMutation {
        clustering: vec![int(c)],
        liveness: Some(Liveness { timestamp, expiry }),
        cells: vec![CellWrite {
            column: 1,
            path: None,
            value: CellValue::Live(int(v)),
            timestamp,
            expiry,
        }],
        ..Default::default()
    }
}

/// A deletion of row `c` at `timestamp`.
fn row_deletion(c: i32, timestamp: i64) -> RowMutation {
    RowMutation {
        clustering: vec![int(c)],
        deletion: Some(timestamp),
        ..Default::default()
    }
}

fn write(s: &Storage, l: &TableLayout, rows: Vec<RowMutation>) {
    s.apply(&[(l, partition(rows))]).unwrap();
}

/// The clustering values (as ints) of the live rows of the partition.
fn live_rows(s: &Storage, l: &TableLayout) -> Vec<i32> {
    s.read_partition(
        l,
        TOKEN,
        PK.as_bytes(),
        &ClusteringSlice::all(),
        None,
        usize::MAX,
        now_secs(),
    )
    .unwrap()
    .rows
    .iter()
    .map(|r| i32::from_be_bytes(r.clustering[0].as_ref().try_into().unwrap()))
    .collect()
}

#[test]
fn a_deleted_row_past_gc_grace_leaves_the_disk_and_stays_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout(0);
    {
        let s = open(dir.path());
        write(&s, &l, vec![row(1, 10, micros_ago(60), None)]);
        write(&s, &l, vec![row(2, 20, micros_ago(60), None)]);
        // The live version of row 1 in a disk table of its own, the deletion in another.
        assert_eq!(s.compact_table(T), 2);
        write(&s, &l, vec![row_deletion(1, micros_ago(30))]);
        assert_eq!(
            s.raw_entry_count(T),
            2,
            "the deletion is stored in row 1's entry"
        );
        assert_eq!(
            s.compact_table(T),
            1,
            "row 1 (its deletion and the data under it) is gone from disk"
        );
        assert_eq!(s.raw_entry_count(T), 1);
        assert_eq!(live_rows(&s, &l), vec![2]);
        s.close().unwrap();
    }
    let s = open(dir.path());
    assert_eq!(
        live_rows(&s, &l),
        vec![2],
        "nothing comes back after a restart"
    );
    // Recovery may replay journal entries newer than what is left on disk (the deletion
    // among them); the next compaction purges them again.
    write(&s, &l, vec![row(3, 30, micros_ago(10), None)]);
    assert_eq!(s.compact_table(T), 2);
    assert_eq!(live_rows(&s, &l), vec![2, 3]);
}

#[test]
fn ttl_expired_cells_past_gc_grace_vanish_and_live_ones_stay() {
    let (dir, l) = (tempfile::tempdir().unwrap(), layout(0));
    let s = open(dir.path());
    let expired = Some((now_secs() - 5, 5));
    write(&s, &l, vec![row(1, 10, micros_ago(10), expired)]);
    // Row 2: an expired cell in column 1 and a live one in column 2.
    let mut mixed = row(2, 20, micros_ago(10), expired);
    mixed.cells.push(CellWrite {
        column: 2,
        path: None,
        value: CellValue::Live(int(21)),
        timestamp: micros_ago(10),
        expiry: None,
    });
    write(&s, &l, vec![mixed, row(3, 30, micros_ago(10), None)]);
    assert_eq!(s.raw_entry_count(T), 3);
    assert_eq!(s.compact_table(T), 2, "row 1 had only expired content");
    assert_eq!(live_rows(&s, &l), vec![2, 3]);
    let read = s
        .read_partition(
            &l,
            TOKEN,
            PK.as_bytes(),
            &ClusteringSlice::all(),
            None,
            usize::MAX,
            now_secs(),
        )
        .unwrap();
    let cells: Vec<ColumnId> = read.rows[0].cells.iter().map(|c| c.column).collect();
    assert_eq!(cells, vec![2], "row 2 keeps its live cell only");
}

#[test]
fn tombstones_and_expired_cells_younger_than_gc_grace_stay() {
    let (dir, l) = (tempfile::tempdir().unwrap(), layout(3600));
    let s = open(dir.path());
    write(&s, &l, vec![row(1, 10, micros_ago(60), None)]);
    write(&s, &l, vec![row_deletion(1, micros_ago(30))]);
    write(
        &s,
        &l,
        vec![row(2, 20, micros_ago(60), Some((now_secs() - 5, 5)))],
    );
    assert_eq!(s.compact_table(T), 2, "both entries stay within gc grace");
    assert_eq!(s.raw_entry_count(T), 2);
    // The kept deletion still shadows a late write older than it.
    write(&s, &l, vec![row(1, 11, micros_ago(45), None)]);
    assert_eq!(live_rows(&s, &l), Vec::<i32>::new());
}

#[test]
fn a_table_without_a_known_gc_grace_is_not_purged() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout(0);
    {
        let s = open(dir.path());
        write(&s, &l, vec![row_deletion(1, micros_ago(30))]);
        s.close().unwrap();
    }
    // After a restart, no write has told this store the table's grace yet.
    let s = open(dir.path());
    assert_eq!(s.compact_table(T), 1);
    write(&s, &l, vec![row(2, 20, micros_ago(10), None)]);
    assert_eq!(s.compact_table(T), 1, "the write told it: row 1 is purged");
    assert_eq!(live_rows(&s, &l), vec![2]);
}

/// Longest a test waits for the background purger.
const PURGE_WAIT: Duration = Duration::from_secs(30);

#[test]
fn a_partition_deletion_within_gc_grace_is_kept_while_its_rows_go() {
    let (dir, l) = (tempfile::tempdir().unwrap(), layout(3600));
    let s = open(dir.path());
    write(&s, &l, vec![row(1, 10, micros_ago(60), None)]);
    let mut deletion = partition(vec![]);
    deletion.partition_deletion = Some(micros_ago(30));
    s.apply(&[(&l, deletion)]).unwrap();
    assert!(s.wait_purges(PURGE_WAIT), "the purger removes row 1");
    assert_eq!(s.compact_table(T), 1, "the header stays within gc grace");
    // The kept deletion still shadows a late write older than it.
    write(&s, &l, vec![row(2, 20, micros_ago(45), None)]);
    assert_eq!(live_rows(&s, &l), Vec::<i32>::new());
}

#[test]
fn a_partition_deletion_past_gc_grace_goes_once_nothing_it_shadows_is_left() {
    let (dir, l) = (tempfile::tempdir().unwrap(), layout(0));
    let s = open(dir.path());
    write(&s, &l, vec![row(1, 10, micros_ago(60), None)]);
    write(&s, &l, vec![row(2, 20, micros_ago(10), None)]);
    let mut deletion = partition(vec![]);
    deletion.partition_deletion = Some(micros_ago(30));
    s.apply(&[(&l, deletion)]).unwrap();
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(s.raw_entry_count(T), 2, "row 1 is gone, the header stays");
    // The compaction finds the header past gc grace and has the purger drop it.
    s.compact_table(T);
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(
        s.raw_entry_count(T),
        1,
        "the header is gone, row 2 (newer) stays"
    );
    assert_eq!(live_rows(&s, &l), vec![2]);
    assert_eq!(s.compact_table(T), 1);
    assert_eq!(live_rows(&s, &l), vec![2]);
}

#[test]
fn a_range_tombstone_past_gc_grace_goes_and_one_over_a_partly_shadowed_row_stays() {
    let (dir, l) = (tempfile::tempdir().unwrap(), layout(0));
    let s = open(dir.path());
    write(&s, &l, vec![row(1, 10, micros_ago(60), None)]);
    // Row 5: column 1 older than the coming deletion, column 2 newer.
    let mut partly = row(5, 50, micros_ago(60), None);
    partly.cells.push(CellWrite {
        column: 2,
        path: None,
        value: CellValue::Live(int(51)),
        timestamp: micros_ago(10),
        expiry: None,
    });
    write(&s, &l, vec![partly]);
    let mut deletion = partition(vec![]);
    deletion.range_deletions.push(RangeDeletion {
        start: std::ops::Bound::Included(vec![int(0)]),
        end: std::ops::Bound::Included(vec![int(2)]),
        timestamp: micros_ago(30),
    });
    s.apply(&[(&l, deletion)]).unwrap();
    assert!(s.wait_purges(PURGE_WAIT));
    s.compact_table(T);
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(s.raw_entry_count(T), 1, "row 1 and the header are gone");
    assert_eq!(live_rows(&s, &l), vec![5]);
    let mut deletion = partition(vec![]);
    deletion.partition_deletion = Some(micros_ago(30));
    s.apply(&[(&l, deletion)]).unwrap();
    assert!(s.wait_purges(PURGE_WAIT));
    s.compact_table(T);
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(
        s.raw_entry_count(T),
        2,
        "the header stays: without it row 5's column 1 would come back"
    );
    let read = s
        .read_partition(
            &l,
            TOKEN,
            PK.as_bytes(),
            &ClusteringSlice::all(),
            None,
            usize::MAX,
            now_secs(),
        )
        .unwrap();
    let cells: Vec<ColumnId> = read.rows[0].cells.iter().map(|c| c.column).collect();
    assert_eq!(cells, vec![2]);
}

#[test]
fn a_compaction_has_a_header_past_gc_grace_dropped() {
    let (dir, l) = (tempfile::tempdir().unwrap(), layout(0));
    {
        let s = open(dir.path());
        write(&s, &l, vec![row(1, 10, micros_ago(60), None)]);
        let _held = s.hold_purgers();
        let mut deletion = partition(vec![]);
        deletion.partition_deletion = Some(micros_ago(30));
        s.apply(&[(&l, deletion)]).unwrap();
        s.close().unwrap();
    }
    // After a restart the purger finishes the purge, but knows no gc grace yet.
    let s = open(dir.path());
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(s.raw_entry_count(T), 1, "the header is left");
    let mut other = partition(vec![row(7, 70, micros_ago(10), None)]);
    other.partition_key = Bytes::from_static(b"other");
    s.apply(&[(&l, other)]).unwrap();
    // The write told the store the grace; the compaction finds the header past it.
    s.compact_table(T);
    assert!(s.wait_purges(PURGE_WAIT));
    assert_eq!(
        s.raw_entry_count(T),
        1,
        "only the other partition's row is left"
    );
    assert_eq!(live_rows(&s, &l), Vec::<i32>::new());
}

#[test]
fn a_read_over_more_tombstones_than_the_threshold_fails_and_a_higher_one_lets_it_pass() {
    let (dir, l) = (tempfile::tempdir().unwrap(), layout(3600));
    let s = open(dir.path());
    let deletions = (0..5).map(|c| row_deletion(c, micros_ago(10))).collect();
    write(&s, &l, deletions);
    write(&s, &l, vec![row(9, 90, micros_ago(10), None)]);
    let read = |s: &Storage| {
        s.read_partition(
            &l,
            TOKEN,
            PK.as_bytes(),
            &ClusteringSlice::all(),
            None,
            usize::MAX,
            now_secs(),
        )
        .map(|p| p.rows.len())
    };
    let scan = |s: &Storage| {
        s.scan(
            &l,
            &ScanStart::Token(std::ops::Bound::Unbounded),
            std::ops::Bound::Unbounded,
            100,
            now_secs(),
        )
        .map(|p| p.partitions.len())
    };
    assert_eq!(
        read(&s),
        Ok(1),
        "five dead rows are under the default threshold"
    );
    s.set_tombstone_failure_threshold(4);
    assert_eq!(read(&s), Err(StorageError::TooManyTombstones));
    assert_eq!(scan(&s).err(), Some(StorageError::TooManyTombstones));
    s.set_tombstone_failure_threshold(5);
    assert_eq!(read(&s), Ok(1));
    assert_eq!(scan(&s), Ok(1));
}
