//! A full disk, for real: the node's data directory on a 64 MiB tmpfs. Writes fill it until
//! they are refused with a clear error, reads go on, freeing space lets writes succeed again
//! without a restart, and after a restart every acknowledged write is there.
//!
//! Without the reserve, fjall meets ENOSPC itself and stops accepting writes until a
//! restart; nothing acknowledged is lost.
//!
//! Mounting needs root (CI runs as root); elsewhere the test says so and does nothing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{connect, create_keyspace, Node};
use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

const ROW_BYTES: usize = 100_000;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Row `k`'s value: pseudo-random bytes, so that compression cannot shrink them.
fn value_of(k: i32) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ k as u64;
    (0..ROW_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `df` of the mount, for the log.
fn df(at: &Path) -> String {
    let out = Command::new("df").arg("-k").arg(at).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .to_string()
}

async fn insert(session: &Session, ins: &PreparedStatement, k: i32) -> Result<(), String> {
    session
        .execute_unpaged(ins, (k, value_of(k)))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

async fn read(session: &Session, k: i32) -> Option<Vec<u8>> {
    session
        .query_unpaged("SELECT v FROM dfull.kv WHERE k = ?", (k,))
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .maybe_first_row::<(Vec<u8>,)>()
        .unwrap()
        .map(|(v,)| v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_and_recovers_when_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    // The reserve must cover what storage writes at once between two free-space checks: a
    // table's memtable flush (16 MiB) and the compaction it can start.
    let Some(fs) = Tmpfs::mount(&dir.path().join("fs"), "256m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs (needs root)");
        return;
    };
    // Space the test frees later, taken before the node starts.
    let ballast = fs.0.join("ballast");
    std::fs::write(&ballast, vec![0u8; 24 << 20]).unwrap();
    let data = fs.0.join("data");
    let args = ["--min-free-disk-bytes", "96MiB", "--cache-bytes", "8MiB"];
    let mut node = Node::start(&data, 1, &args);
    let session = connect(&node).await;
    create_keyspace(&session, "dfull").await;
    session
        .query_unpaged("CREATE TABLE dfull.kv (k int PRIMARY KEY, v blob)", &[])
        .await
        .unwrap();
    let ins = session
        .prepare("INSERT INTO dfull.kv (k, v) VALUES (?, ?)")
        .await
        .unwrap();

    // Fill: every acknowledged key is remembered; the first refusal names the cause.
    let mut acked = Vec::new();
    let mut k = 0;
    let refusal = loop {
        match insert(&session, &ins, k).await {
            Ok(()) => acked.push(k),
            Err(e) => break e,
        }
        k += 1;
        assert!(k < 5000, "256 MiB never filled");
    };
    eprintln!(
        "{} writes of 100 KB acknowledged, then: {refusal}",
        acked.len()
    );
    eprintln!("full: {}", df(&fs.0));
    assert!(
        refusal.contains("No space left on device"),
        "unclear refusal: {refusal}"
    );
    assert!(
        acked.len() > 10,
        "only {} writes before the disk filled",
        acked.len()
    );
    // Refused again, and reads go on.
    let again = insert(&session, &ins, k).await.unwrap_err();
    assert!(again.contains("No space left on device"), "{again}");
    for &k in acked.iter().step_by(7) {
        assert_eq!(read(&session, k).await, Some(value_of(k)));
    }

    // Free space: writes succeed again by themselves, without a restart.
    std::fs::remove_file(&ballast).unwrap();
    eprintln!("freed: {}", df(&fs.0));
    let freed = Instant::now();
    loop {
        match insert(&session, &ins, k).await {
            Ok(()) => break,
            Err(e) => {
                assert!(e.contains("No space left on device"), "{e}");
                assert!(
                    freed.elapsed() < Duration::from_secs(10),
                    "writes still refused 10 s after space was freed: {}",
                    df(&fs.0)
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    eprintln!(
        "writes accepted again {:?} after space was freed",
        freed.elapsed()
    );
    acked.push(k);
    for k in k + 1..k + 20 {
        insert(&session, &ins, k).await.unwrap();
        acked.push(k);
    }

    // A restart keeps every acknowledged write.
    drop(session);
    assert!(node.terminate().success(), "{}", node.log());
    let node = Node::start(&data, 1, &args);
    let session = connect(&node).await;
    for &k in &acked {
        assert_eq!(
            read(&session, k).await,
            Some(value_of(k)),
            "acknowledged key {k} lost"
        );
    }
    drop(session);
    drop(node);
    drop(fs);
}

/// Without the reserve (`--min-free-disk-bytes 0`) fjall itself meets `ENOSPC` and stops
/// accepting writes: the error must say so, reads go on, and after space is freed a restart
/// finds every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_reserve_a_full_disk_stops_writes_clearly_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&dir.path().join("fs"), "64m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs (needs root)");
        return;
    };
    let ballast = fs.0.join("ballast");
    std::fs::write(&ballast, vec![0u8; 24 << 20]).unwrap();
    let data = fs.0.join("data");
    let args = ["--min-free-disk-bytes", "0", "--cache-bytes", "8MiB"];
    let mut node = Node::start(&data, 1, &args);
    let session = connect(&node).await;
    create_keyspace(&session, "dfull").await;
    session
        .query_unpaged("CREATE TABLE dfull.kv (k int PRIMARY KEY, v blob)", &[])
        .await
        .unwrap();
    let ins = session
        .prepare("INSERT INTO dfull.kv (k, v) VALUES (?, ?)")
        .await
        .unwrap();
    let mut acked = Vec::new();
    let mut k = 0;
    let refusal = loop {
        match insert(&session, &ins, k).await {
            Ok(()) => acked.push(k),
            Err(e) => break e,
        }
        k += 1;
        assert!(k < 2000, "64 MiB never filled");
    };
    eprintln!(
        "{} writes of 100 KB acknowledged, then: {refusal}",
        acked.len()
    );
    eprintln!("full: {}", df(&fs.0));
    let again = insert(&session, &ins, k + 1).await.unwrap_err();
    eprintln!("next write: {again}");
    assert!(
        refusal.contains("no space left on device") || refusal.contains("Storage stopped"),
        "unclear refusal: {refusal}"
    );
    assert!(
        again.contains("restart the node"),
        "unclear refusal: {again}"
    );
    for &k in acked.iter().rev().take(20) {
        assert_eq!(
            read(&session, k).await,
            Some(value_of(k)),
            "read of key {k}"
        );
    }
    std::fs::remove_file(&ballast).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after_free = insert(&session, &ins, k + 2).await;
    eprintln!("after freeing space, without a restart: {after_free:?}");
    // fjall stays poisoned until it is reopened: this is what the reserve avoids.
    assert!(after_free.is_err_and(|e| e.contains("restart the node")));
    drop(session);
    let status = node.terminate();
    eprintln!("stopped: {status}");
    let node = Node::start(&data, 1, &args);
    let session = connect(&node).await;
    for &k in &acked {
        assert_eq!(
            read(&session, k).await,
            Some(value_of(k)),
            "acknowledged key {k} lost"
        );
    }
    insert(&session, &ins, k + 3).await.unwrap();
    drop(session);
    drop(node);
    drop(fs);
}
