//! Tests of conditional commits (`Storage::apply_conditional`).

use crate::*;
use bytes::Bytes;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const T: TableId = [7; 16];

fn open(durability: Durability) -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability,
        cache_bytes: 8 << 20,
        stores: 2,
    })
    .unwrap();
    (dir, s)
}

fn layout() -> TableLayout {
    TableLayout {
        id: T,
        clustering: vec![],
        regular: None,
        gc_grace_seconds: crate::DEFAULT_GC_GRACE_SECONDS,
    }
}

fn periodic() -> Durability {
    Durability::Periodic {
        interval: Duration::from_millis(50),
    }
}

/// A write of `cells` (column, value) to partition `pk`'s only row, with a liveness marker.
fn write(token: i64, pk: &str, cells: &[(ColumnId, Bytes)], ts: i64) -> Mutation {
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
            cells: cells
                .iter()
                .map(|(column, v)| CellWrite {
                    column: *column,
                    path: None,
                    value: CellValue::Live(v.clone()),
                    timestamp: ts,
                    expiry: None,
                })
                .collect(),
        }],
    }
}

fn whole_partition(l: &TableLayout) -> ConditionRead<'_> {
    ConditionRead {
        layout: l,
        slice: ClusteringSlice::all(),
        limit: 1,
    }
}

/// The value and timestamp of `column` in the partition's row, if live.
fn cell_of(read: &PartitionRead, column: ColumnId) -> Option<(Bytes, i64)> {
    read.rows
        .first()?
        .cells
        .iter()
        .find(|c| c.column == column)
        .map(|c| (c.value.clone(), c.timestamp))
}

fn read(s: &Storage, l: &TableLayout, token: i64, pk: &str) -> PartitionRead {
    s.read_partition(l, token, pk.as_bytes(), &ClusteringSlice::all(), None, 1, 0)
        .unwrap()
}

#[test]
fn a_write_applies_only_when_its_condition_holds() {
    let (_d, s) = open(periodic());
    let l = layout();
    let not_exists = |reads: &[PartitionRead]| reads[0].rows.is_empty();
    let first = [(&l, write(5, "p", &[(1, Bytes::from_static(b"a"))], 10))];
    let out = s
        .apply_conditional(5, b"p", &[whole_partition(&l)], 0, &first, None, not_exists)
        .unwrap();
    assert!(out.applied());
    assert!(out.reads[0].rows.is_empty(), "nothing was there before");
    let second = [(&l, write(5, "p", &[(1, Bytes::from_static(b"b"))], 20))];
    let out = s
        .apply_conditional(
            5,
            b"p",
            &[whole_partition(&l)],
            0,
            &second,
            None,
            not_exists,
        )
        .unwrap();
    assert!(!out.applied());
    assert!(out.ticket.is_none() && out.timestamp.is_none());
    // The caller gets the row as it was under the locks.
    assert_eq!(
        cell_of(&out.reads[0], 1),
        Some((Bytes::from_static(b"a"), 10))
    );
    assert_eq!(
        cell_of(&read(&s, &l, 5, "p"), 1),
        Some((Bytes::from_static(b"a"), 10))
    );
}

#[test]
fn a_wrong_partition_is_refused() {
    let (_d, s) = open(periodic());
    let l = layout();
    let other = [(&l, write(6, "q", &[(1, Bytes::from_static(b"a"))], 10))];
    let r = s.apply_conditional(5, b"p", &[whole_partition(&l)], 0, &other, None, |_| true);
    assert!(matches!(r, Err(StorageError::Corrupt(_))));
    assert!(read(&s, &l, 6, "q").rows.is_empty());
}

#[test]
fn the_commit_assigns_a_timestamp_above_what_the_stripe_stores() {
    let (_d, s) = open(periodic());
    let l = layout();
    // A plain write far ahead of the conditional write's provisional timestamp.
    let plain = [(&l, write(5, "p", &[(1, Bytes::from_static(b"old"))], 1_000))];
    s.apply(&plain).unwrap();
    let mut m = write(5, "p", &[(1, Bytes::from_static(b"new"))], 5);
    // A collection replacement: its tombstone one below the write's timestamp.
    m.rows[0].collection_deletions.push((2, 4));
    let cas = [(&l, m)];
    let out = s
        .apply_conditional(5, b"p", &[whole_partition(&l)], 0, &cas, Some(5), |r| {
            r[0].rows.len() == 1
        })
        .unwrap();
    assert!(out.applied());
    let assigned = out.timestamp.expect("a timestamp was assigned");
    assert!(assigned > 1_000, "assigned {assigned}");
    // Without the move, last-write-wins would have kept "old".
    assert_eq!(
        cell_of(&read(&s, &l, 5, "p"), 1),
        Some((Bytes::from_static(b"new"), assigned))
    );
    // A provisional timestamp already above the stripe is kept as it is.
    let later = [(
        &l,
        write(5, "p", &[(1, Bytes::from_static(b"later"))], 50_000),
    )];
    let out = s
        .apply_conditional(
            5,
            b"p",
            &[whole_partition(&l)],
            0,
            &later,
            Some(50_000),
            |_| true,
        )
        .unwrap();
    assert_eq!(out.timestamp, Some(50_000));
}

/// Compare-and-set increments from many threads, with plain writes to another column of
/// the same row racing them: a write landing between a check and its write would lose an
/// increment.
#[test]
fn compare_and_set_increments_racing_plain_writes_lose_nothing() {
    const CAS_THREADS: usize = 6;
    const INCREMENTS: u64 = 150;
    const PLAIN_THREADS: usize = 2;
    const PLAIN_WRITES: u64 = 300;
    let (_d, s) = open(periodic());
    let l = Arc::new(layout());
    let clock = Arc::new(AtomicI64::new(1));
    let counter = |v: u64| Bytes::copy_from_slice(&v.to_be_bytes());
    s.apply(&[(&*l, write(9, "ctr", &[(1, counter(0))], 0))])
        .unwrap();
    let mut threads = Vec::new();
    let retries = Arc::new(AtomicI64::new(0));
    for _ in 0..CAS_THREADS {
        let (s, l, clock, retries) = (s.clone(), l.clone(), clock.clone(), retries.clone());
        threads.push(std::thread::spawn(move || {
            let mut done = 0;
            while done < INCREMENTS {
                // Read outside any lock, as a client would; the check redoes it under them.
                let seen = cell_of(&read(&s, &l, 9, "ctr"), 1).unwrap().0;
                let v = u64::from_be_bytes(seen.as_ref().try_into().unwrap());
                let ts = clock.fetch_add(1, Ordering::Relaxed);
                let m = [(&*l, write(9, "ctr", &[(1, counter(v + 1))], ts))];
                let reads = [whole_partition(&l)];
                let out = s
                    .apply_conditional(9, b"ctr", &reads, 0, &m, Some(ts), |r| {
                        cell_of(&r[0], 1).map(|c| c.0) == Some(seen.clone())
                    })
                    .unwrap();
                if out.applied() {
                    done += 1;
                } else {
                    retries.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for p in 0..PLAIN_THREADS {
        let (s, l, clock) = (s.clone(), l.clone(), clock.clone());
        threads.push(std::thread::spawn(move || {
            for i in 0..PLAIN_WRITES {
                let ts = clock.fetch_add(1, Ordering::Relaxed);
                let v = counter(p as u64 * PLAIN_WRITES + i);
                s.apply(&[(&*l, write(9, "ctr", &[(2, v)], ts))]).unwrap();
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    let row = read(&s, &l, 9, "ctr");
    let total = cell_of(&row, 1).unwrap().0;
    assert_eq!(
        u64::from_be_bytes(total.as_ref().try_into().unwrap()),
        CAS_THREADS as u64 * INCREMENTS,
        "after {} retries",
        retries.load(Ordering::Relaxed)
    );
    assert!(cell_of(&row, 2).is_some(), "the plain writes landed too");
}

/// In Batch mode no lock is held across the fsync: conditional writes to many partitions
/// all apply while the sync thread is held, and one fsync then acknowledges them all.
#[test]
fn concurrent_conditional_writes_share_one_fsync() {
    const WRITERS: i64 = 16;
    let (_d, s) = open(Durability::Batch);
    let l = Arc::new(layout());
    let hold = s.hold_sync();
    let before = s.fsync_count();
    let (tx, rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (s, l, tx) = (s.clone(), l.clone(), tx.clone());
            std::thread::spawn(move || {
                let pk = format!("p{w}");
                let m = [(&*l, write(w, &pk, &[(1, Bytes::from_static(b"v"))], 10))];
                let reads = [whole_partition(&l)];
                let out = s
                    .apply_conditional(w, pk.as_bytes(), &reads, 0, &m, Some(10), |r| {
                        r[0].rows.is_empty()
                    })
                    .unwrap();
                tx.send(()).unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                rt.block_on(s.wait_durable(out.ticket.unwrap())).unwrap();
            })
        })
        .collect();
    for _ in 0..WRITERS {
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }
    assert_eq!(
        s.fsync_count(),
        before,
        "nothing is durable while the sync is held"
    );
    assert!(threads.iter().all(|t| !t.is_finished()));
    drop(hold);
    for t in threads {
        t.join().unwrap();
    }
    // One fsync per store that has writes (two stores), not one per write.
    let fsyncs = s.fsync_count() - before;
    assert!((1..=2).contains(&fsyncs), "{fsyncs} fsyncs");
}

/// Polls `wait` once: whether it is already resolved.
fn resolved_now(wait: impl std::future::Future<Output = Result<(), StorageError>>) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_millis(150), wait)
            .await
            .is_ok_and(|r| r.is_ok())
    })
}

/// A conditional write that does not apply shows the row as it read it: its seen ticket is
/// durable only once the write it saw is, so an answer that waits for it never shows a
/// write that a crash can still lose.
#[test]
fn a_seen_ticket_waits_for_the_write_the_read_saw() {
    let (_d, s) = open(Durability::Batch);
    let l = layout();
    let hold = s.hold_sync();
    let first = [(&l, write(5, "p", &[(1, Bytes::from_static(b"a"))], 10))];
    let reads = [whole_partition(&l)];
    let out = s
        .apply_conditional(5, b"p", &reads, 0, &first, Some(10), |r| {
            r[0].rows.is_empty()
        })
        .unwrap();
    let written = out.ticket.expect("applied");
    let second = [(&l, write(5, "p", &[(1, Bytes::from_static(b"b"))], 20))];
    let refused = s
        .apply_conditional(5, b"p", &reads, 0, &second, Some(20), |r| {
            r[0].rows.is_empty()
        })
        .unwrap();
    assert!(!refused.applied());
    assert_eq!(
        cell_of(&refused.reads[0], 1).map(|(v, _)| v),
        Some(Bytes::from_static(b"a")),
        "the refused write read the first one"
    );
    let seen = s.seen_ticket(Some(5));
    let seen_everywhere = s.seen_ticket(None);
    assert!(!resolved_now(s.wait_durable(seen.clone())), "held");
    assert!(!resolved_now(s.wait_durable(seen_everywhere.clone())));
    drop(hold);
    assert!(resolved_now(s.wait_durable(seen)));
    assert!(resolved_now(s.wait_durable(seen_everywhere)));
    assert!(resolved_now(s.wait_durable(written)));
}

/// With nothing pending, a seen ticket costs no fsync; in Periodic mode it waits only for
/// the journal to be in the OS.
#[test]
fn a_seen_ticket_of_durable_state_needs_no_fsync() {
    let (_d, s) = open(Durability::Batch);
    let l = layout();
    let m = [(&l, write(5, "p", &[(1, Bytes::from_static(b"a"))], 10))];
    let ticket = s.apply(&m).unwrap();
    assert!(resolved_now(s.wait_durable(ticket)));
    let before = s.fsync_count();
    let _hold = s.hold_sync();
    assert!(resolved_now(s.wait_durable(s.seen_ticket(None))));
    assert_eq!(s.fsync_count(), before);

    let (_d, s) = open(periodic());
    let _hold = s.hold_sync();
    s.apply(&m).unwrap();
    assert!(
        resolved_now(s.wait_durable(s.seen_ticket(Some(5)))),
        "in the OS without a timed fsync"
    );
}

#[test]
fn a_conditional_write_is_held_to_the_write_and_partition_limits() {
    let (_d, s) = open(periodic());
    s.set_write_limits(WriteLimits::new(1000, 2500).with_max_partition_bytes(2500));
    let l = layout();
    let value = |n: usize| Bytes::from(vec![b'x'; n]);
    let always = |_: &[PartitionRead]| true;
    // A cell over its limit is refused before the condition is read, and nothing is written.
    let too_big = [(&l, write(5, "p", &[(1, value(1500))], 10))];
    let r = s.apply_conditional(5, b"p", &[whole_partition(&l)], 0, &too_big, None, always);
    assert!(matches!(r, Err(StorageError::TooLarge(_))), "{r:?}");
    assert!(read(&s, &l, 5, "p").rows.is_empty());
    // Applied conditional writes count toward the partition's size: the third goes over.
    for ts in [11, 12] {
        let w = [(&l, write(5, "p", &[(1, value(900))], ts))];
        let out = s.apply_conditional(5, b"p", &[whole_partition(&l)], 0, &w, None, always);
        assert!(out.unwrap().ticket.is_some());
    }
    let w = [(&l, write(5, "p", &[(1, value(900))], 13))];
    let r = s.apply_conditional(5, b"p", &[whole_partition(&l)], 0, &w, None, always);
    assert_eq!(
        r.err(),
        Some(StorageError::TooLarge(
            "The partition would grow larger than max-partition-bytes (2500 bytes)"
        ))
    );
    // A write whose condition fails is not counted: the partition's estimate is unchanged.
    let other = [(&l, write(6, "q", &[(1, value(900))], 14))];
    for _ in 0..5 {
        let out = s.apply_conditional(6, b"q", &[whole_partition(&l)], 0, &other, None, |_| false);
        assert!(out.unwrap().ticket.is_none());
    }
    let out = s.apply_conditional(6, b"q", &[whole_partition(&l)], 0, &other, None, always);
    assert!(out.unwrap().ticket.is_some());
}
