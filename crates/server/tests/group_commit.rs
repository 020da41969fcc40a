//! Admission counts a write's wait for its group fsync (`--durability batch`): a write
//! expected to wait longer than two bare fsyncs plus `AdmissionConfig::group_commit_wait` is
//! turned away `Overloaded` in the check stage, before it runs, and is no latency sample; one
//! whose wait would pass its deadline is answered with a write timeout at once; reads, writes
//! of paced connections and a short wait are served. Storage's test hook stands in for a slow
//! fsync, so the real pipeline decides on a known wait.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

mod support;

use sluice_storage::GroupCommitWait;
use support::request_path::{
    bench_with, execute_frame, fixed_admission_config, query_frame, Bench,
};

const RESULT: u8 = 0x08;
const ERROR: u8 = 0x00;
const OVERLOADED: u32 = 0x1001;
const WRITE_TIMEOUT: u32 = 0x1100;

/// The error code of the bench's last answer, if it was an error.
fn code(b: &Bench) -> Option<u32> {
    let f = &b.wire().last;
    (f[4] == ERROR).then(|| u32::from_be_bytes([f[9], f[10], f[11], f[12]]))
}

fn assume(b: &Bench, expected_ms: u64, fsync_ms: u64) {
    b.wire()
        .shard
        .engine
        .storage()
        .assume_group_commit_wait(Some(GroupCommitWait {
            expected: Duration::from_millis(expected_ms),
            fsync: Duration::from_millis(fsync_ms),
        }));
}

/// `config` with a 2.5 ms group-commit wait (off by default), for connections that are not
/// paced (`--admission-pace-windows off`): a paced connection's write joins the fsync.
fn watching(mut config: sluice_server::ServerConfig) -> sluice_server::ServerConfig {
    if let Some(a) = config.admission.as_mut() {
        a.group_commit_wait = Duration::from_micros(2500);
        a.pace_windows = false;
    }
    config
}

fn samples(b: &Bench) -> u64 {
    b.wire().shard.metrics.latency_samples.load(Relaxed)
}

#[test]
fn a_write_that_would_wait_too_long_for_its_fsync_is_turned_away_before_it_runs() {
    let (mut b, _dir) = bench_with(watching(fixed_admission_config(64, 8)));
    let engine = b.wire().shard.engine.clone();
    let insert = engine
        .prepare(None, "INSERT INTO ks.t (k, v) VALUES (?, ?)")
        .expect("prepare");
    let write = |k| execute_frame(1, &insert.id, k, k);
    assert_eq!(b.one(&write(1)), RESULT, "no wait assumed yet");

    // Bound: two bare fsyncs (2 ms) plus 2.5 ms. A 4 ms wait is served.
    assume(&b, 4, 1);
    let before = samples(&b);
    assert_eq!(b.one(&write(2)), RESULT);
    assert_eq!(
        samples(&b),
        before + 1,
        "a served write is a latency sample"
    );

    // A 40 ms wait: turned away, unexecuted, no latency sample.
    assume(&b, 40, 1);
    let before = samples(&b);
    assert_eq!(b.one(&write(3)), ERROR);
    assert_eq!(code(&b), Some(OVERLOADED));
    let batch = support::node::batch(2, &["INSERT INTO ks.t (k, v) VALUES (4, 4)"]);
    assert_eq!(b.one(&batch), ERROR, "a batch is a write too");
    assert_eq!(code(&b), Some(OVERLOADED));
    assert_eq!(samples(&b), before, "rejections taught the limit a latency");
    let shard = b.wire().shard.clone();
    let m = &shard.metrics;
    assert_eq!(m.rejected_group_commit.load(Relaxed), 2);
    assert!(m.rejected_overloaded.load(Relaxed) >= 2);

    // A read waits for no fsync.
    assert_eq!(
        b.one(&query_frame(3, "SELECT v FROM ks.t WHERE k = 2")),
        RESULT
    );
    let one_row = b.wire().last.len();

    // A wait past the 2 s write deadline: a write timeout at once.
    assume(&b, 3000, 1);
    assert_eq!(b.one(&write(5)), ERROR);
    assert_eq!(code(&b), Some(WRITE_TIMEOUT));
    assert_eq!(m.expired_group_commit.load(Relaxed), 1);
    assert_eq!(m.expired_before_execution.load(Relaxed), 1);
    // A wait too long to add to an instant is past the deadline too (no overflow).
    shard
        .engine
        .storage()
        .assume_group_commit_wait(Some(GroupCommitWait {
            expected: Duration::MAX,
            fsync: Duration::from_millis(1),
        }));
    assert_eq!(b.one(&write(6)), ERROR);
    assert_eq!(code(&b), Some(WRITE_TIMEOUT));
    assert_eq!(m.expired_group_commit.load(Relaxed), 2);

    // Nothing turned away was written.
    b.wire()
        .shard
        .engine
        .storage()
        .assume_group_commit_wait(None);
    assert_eq!(
        b.one(&query_frame(4, "SELECT v FROM ks.t WHERE k = 999")),
        RESULT
    );
    let no_row = b.wire().last.len();
    assert!(no_row < one_row);
    for k in [3, 4, 5, 6] {
        let q = format!("SELECT v FROM ks.t WHERE k = {k}");
        assert_eq!(b.one(&query_frame(5, &q)), RESULT);
        assert_eq!(b.wire().last.len(), no_row, "partition {k} has no row");
    }
}

#[test]
fn paced_connections_and_the_default_setting_join_the_fsync() {
    let mut paced = watching(fixed_admission_config(64, 8));
    if let Some(a) = paced.admission.as_mut() {
        a.pace_windows = true;
    }
    // The default: no group-commit wait.
    let off = fixed_admission_config(64, 8);
    for config in [paced, off] {
        let (mut b, _dir) = bench_with(config);
        let insert = b
            .wire()
            .shard
            .engine
            .prepare(None, "INSERT INTO ks.t (k, v) VALUES (?, ?)")
            .expect("prepare");
        assume(&b, 40, 1);
        assert_eq!(b.one(&execute_frame(1, &insert.id, 1, 1)), RESULT);
        assert_eq!(
            b.one(&query_frame(2, "SELECT v FROM ks.t WHERE k = 1")),
            RESULT
        );
        assert_eq!(
            b.wire().shard.metrics.rejected_group_commit.load(Relaxed),
            0
        );
    }
}
