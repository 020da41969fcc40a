//! The critical section of a two-partition transaction carrying large values, measured at
//! the storage: the shape of `scripts/txn-critical-section.py` (two LET reads of stored
//! rows, two UPDATEs of `(ver, body)` known before the locks, in two stores) without the
//! server around it, so that it can run under callgrind
//! (`--toggle-collect='*locked_section*'`). Ignored: it measures, it checks little.
//!
//! `cargo test -p sluice-storage --release critical_section -- --ignored --nocapture`
//! (`CRITSEC_SIZES=1024,1048576`, `CRITSEC_TXNS=200` to change the run).

use crate::*;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

const T: TableId = [7; 16];
const VER: ColumnId = 1;
const BODY: ColumnId = 2;
/// Rows per run: a transaction's two are drawn from them, one in each store.
const KEYS: usize = 64;

fn layout() -> TableLayout {
    TableLayout {
        id: T,
        clustering: vec![],
        regular: Some(Arc::new(RegularColumns::new(vec![
            (VER, false),
            (BODY, false),
        ]))),
        gc_grace_seconds: crate::DEFAULT_GC_GRACE_SECONDS,
    }
}

fn cell(column: ColumnId, value: Bytes, timestamp: i64) -> CellWrite {
    CellWrite {
        column,
        path: None,
        value: CellValue::Live(value),
        timestamp,
        expiry: None,
    }
}

/// `INSERT (id, ver, body)` when `insert`, else `UPDATE SET body = ?, ver = ?` (no
/// liveness: the commit merges it with the stored row).
fn write(token: i64, pk: &[u8], body: &Bytes, ver: i64, ts: i64, insert: bool) -> Mutation {
    Mutation {
        table: T,
        token,
        partition_key: Bytes::copy_from_slice(pk),
        partition_deletion: None,
        range_deletions: vec![],
        static_row: None,
        rows: vec![RowMutation {
            clustering: vec![],
            liveness: insert.then_some(Liveness {
                timestamp: ts,
                expiry: None,
            }),
            deletion: None,
            collection_deletions: vec![],
            cells: vec![
                cell(VER, Bytes::copy_from_slice(&ver.to_be_bytes()), ts),
                cell(BODY, body.clone(), ts),
            ],
        }],
    }
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let at = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[at - 1]
}

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// Runs `txns` transactions with `size`-byte bodies; returns the critical sections.
fn run(size: usize, txns: usize) -> Vec<Duration> {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(StorageConfig {
        path: dir.path().to_path_buf(),
        durability: Durability::Periodic {
            interval: Duration::from_millis(100),
        },
        cache_bytes: 64 << 20,
        stores: 2,
    })
    .unwrap();
    let l = layout();
    let keys: Vec<(i64, Vec<u8>)> = (0..KEYS as u64)
        .map(|k| {
            let token = (k + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) as i64;
            (token, format!("k{k}").into_bytes())
        })
        .collect();
    let (left, right): (Vec<_>, Vec<_>) = keys
        .iter()
        .partition(|(token, _)| s.store_of(*token) == s.store_of(keys[0].0));
    assert!(!left.is_empty() && !right.is_empty());
    let body = Bytes::from(vec![b'x'; size]);
    let mut ts = 1_000_000i64;
    for (token, pk) in &keys {
        ts += 1;
        s.apply(&[(&l, write(*token, pk, &body, 0, ts, true))])
            .unwrap();
    }
    let mut spent = Vec::with_capacity(txns);
    for n in 0..txns {
        let (a, b) = (left[n % left.len()], right[(n * 7) % right.len()]);
        ts += 10;
        let reads = [a, b].map(|(token, pk)| TxnRead {
            layout: &l,
            token: *token,
            partition_key: pk,
            slice: ClusteringSlice::all(),
            limit: 1,
        });
        let partitions = [a, b].map(|(token, _)| TxnPartition {
            table: T,
            token: *token,
        });
        let known = [
            (&l, write(a.0, &a.1, &body, n as i64, ts, false)),
            (&l, write(b.0, &b.1, &body, n as i64, ts, false)),
        ];
        let out = s
            .apply_transaction(&partitions, &reads, &known, 0, ts, |found| {
                assert!(found.iter().all(|r| r.rows.len() == 1));
                Ok::<_, ()>(Vec::new())
            })
            .unwrap();
        assert_eq!(out.timestamp, Some(ts));
        spent.push(out.locked_for);
    }
    spent
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn critical_section_of_two_partition_transactions() {
    let txns = env_list("CRITSEC_TXNS", &[200])[0];
    for size in env_list("CRITSEC_SIZES", &[1024, 1 << 20]) {
        let mut spent = run(size, txns);
        assert_eq!(spent.len(), txns);
        let mean = spent.iter().sum::<Duration>() / txns as u32;
        spent.sort_unstable();
        println!(
            "critical section, 2 x {size} B, {txns} transactions: p50 {:?} p99 {:?} max {:?} mean {:?}",
            quantile(&spent, 0.5),
            quantile(&spent, 0.99),
            spent[txns - 1],
            mean
        );
    }
}
