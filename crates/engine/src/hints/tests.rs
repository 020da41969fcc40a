use super::*;

fn host(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn config(dir: &Path) -> HintConfig {
    HintConfig {
        dir: dir.to_path_buf(),
        max_bytes: 1 << 20,
        max_file_bytes: 1 << 16,
        window: Duration::from_secs(3600),
        flush_interval: Duration::from_millis(10),
    }
}

fn body(tag: &str) -> Bytes {
    Bytes::copy_from_slice(tag.as_bytes())
}

/// Replays every hint of `host`, all delivered; their bodies in order.
async fn replay_all(store: &HintStore, host: Uuid) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(batch) = store.next_batch(host).await {
        out.extend(
            batch
                .bodies()
                .map(|b| String::from_utf8(b.to_vec()).unwrap()),
        );
        store.delivered(&batch, batch.len());
    }
    store.flush();
    out
}

fn hint_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn hints_are_written_replayed_in_order_and_their_file_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = HintStore::open(config(dir.path())).unwrap();
    for i in 0..5 {
        assert!(store.store(host(2), body(&format!("h{i}"))));
    }
    assert!(store.store(host(3), body("other")));
    store.flush();
    let s = store.stats();
    assert_eq!((s.held, s.stored, s.dropped), (6, 6, 0));
    let expected_disk = 2 * HEADER_BYTES
        + (0..5).map(|_| format::record_bytes(2)).sum::<u64>()
        + format::record_bytes(5);
    assert_eq!(
        (s.disk_bytes as u64, s.bytes as u64),
        (expected_disk, expected_disk)
    );
    assert_eq!(hint_files(dir.path()).len(), 2);
    let mut hosts = store.hosts();
    hosts.sort();
    assert_eq!(hosts, vec![host(2), host(3)]);

    assert_eq!(
        replay_all(&store, host(2)).await,
        ["h0", "h1", "h2", "h3", "h4"]
    );
    let s = store.stats();
    assert_eq!((s.held, s.replayed), (1, 5));
    assert_eq!(hint_files(dir.path()).len(), 1, "host 2's file is gone");
    assert_eq!(store.hosts(), vec![host(3)]);
    assert_eq!(replay_all(&store, host(3)).await, ["other"]);
    let s = store.stats();
    assert_eq!((s.held, s.bytes, s.disk_bytes, s.replayed), (0, 0, 0, 6));
    assert!(hint_files(dir.path()).is_empty());
}

#[tokio::test]
async fn hints_survive_a_restart_and_a_clean_close_writes_the_queue() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    // No batch would be written in the test's time: only the close writes them.
    cfg.flush_interval = Duration::from_secs(3600);
    {
        let store = HintStore::open(cfg.clone()).unwrap();
        for i in 0..3 {
            assert!(store.store(host(2), body(&format!("r{i}"))));
        }
        assert_eq!(store.stats().disk_bytes, 0, "still queued");
        store.close();
        assert!(!store.store(host(2), body("late")), "closed");
    }
    let store = HintStore::open(cfg).unwrap();
    let s = store.stats();
    assert_eq!(s.held, 3);
    assert_eq!(
        s.disk_bytes as u64,
        HEADER_BYTES + 3 * format::record_bytes(2)
    );
    assert_eq!(replay_all(&store, host(2)).await, ["r0", "r1", "r2"]);
    // New files continue the sequence: the new ones sort after what a restart found.
    assert!(store.store(host(2), body("new")));
    store.flush();
    assert_eq!(replay_all(&store, host(2)).await, ["new"]);
}

#[tokio::test]
async fn a_torn_tail_is_dropped_and_the_whole_records_replayed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = HintStore::open(config(dir.path())).unwrap();
        assert!(store.store(host(2), body("whole-1")));
        assert!(store.store(host(2), body("whole-2")));
        store.close();
    }
    // A crash in the middle of appending a third record.
    let file = &hint_files(dir.path())[0];
    let mut partial = Vec::new();
    format::encode_record(&mut partial, unix_millis(), b"never finished");
    partial.truncate(partial.len() - 5);
    std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .unwrap()
        .write_all(&partial)
        .unwrap();
    let store = HintStore::open(config(dir.path())).unwrap();
    assert_eq!(store.stats().held, 2);
    assert_eq!(replay_all(&store, host(2)).await, ["whole-1", "whole-2"]);
    assert!(hint_files(dir.path()).is_empty(), "replayed: deleted");
}

#[tokio::test]
async fn a_checksum_mismatch_drops_the_rest_of_that_file_only() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = HintStore::open(config(dir.path())).unwrap();
        for tag in ["aaaa", "bbbb", "cccc"] {
            assert!(store.store(host(2), body(tag)));
        }
        assert!(store.store(host(3), body("dddd")));
        store.close();
    }
    let files = hint_files(dir.path());
    let host2 = files
        .iter()
        .find(|p| p.to_str().unwrap().contains(&host(2).to_string()))
        .unwrap();
    let mut bytes = std::fs::read(host2).unwrap();
    // The body of the second record.
    let at = (HEADER_BYTES + format::record_bytes(4)) as usize + 16;
    assert_eq!(&bytes[at..at + 4], b"bbbb");
    bytes[at] = b'X';
    std::fs::write(host2, bytes).unwrap();
    let store = HintStore::open(config(dir.path())).unwrap();
    assert_eq!(store.stats().held, 2, "aaaa and host 3's dddd");
    assert_eq!(replay_all(&store, host(2)).await, ["aaaa"]);
    assert_eq!(replay_all(&store, host(3)).await, ["dddd"]);
    assert!(hint_files(dir.path()).is_empty());
}

#[tokio::test]
async fn the_byte_bound_removes_the_oldest_files_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let record = format::record_bytes(100);
    // Files of two records; room for about six records with their headers.
    cfg.max_file_bytes = HEADER_BYTES + 2 * record;
    cfg.max_bytes = 3 * (HEADER_BYTES + 2 * record);
    let store = HintStore::open(cfg.clone()).unwrap();
    let hint = |i: u8| Bytes::from(vec![i; 100]);
    for i in 0..6 {
        assert!(store.store(host(2), hint(i)), "hint {i} fits");
        store.flush();
    }
    let s = store.stats();
    assert_eq!((s.held, s.dropped), (6, 0));
    assert_eq!(hint_files(dir.path()).len(), 3);
    assert!(s.bytes as u64 <= cfg.max_bytes);
    // Two more: the oldest file (hints 0 and 1) goes to make room.
    assert!(store.store(host(2), hint(6)));
    store.flush();
    assert!(store.store(host(2), hint(7)));
    store.flush();
    let s = store.stats();
    assert_eq!((s.held, s.dropped, s.stored), (6, 2, 8));
    assert!(s.bytes as u64 <= cfg.max_bytes, "{s:?}");
    let mut firsts = Vec::new();
    while let Some(batch) = store.next_batch(host(2)).await {
        firsts.extend(batch.bodies().map(|b| b[0]));
        store.delivered(&batch, batch.len());
    }
    assert_eq!(firsts, [2, 3, 4, 5, 6, 7]);

    // Nothing sealed to remove (one file being appended): a hint that does not fit is
    // dropped, never written past the bound.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.max_bytes = HEADER_BYTES + 2 * record;
    let store = HintStore::open(cfg).unwrap();
    assert!(store.store(host(2), hint(0)));
    assert!(store.store(host(2), hint(1)));
    store.flush();
    assert!(!store.store(host(2), hint(2)));
    let s = store.stats();
    assert_eq!((s.held, s.dropped), (2, 1));
}

#[tokio::test]
async fn hints_older_than_the_window_are_skipped_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let store = HintStore::open(cfg.clone()).unwrap();
    let now = unix_millis();
    let old = now - cfg.window.as_millis() as u64 - 1000;
    assert!(store.store_at(host(2), body("old-1"), old));
    assert!(store.store_at(host(2), body("fresh"), now));
    assert!(store.store_at(host(2), body("old-2"), old));
    store.flush();
    // The file has a fresh record: replay skips the old ones and counts them.
    assert_eq!(replay_all(&store, host(2)).await, ["fresh"]);
    let s = store.stats();
    assert_eq!((s.held, s.replayed, s.dropped), (0, 1, 2));
    assert!(hint_files(dir.path()).is_empty());

    // A file with only old records is removed without a replay (once sealed).
    assert!(store.store_at(host(3), body("stale"), old));
    store.flush();
    assert!(store.next_batch(host(4)).await.is_none());
    let started = Instant::now();
    while !hint_files(dir.path()).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(5), "swept");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = store.stats();
    assert_eq!((s.held, s.dropped, s.disk_bytes), (0, 3, 0));

    // A restart drops files past the window as it finds them (written with a longer one).
    drop(store);
    let mut long = cfg.clone();
    long.window = Duration::from_secs(1 << 30);
    let store = HintStore::open(long).unwrap();
    assert!(store.store_at(host(5), body("stale"), old));
    store.close();
    drop(store);
    assert_eq!(hint_files(dir.path()).len(), 1);
    let store = HintStore::open(cfg).unwrap();
    let s = store.stats();
    assert_eq!((s.held, s.dropped), (0, 1));
    assert!(hint_files(dir.path()).is_empty());
}

#[tokio::test]
async fn an_interrupted_replay_resumes_after_the_last_delivered_hint() {
    let dir = tempfile::tempdir().unwrap();
    let store = HintStore::open(config(dir.path())).unwrap();
    for tag in ["a", "b", "c"] {
        assert!(store.store(host(2), body(tag)));
    }
    store.flush();
    let batch = store.next_batch(host(2)).await.unwrap();
    assert_eq!(batch.len(), 3);
    // A batch is out: the file is not handed out twice.
    assert!(store.next_batch(host(2)).await.is_none());
    store.delivered(&batch, 1);
    // Hints stored while a replay runs go to a new file (the replayed one was sealed).
    assert!(store.store(host(2), body("d")));
    store.flush();
    assert_eq!(hint_files(dir.path()).len(), 2);
    let s = store.stats();
    assert_eq!((s.held, s.replayed), (3, 1));
    assert_eq!(replay_all(&store, host(2)).await, ["b", "c", "d"]);
    // A batch given up without a delivery leaves every hint for the next one.
    assert!(store.store(host(2), body("e")));
    store.flush();
    let batch = store.next_batch(host(2)).await.unwrap();
    store.delivered(&batch, 0);
    assert_eq!(replay_all(&store, host(2)).await, ["e"]);
    assert_eq!(store.stats().replayed, 5);
}

#[test]
fn files_not_ours_are_left_alone_and_empty_ones_removed() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), b"not a hint file").unwrap();
    let empty = dir.path().join(format::file_name(host(2), 7));
    std::fs::write(&empty, &format::FILE_MAGIC[..3]).unwrap();
    let store = HintStore::open(config(dir.path())).unwrap();
    assert_eq!(store.stats().held, 0);
    assert!(!empty.exists());
    assert!(dir.path().join("README").exists());
    // New files continue after the highest sequence found.
    assert!(store.store(host(2), body("x")));
    store.flush();
    let names: Vec<String> = hint_files(dir.path())
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|n| n.ends_with(".hints"))
        .collect();
    assert_eq!(names, vec![format::file_name(host(2), 8)]);
}
