//! Tests of streaming a token range of a table out of one storage and into another.

use crate::*;
use bytes::Bytes;
use std::time::Duration;

const T: TableId = [7; 16];

fn open() -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(50),
        },
        cache_bytes: 8 << 20,
        stores: 3,
    })
    .unwrap();
    (dir, s)
}

fn layout() -> TableLayout {
    TableLayout {
        id: T,
        clustering: vec![(
            sluice_types::CqlType::Native(sluice_types::NativeType::Int),
            Order::Asc,
        )],
        regular: None,
        gc_grace_seconds: DEFAULT_GC_GRACE_SECONDS,
    }
}

fn text(v: &str) -> Bytes {
    Bytes::copy_from_slice(v.as_bytes())
}

fn row(c: i32, value: &str, ts: i64) -> RowMutation {
    RowMutation {
        clustering: vec![Bytes::copy_from_slice(&c.to_be_bytes())],
        liveness: Some(Liveness {
            timestamp: ts,
            expiry: None,
        }),
        deletion: None,
        collection_deletions: vec![],
        cells: vec![CellWrite {
            column: 1,
            path: None,
            value: CellValue::Live(text(value)),
            timestamp: ts,
            expiry: None,
        }],
    }
}

fn mutation(token: i64, pk: &str) -> Mutation {
    Mutation {
        table: T,
        token,
        partition_key: text(pk),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows: vec![],
    }
}

/// Partition `p{i}` at a token spread over the ring (and the stores), with `i % 4 + 1` rows;
/// every third one has a static row, every fifth a partition deletion newer than its rows.
fn fill(s: &Storage, n: i64) {
    let l = layout();
    for i in 0..n {
        let mut m = mutation(token_of(i), &format!("p{i}"));
        for c in 0..(i % 4 + 1) as i32 {
            m.rows.push(row(c, &format!("v{i}.{c}"), 10));
        }
        if i % 3 == 0 {
            m.static_row = Some(RowMutation {
                cells: vec![CellWrite {
                    column: 9,
                    path: None,
                    value: CellValue::Live(text("s")),
                    timestamp: 10,
                    expiry: None,
                }],
                ..Default::default()
            });
        }
        s.apply(&[(&l, m)]).unwrap();
        if i % 5 == 0 {
            let mut d = mutation(token_of(i), &format!("p{i}"));
            d.partition_deletion = Some(20);
            s.apply(&[(&l, d)]).unwrap();
        }
    }
    // The rows the deletions shadow are purged in the background; settle it so that
    // exports compare equal.
    assert!(s.wait_purges(Duration::from_secs(10)));
}

fn token_of(i: i64) -> i64 {
    (i64::MIN as i128 + 1 + i128::from(i) * (i64::MAX as i128 / 25)) as i64
}

/// Every record of the table with tokens in (start, end], in chunks of `max_bytes`.
fn export_all(s: &Storage, start: Option<i64>, end: i64, max_bytes: usize) -> Vec<RawRecord> {
    let mut out = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let chunk = s
            .export_token_range(T, start, end, after.as_deref(), max_bytes)
            .unwrap();
        assert!(chunk.byte_len() < max_bytes.saturating_add(4096) || chunk.records.len() == 1);
        out.extend(chunk.records);
        match chunk.resume_after {
            Some(key) => after = Some(key),
            None => return out,
        }
    }
}

fn token_of_key(key: &[u8]) -> i64 {
    keycodec::token_from_bytes(key[..8].try_into().unwrap())
}

fn live_rows(s: &Storage, i: i64) -> (usize, bool) {
    let r = s
        .read_partition(
            &layout(),
            token_of(i),
            format!("p{i}").as_bytes(),
            &ClusteringSlice::all(),
            None,
            usize::MAX,
            0,
        )
        .unwrap();
    (r.rows.len(), r.static_row.is_some())
}

#[test]
fn a_token_range_comes_out_in_key_order_and_in_range_whatever_the_chunk_size() {
    let (_dir, s) = open();
    fill(&s, 50);
    let (start, end) = (token_of(10), token_of(30));
    let whole = export_all(&s, Some(start), end, usize::MAX);
    let chunked = export_all(&s, Some(start), end, 64);
    assert_eq!(whole, chunked);
    assert!(whole.windows(2).all(|w| w[0].key < w[1].key));
    let tokens: std::collections::BTreeSet<i64> =
        whole.iter().map(|r| token_of_key(&r.key)).collect();
    let expected: std::collections::BTreeSet<i64> = (11..=30).map(token_of).collect();
    assert_eq!(tokens, expected);
    // From the smallest token, and up to the largest.
    let low = export_all(&s, None, token_of(2), 100);
    assert_eq!(
        low.iter()
            .map(|r| token_of_key(&r.key))
            .collect::<std::collections::BTreeSet<_>>(),
        (0..=2).map(token_of).collect()
    );
    let all = export_all(&s, None, i64::MAX, 1000);
    assert_eq!(all, export_all(&s, None, i64::MAX, usize::MAX));
    assert_eq!(all.len(), s.raw_entry_count(T), "every stored record");
    assert!(s
        .export_token_range(T, Some(i64::MAX), i64::MAX, None, 100)
        .unwrap()
        .records
        .is_empty());
    assert!(s
        .export_token_range(T, Some(token_of(30)), token_of(10), None, 100)
        .unwrap()
        .records
        .is_empty());
}

#[test]
fn imported_records_read_back_with_their_deletions_and_a_second_import_changes_nothing() {
    let (_a, source) = open();
    let (_b, target) = open();
    fill(&source, 40);
    // The target already has a newer version of one row and an older one of another.
    let l = layout();
    let mut newer = mutation(token_of(1), "p1");
    newer.rows.push(row(0, "newer", 30));
    let mut older = mutation(token_of(2), "p2");
    older.rows.push(row(0, "older", 5));
    // And an old row of a partition the source deleted: the deletion must travel.
    let mut deleted = mutation(token_of(5), "p5");
    deleted.rows.push(row(3, "old", 5));
    target
        .apply(&[(&l, newer), (&l, older), (&l, deleted)])
        .unwrap();
    assert_eq!(live_rows(&target, 5), (1, false));

    let records = export_all(&source, None, i64::MAX, 256);
    for chunk in records.chunks(7) {
        for ticket in target.import_records(&layout(), chunk).unwrap() {
            futures_lite_block_on(target.wait_durable(ticket)).unwrap();
        }
    }
    for i in 0..40 {
        let (rows, statics) = live_rows(&target, i);
        if i % 5 == 0 {
            assert_eq!((rows, statics), (0, false), "p{i} stays deleted");
        } else {
            assert_eq!((rows, statics), live_rows(&source, i), "p{i}");
        }
    }
    let cell = |s: &Storage, i: i64| {
        let r = s
            .read_partition(
                &l,
                token_of(i),
                format!("p{i}").as_bytes(),
                &ClusteringSlice::all(),
                None,
                1,
                0,
            )
            .unwrap();
        r.rows[0].cells[0].value.clone()
    };
    assert_eq!(
        cell(&target, 1),
        text("newer"),
        "the newer local write wins"
    );
    assert_eq!(
        cell(&target, 2),
        text("v2.0"),
        "the newer streamed write wins"
    );

    assert!(target.wait_purges(Duration::from_secs(10)));
    let before = export_all(&target, None, i64::MAX, usize::MAX);
    target.import_records(&layout(), &records).unwrap();
    assert!(target.wait_purges(Duration::from_secs(10)));
    assert_eq!(export_all(&target, None, i64::MAX, usize::MAX), before);
}

#[test]
fn malformed_records_are_refused_before_anything_is_written() {
    let (_a, source) = open();
    let (_b, target) = open();
    fill(&source, 6);
    let mut records = export_all(&source, None, i64::MAX, usize::MAX);
    let good = records.clone();
    records.push(RawRecord {
        key: vec![1, 2, 3],
        value: vec![],
    });
    assert!(target.import_records(&layout(), &records).is_err());
    let mut bad_value = good.clone();
    bad_value[0].value = vec![0xFF; 3];
    assert!(target.import_records(&layout(), &bad_value).is_err());
    let mut bad_kind = good.clone();
    let last = bad_kind[0].key.len() - 1;
    bad_kind[0].key.truncate(last);
    bad_kind[0].key.push(0x7F);
    assert!(target.import_records(&layout(), &bad_kind).is_err());
    // Two rows' values swapped: each key names another row than its value holds.
    fn split(r: &RawRecord) -> (i64, Vec<u8>, u8, &[u8]) {
        crate::keycodec::split_data_key(&r.key).unwrap()
    }
    let first = (0..good.len() - 1)
        .find(|&i| {
            let (a, b) = (split(&good[i]), split(&good[i + 1]));
            a.2 == crate::keycodec::KIND_ROW && b.2 == a.2 && (a.0, &a.1) == (b.0, &b.1)
        })
        .expect("a partition with two rows");
    let rows = [first, first + 1];
    let mut swapped = good.clone();
    let value = swapped[rows[0]].value.clone();
    swapped[rows[0]].value = swapped[rows[1]].value.clone();
    swapped[rows[1]].value = value;
    assert_eq!(
        target.import_records(&layout(), &swapped).unwrap_err(),
        StorageError::Corrupt("a raw record's key is not the one its value gives")
    );
    // A table whose layout has one more clustering column than the rows carry.
    let mut wider = layout();
    wider.clustering.push(wider.clustering[0].clone());
    assert_eq!(
        target.import_records(&wider, &good).unwrap_err(),
        StorageError::Corrupt("row clustering key does not match the table layout")
    );
    assert!(export_all(&target, None, i64::MAX, usize::MAX).is_empty());
    assert!(target.import_records(&layout(), &good).is_ok());
    assert!(target.wait_purges(Duration::from_secs(10)));
    assert_eq!(export_all(&target, None, i64::MAX, usize::MAX), good);
}

/// Runs a future to completion on a current-thread runtime.
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}
