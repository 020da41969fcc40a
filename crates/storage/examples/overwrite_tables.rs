//! Overwrites the same partitions at full speed for a while and reports, every second, the
//! write rate, the disk tables (all, and in level 0) and the time of a partition read: a
//! read visits every level-0 table that may hold its partition, so compaction has to keep
//! level 0 short while overwrites arrive.
//!
//! Usage: `cargo run --release -p sluice-storage --example overwrite_tables [SECONDS] [PARTITIONS]`
//! (defaults 60 and 1,000,000; one-row partitions of 100-byte values, one store, data under a
//! temporary directory in /tmp that is removed at the end).

mod common;

use bytes::Bytes;
use common::{layout, one_row};
use sluice_storage::{CellValue, CellWrite, ClusteringSlice, Mutation, Storage, TableLayout};
use std::time::{Duration, Instant};

const TABLE: [u8; 16] = [5; 16];
/// Reads timed at each report.
const READS: u64 = 2_000;

/// A write of partition `partition`: one row with one 100-byte value.
fn overwrite(partition: u64, timestamp: i64) -> Mutation {
    let value = CellWrite {
        column: 1,
        path: None,
        value: CellValue::Live(Bytes::from(vec![partition as u8; 100])),
        timestamp,
        expiry: None,
    };
    one_row(TABLE, partition, timestamp, vec![value])
}

/// Mean microseconds of a read of one partition, over [`READS`] partitions.
fn read_micros(storage: &Storage, layout: &TableLayout, partitions: u64, from: u64) -> f64 {
    let started = Instant::now();
    for i in 0..READS {
        let m = overwrite((from + i * 7919) % partitions, 0);
        let read = storage
            .read_partition(
                layout,
                m.token,
                &m.partition_key,
                &ClusteringSlice::all(),
                None,
                1,
                0,
            )
            .expect("read");
        assert_eq!(read.rows.len(), 1, "every partition was written");
    }
    started.elapsed().as_secs_f64() * 1e6 / READS as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map_or(60, |a| a.parse().expect("SECONDS"));
    let partitions: u64 = args
        .next()
        .map_or(1_000_000, |a| a.parse().expect("PARTITIONS"));
    let dir = tempfile::tempdir_in("/tmp").expect("temp dir");
    let storage = common::open(dir.path(), 64 << 20);
    let layout = layout(TABLE);
    let mut timestamp = 1i64;
    for p in 0..partitions {
        storage
            .apply(&[(&layout, overwrite(p, timestamp))])
            .expect("write");
        timestamp += 1;
    }

    println!("second  writes/s  disk_tables  l0_tables  read_us");
    let started = Instant::now();
    let mut next_report = 1u64;
    let mut interval = Instant::now();
    let mut written = 0u64;
    let mut max_tables = 0;
    let mut max_l0 = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        // The stride visits every partition before it comes back (it is prime to the count
        // unless the count is a multiple of it).
        let p = (timestamp as u64).wrapping_mul(7_919) % partitions;
        storage
            .apply(&[(&layout, overwrite(p, timestamp))])
            .expect("write");
        timestamp += 1;
        written += 1;
        if started.elapsed() >= Duration::from_secs(next_report) {
            let rate = written as f64 / interval.elapsed().as_secs_f64();
            let tables = storage.disk_table_count();
            let l0 = storage.l0_disk_table_count();
            max_tables = max_tables.max(tables);
            max_l0 = max_l0.max(l0);
            let read = read_micros(&storage, &layout, partitions, timestamp as u64);
            println!(
                "{:>6}  {:>8.0}  {:>11}  {:>9}  {:>7.1}",
                next_report, rate, tables, l0, read
            );
            written = 0;
            interval = Instant::now();
            // The reads took time of their own: the next second starts after them.
            next_report = started.elapsed().as_secs() + 1;
        }
    }
    println!("max disk tables {max_tables}, max level-0 tables {max_l0}");
}
