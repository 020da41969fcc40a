//! Tests of multi-partition transactions (`Storage::apply_transaction`).

use crate::*;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

const T: TableId = [9; 16];
const BALANCE: ColumnId = 1;

fn open(path: &std::path::Path) -> Storage {
    Storage::open(StorageConfig {
        path: path.to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(20),
        },
        cache_bytes: 8 << 20,
        stores: 2,
    })
    .unwrap()
}

fn layout() -> TableLayout {
    TableLayout {
        id: T,
        clustering: vec![],
        regular: None,
        gc_grace_seconds: crate::DEFAULT_GC_GRACE_SECONDS,
    }
}

/// Two accounts whose partitions live in different stores.
fn accounts(s: &Storage) -> [(i64, &'static str); 2] {
    let a = 11;
    let b = (1..1000u64)
        .map(|k| k.wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64)
        .find(|t| s.store_of(*t) != s.store_of(a))
        .expect("a token of the other store");
    [(a, "a"), (b, "b")]
}

fn balance_write(token: i64, pk: &str, balance: i64, ts: i64) -> Mutation {
    Mutation {
        table: T,
        token,
        partition_key: Bytes::copy_from_slice(pk.as_bytes()),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows: vec![RowMutation {
            clustering: vec![],
            liveness: Some(Liveness {
                timestamp: ts,
                expiry: None,
            }),
            deletion: None,
            collection_deletions: vec![],
            cells: vec![CellWrite {
                column: BALANCE,
                path: None,
                value: CellValue::Live(Bytes::copy_from_slice(&balance.to_be_bytes())),
                timestamp: ts,
                expiry: None,
            }],
        }],
    }
}

fn balance_of(read: &PartitionRead) -> Option<i64> {
    let cell = read
        .rows
        .first()?
        .cells
        .iter()
        .find(|c| c.column == BALANCE)?;
    Some(i64::from_be_bytes(cell.value.as_ref().try_into().ok()?))
}

fn read_balance(s: &Storage, l: &TableLayout, (token, pk): (i64, &str)) -> Option<i64> {
    let read = s
        .read_partition(l, token, pk.as_bytes(), &ClusteringSlice::all(), None, 1, 0)
        .unwrap();
    balance_of(&read)
}

/// Moves `amount` from `from` to `to` if `from` holds enough; true when it moved.
fn transfer(
    s: &Storage,
    l: &TableLayout,
    from: (i64, &str),
    to: (i64, &str),
    amount: i64,
    ts: i64,
) -> bool {
    let reads = [from, to].map(|(token, pk)| TxnRead {
        layout: l,
        token,
        partition_key: pk.as_bytes(),
        slice: ClusteringSlice::all(),
        limit: 1,
    });
    let partitions = [from, to].map(|(token, _)| TxnPartition { table: T, token });
    let out = s
        .apply_transaction(&partitions, &reads, &[], 0, ts, |found| {
            let (Some(have), Some(other)) = (balance_of(&found[0]), balance_of(&found[1])) else {
                return Err("missing account");
            };
            if have < amount {
                return Ok(Vec::new());
            }
            Ok(vec![
                (l, balance_write(from.0, from.1, have - amount, ts)),
                (l, balance_write(to.0, to.1, other + amount, ts)),
            ])
        })
        .unwrap();
    out.ticket.is_some()
}

#[test]
fn concurrent_transfers_across_stores_keep_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(open(dir.path()));
    let l = Arc::new(layout());
    let [a, b] = accounts(&s);
    let init = [
        (&*l, balance_write(a.0, a.1, 1000, 1)),
        (&*l, balance_write(b.0, b.1, 1000, 1)),
    ];
    s.apply(&init).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (s, l) = (s.clone(), l.clone());
            std::thread::spawn(move || {
                let mut moved = 0;
                for n in 0..300 {
                    // Half the threads move a to b, half b to a: the same locks, opposite
                    // orders of naming them.
                    let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
                    if transfer(&s, &l, from, to, 3, 10 + n) {
                        moved += 1;
                    }
                }
                moved
            })
        })
        .collect();
    let moved: i64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(moved > 0);
    let total = read_balance(&s, &l, a).unwrap() + read_balance(&s, &l, b).unwrap();
    assert_eq!(total, 2000);
}

#[test]
fn a_refused_decision_writes_nothing_and_a_later_write_is_ordered_after_reads() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let l = layout();
    let [a, b] = accounts(&s);
    // `a` is stored with a timestamp far above the transaction's provisional one.
    s.apply(&[(&l, balance_write(a.0, a.1, 5, 1_000_000))])
        .unwrap();
    let partitions = [a, b].map(|(token, _)| TxnPartition { table: T, token });
    let reads = [TxnRead {
        layout: &l,
        token: a.0,
        partition_key: a.1.as_bytes(),
        slice: ClusteringSlice::all(),
        limit: 1,
    }];
    let refused = s.apply_transaction(&partitions, &reads, &[], 0, 10, |_| {
        Err::<Vec<(&TableLayout, Mutation)>, _>("no")
    });
    assert!(matches!(refused, Err(TxnError::Decide("no"))));
    assert_eq!(read_balance(&s, &l, b), None);
    let out = s
        .apply_transaction(&partitions, &reads, &[], 0, 10, |found| {
            assert_eq!(balance_of(&found[0]), Some(5));
            Ok::<_, ()>(vec![
                (&l, balance_write(a.0, a.1, 0, 10)),
                (&l, balance_write(b.0, b.1, 5, 10)),
            ])
        })
        .unwrap();
    // The write was moved above what `a`'s stripe stored, so it is not lost to LWW.
    assert!(out.timestamp.unwrap() > 1_000_000);
    assert_eq!(read_balance(&s, &l, a), Some(0));
    assert_eq!(read_balance(&s, &l, b), Some(5));
    // A write outside the locked partitions is refused before anything is written.
    let stray = s.apply_transaction(&partitions[..1], &[], &[], 0, 10, |_| {
        Ok::<_, ()>(vec![(&l, balance_write(b.0, b.1, 99, 10))])
    });
    assert!(matches!(
        stray,
        Err(TxnError::Storage(StorageError::Corrupt(_)))
    ));
    assert_eq!(read_balance(&s, &l, b), Some(5));
}

#[test]
fn a_transaction_across_stores_is_durable_and_its_record_goes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open(dir.path());
        let l = layout();
        let [a, b] = accounts(&s);
        s.apply(&[
            (&l, balance_write(a.0, a.1, 10, 1)),
            (&l, balance_write(b.0, b.1, 0, 1)),
        ])
        .unwrap();
        assert!(transfer(&s, &l, a, b, 4, 100));
        let before = s.batchlog_records().iter().sum::<usize>();
        let partitions = [a, b].map(|(token, _)| TxnPartition { table: T, token });
        let out = s
            .apply_transaction(&partitions, &[], &[], 0, 200, |_| {
                Ok::<_, ()>(vec![
                    (&l, balance_write(a.0, a.1, 1, 200)),
                    (&l, balance_write(b.0, b.1, 13, 200)),
                ])
            })
            .unwrap();
        assert!(out.ticket.is_some());
        let records = s.batchlog_records().iter().sum::<usize>();
        assert_eq!(records, before + 2, "one record per part");
        futures_lite(s.wait_durable(out.ticket.unwrap())).unwrap();
        assert_eq!(s.batchlog_records().iter().sum::<usize>(), before);
        s.close().unwrap();
    }
    let s = open(dir.path());
    let l = layout();
    let [a, b] = accounts(&s);
    assert_eq!(read_balance(&s, &l, a), Some(1));
    assert_eq!(read_balance(&s, &l, b), Some(13));
}

#[test]
fn a_transaction_cut_after_its_first_store_is_completed_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout();
    let ([a, b], records) = {
        let s = open(dir.path());
        let [a, b] = accounts(&s);
        futures_lite(
            s.wait_durable(
                s.apply(&[
                    (&l, balance_write(a.0, a.1, 10, 1)),
                    (&l, balance_write(b.0, b.1, 0, 1)),
                ])
                .unwrap(),
            ),
        )
        .unwrap();
        let before = s.batchlog_records().iter().sum::<usize>();
        crate::store::DIE_AFTER_FIRST_PART.with(|d| d.set(true));
        let partitions = [a, b].map(|(token, _)| TxnPartition { table: T, token });
        let cut = s.apply_transaction(&partitions, &[], &[], 0, 100, |_| {
            Ok::<_, ()>(vec![
                (&l, balance_write(a.0, a.1, 3, 100)),
                (&l, balance_write(b.0, b.1, 7, 100)),
            ])
        });
        crate::store::DIE_AFTER_FIRST_PART.with(|d| d.set(false));
        assert!(matches!(cut, Err(TxnError::Storage(StorageError::Closed))));
        // Exactly one of the two parts is written, with its record of the other.
        let written = [
            read_balance(&s, &l, a) == Some(3),
            read_balance(&s, &l, b) == Some(7),
        ];
        assert_eq!(written.iter().filter(|w| **w).count(), 1, "{written:?}");
        let records = s.batchlog_records().iter().sum::<usize>() - before;
        s.close().unwrap();
        ([a, b], records)
    };
    assert_eq!(records, 1);
    let s = open(dir.path());
    assert_eq!(read_balance(&s, &l, a), Some(3));
    assert_eq!(read_balance(&s, &l, b), Some(7));
    assert_eq!(s.batchlog_records().iter().sum::<usize>(), 0);
}

/// Runs a future to completion on a one-thread runtime.
fn futures_lite<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// A write of one cell of `column` (and the row's liveness) at `ts`.
fn column_write(token: i64, pk: &str, column: ColumnId, value: i64, ts: i64) -> Mutation {
    let mut m = balance_write(token, pk, value, ts);
    m.rows[0].cells[0].column = column;
    m
}

fn column_of(
    s: &Storage,
    l: &TableLayout,
    (token, pk): (i64, &str),
    column: ColumnId,
) -> Option<i64> {
    let read = s
        .read_partition(l, token, pk.as_bytes(), &ClusteringSlice::all(), None, 1, 0)
        .unwrap();
    let cell = read
        .rows
        .first()?
        .cells
        .iter()
        .find(|c| c.column == column)?;
    Some(i64::from_be_bytes(cell.value.as_ref().try_into().ok()?))
}

#[test]
fn known_writes_are_prepared_ahead_and_merged_with_decided_ones() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(dir.path());
    let l = layout();
    let [a, b] = accounts(&s);
    let partitions = [a, b].map(|(token, _)| TxnPartition { table: T, token });
    // Both partitions are new: the writes made ahead go in as they were encoded.
    let known = [
        (&l, balance_write(a.0, a.1, 4, 50)),
        (&l, balance_write(b.0, b.1, 6, 50)),
    ];
    let out = s
        .apply_transaction(&partitions, &[], &known, 0, 50, |_| Ok::<_, ()>(Vec::new()))
        .unwrap();
    assert!(out.ticket.is_some());
    assert_eq!(out.timestamp, Some(50));
    assert_eq!(read_balance(&s, &l, a), Some(4));
    assert_eq!(read_balance(&s, &l, b), Some(6));
    // A known write and a decided one of the same row are merged into one entry.
    let known = [(&l, column_write(a.0, a.1, 2, 70, 60))];
    let reads = [TxnRead {
        layout: &l,
        token: a.0,
        partition_key: a.1.as_bytes(),
        slice: ClusteringSlice::all(),
        limit: 1,
    }];
    s.apply_transaction(&partitions, &reads, &known, 0, 60, |found| {
        let have = balance_of(&found[0]).ok_or(())?;
        Ok::<_, ()>(vec![(&l, balance_write(a.0, a.1, have + 1, 60))])
    })
    .unwrap();
    assert_eq!(read_balance(&s, &l, a), Some(5));
    assert_eq!(column_of(&s, &l, a, 2), Some(70));
    // A refused decision discards the known writes too.
    let known = [(&l, balance_write(b.0, b.1, 99, 70))];
    let refused = s.apply_transaction(&partitions, &[], &known, 0, 70, |_| {
        Err::<Vec<(&TableLayout, Mutation)>, _>("no")
    });
    assert!(matches!(refused, Err(TxnError::Decide("no"))));
    assert_eq!(read_balance(&s, &l, b), Some(6));
    // A known write outside the locked partitions is refused before anything is written.
    let known = [(&l, balance_write(b.0, b.1, 99, 80))];
    let stray = s.apply_transaction(&partitions[..1], &[], &known, 0, 80, |_| {
        Ok::<_, ()>(Vec::new())
    });
    assert!(matches!(
        stray,
        Err(TxnError::Storage(StorageError::Corrupt(_)))
    ));
    assert_eq!(read_balance(&s, &l, b), Some(6));
}

#[test]
fn known_writes_moved_above_stored_timestamps_replay_with_the_moved_ones() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout();
    let stored_at = 1_000_000;
    let ([a, b], records) = {
        let s = open(dir.path());
        let [a, b] = accounts(&s);
        futures_lite(
            s.wait_durable(
                s.apply(&[
                    (&l, balance_write(a.0, a.1, 10, stored_at)),
                    (&l, balance_write(b.0, b.1, 0, stored_at)),
                ])
                .unwrap(),
            ),
        )
        .unwrap();
        let before = s.batchlog_records().iter().sum::<usize>();
        // Made ahead at timestamp 100, the writes and their records must move above what
        // is stored; the part cut off is restored from a record, which must carry the
        // moved timestamps or it would lose to the stored cells.
        let known = [
            (&l, balance_write(a.0, a.1, 3, 100)),
            (&l, balance_write(b.0, b.1, 7, 100)),
        ];
        crate::store::DIE_AFTER_FIRST_PART.with(|d| d.set(true));
        let partitions = [a, b].map(|(token, _)| TxnPartition { table: T, token });
        let cut = s.apply_transaction(
            &partitions,
            &[],
            &known,
            0,
            100,
            |_| Ok::<_, ()>(Vec::new()),
        );
        crate::store::DIE_AFTER_FIRST_PART.with(|d| d.set(false));
        assert!(matches!(cut, Err(TxnError::Storage(StorageError::Closed))));
        let written = [
            read_balance(&s, &l, a) == Some(3),
            read_balance(&s, &l, b) == Some(7),
        ];
        assert_eq!(written.iter().filter(|w| **w).count(), 1, "{written:?}");
        let records = s.batchlog_records().iter().sum::<usize>() - before;
        s.close().unwrap();
        ([a, b], records)
    };
    assert_eq!(records, 1);
    let s = open(dir.path());
    assert_eq!(read_balance(&s, &l, a), Some(3));
    assert_eq!(read_balance(&s, &l, b), Some(7));
    assert_eq!(s.batchlog_records().iter().sum::<usize>(), 0);
}

/// Known writes that span stores write their records to the journals before the locks;
/// the parts' batches carry markers naming them. A part cut off is restored from the
/// record its marker names; records no marker names go.
#[test]
fn records_written_ahead_restore_a_cut_transaction_and_unused_ones_go() {
    let dir = tempfile::tempdir().unwrap();
    let l = layout();
    let [a, b] = {
        let s = open(dir.path());
        let [a, b] = accounts(&s);
        let partitions = [a, b].map(|(token, _)| TxnPartition { table: T, token });
        let known = |ts: i64| {
            [
                (&l, balance_write(a.0, a.1, ts, ts)),
                (&l, balance_write(b.0, b.1, ts + 1, ts)),
            ]
        };
        // Committed: a marker and a record ahead in each store until every part is durable.
        let out = s
            .apply_transaction(&partitions, &[], &known(100), 0, 100, |_| {
                Ok::<_, ()>(Vec::new())
            })
            .unwrap();
        assert_eq!(s.batchlog_records(), [1, 1]);
        assert_eq!(s.batchlog_ahead_records(), 2);
        futures_lite(s.wait_durable(out.ticket.unwrap())).unwrap();
        assert_eq!(s.batchlog_records(), [0, 0]);
        assert_eq!(s.batchlog_ahead_records(), 0);
        // Refused under the locks: the records made ahead go at once.
        let refused = s.apply_transaction(&partitions, &[], &known(200), 0, 200, |_| {
            Err::<Vec<(&TableLayout, Mutation)>, _>("no")
        });
        assert!(matches!(refused, Err(TxnError::Decide("no"))));
        assert_eq!(s.batchlog_ahead_records(), 0);
        assert_eq!(read_balance(&s, &l, a), Some(100));
        // Joined by a decided write: the full records are remade under the locks, and the
        // ones made ahead go.
        let out = s
            .apply_transaction(&partitions, &[], &known(300), 0, 300, |_| {
                Ok::<_, ()>(vec![(&l, column_write(a.0, a.1, 2, 5, 300))])
            })
            .unwrap();
        assert_eq!(s.batchlog_ahead_records(), 0);
        futures_lite(s.wait_durable(out.ticket.unwrap())).unwrap();
        assert_eq!(column_of(&s, &l, a, 2), Some(5));
        // Cut after its first store's batch, as if the process died there.
        crate::store::DIE_AFTER_FIRST_PART.with(|d| d.set(true));
        let cut = s.apply_transaction(&partitions, &[], &known(400), 0, 400, |_| {
            Ok::<_, ()>(Vec::new())
        });
        crate::store::DIE_AFTER_FIRST_PART.with(|d| d.set(false));
        assert!(matches!(cut, Err(TxnError::Storage(StorageError::Closed))));
        let written = [
            read_balance(&s, &l, a) == Some(400),
            read_balance(&s, &l, b) == Some(401),
        ];
        assert_eq!(written.iter().filter(|w| **w).count(), 1, "{written:?}");
        let markers = s.batchlog_records();
        assert_eq!(
            markers.iter().sum::<usize>(),
            1,
            "one marker, in the part written"
        );
        assert_eq!(markers[s.store_of(a.0)] == 1, written[0]);
        assert_eq!(s.batchlog_ahead_records(), 2);
        s.close().unwrap();
        [a, b]
    };
    let s = open(dir.path());
    assert_eq!(read_balance(&s, &l, a), Some(400));
    assert_eq!(
        read_balance(&s, &l, b),
        Some(401),
        "restored from the record ahead"
    );
    assert_eq!(s.batchlog_records(), [0, 0]);
    assert_eq!(s.batchlog_ahead_records(), 0);
}
