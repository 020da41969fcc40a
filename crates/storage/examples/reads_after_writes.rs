//! Instructions of a point read on a fresh table and after heavy writes of new keys, for
//! callgrind: the storage side of latte's `basic` workload (`id bigint PRIMARY KEY`, reads of
//! the first 100,000 keys). Only `measured` is meant to be counted
//! (`--toggle-collect='*reads_after_writes::measured*'`); run with N and 2N reads and take the
//! difference / N, so that opening, writing and warming up cancel out.
//!
//! Usage (one store, data in DIR):
//! - `reads_after_writes fresh DIR N`: writes the old keys (they stay in the memtable), then
//!   reads them N times.
//! - `reads_after_writes prepare DIR NEW`: writes the old keys, then NEW new keys, flushes,
//!   and waits for compaction to settle; prints the disk tables.
//! - `reads_after_writes read DIR N`: opens a prepared DIR, writes 50,000 more new keys (the
//!   memtable is never empty under writes), warms the cache with one pass over the old keys,
//!   then reads them N times.

mod common;

use common::{layout, one_row, token};
use sluice_storage::{ClusteringSlice, Mutation, Storage};
use std::path::Path;
use std::time::{Duration, Instant};

const TABLE: [u8; 16] = [7; 16];
/// The keys latte's reads ask for (its `rows` parameter).
const OLD_KEYS: u64 = 100_000;
/// New keys written after opening a prepared directory, before reading.
const MEMTABLE_KEYS: u64 = 50_000;

/// latte's INSERT of `id` alone: a row marker, no cells.
fn insert(id: u64, timestamp: i64) -> Mutation {
    one_row(TABLE, id, timestamp, vec![])
}

fn open(dir: &Path) -> Storage {
    common::open(dir, 128 << 20)
}

fn write(storage: &Storage, from: u64, to: u64) {
    let layout = layout(TABLE);
    for id in from..to {
        storage
            .apply(&[(&layout, insert(id, id as i64 + 1))])
            .expect("write");
    }
}

/// One read of each of `n` old keys, scattered as latte's hash scatters them.
fn read(storage: &Storage, n: u64) -> usize {
    let layout = layout(TABLE);
    let mut found = 0;
    for i in 0..n {
        let id = i.wrapping_mul(7919) % OLD_KEYS;
        let r = storage
            .read_partition(
                &layout,
                token(id),
                &id.to_be_bytes(),
                &ClusteringSlice::all(),
                None,
                1,
                0,
            )
            .expect("read");
        found += r.rows.len();
    }
    found
}

/// The reads counted by callgrind.
#[inline(never)]
fn measured(storage: &Storage, n: u64) -> usize {
    read(storage, n)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, dir, n) = match &args[..] {
        [mode, dir, n] => (mode.as_str(), Path::new(dir), n.parse::<u64>().expect("N")),
        _ => panic!("usage: reads_after_writes fresh|prepare|read DIR N"),
    };
    match mode {
        "fresh" => {
            let storage = open(dir);
            write(&storage, 0, OLD_KEYS);
            read(&storage, OLD_KEYS);
            let found = measured(&storage, n);
            assert_eq!(found as u64, n, "every old key is found");
            println!(
                "fresh: {n} reads, {} disk tables",
                storage.disk_table_count()
            );
        }
        "prepare" => {
            let storage = open(dir);
            let started = Instant::now();
            write(&storage, 0, OLD_KEYS + n);
            println!(
                "wrote {} keys in {:.1} s",
                OLD_KEYS + n,
                started.elapsed().as_secs_f64()
            );
            storage.flush_memtables(Duration::from_secs(120));
            // Compaction settles once the table count has not changed for 5 s.
            let mut last = (usize::MAX, Instant::now());
            while last.1.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(200));
                let now = storage.disk_table_count();
                if now != last.0 {
                    last = (now, Instant::now());
                }
            }
            println!(
                "prepared: {} disk tables, {} in level 0",
                storage.disk_table_count(),
                storage.l0_disk_table_count()
            );
        }
        "read" => {
            let storage = open(dir);
            write(&storage, 1 << 40, (1 << 40) + MEMTABLE_KEYS);
            read(&storage, OLD_KEYS);
            let found = measured(&storage, n);
            assert_eq!(found as u64, n, "every old key is found");
            println!(
                "read: {n} reads, {} disk tables, {} in level 0",
                storage.disk_table_count(),
                storage.l0_disk_table_count()
            );
        }
        other => panic!("unknown mode {other}"),
    }
}
