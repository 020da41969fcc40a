//! The patched engine's `Snapshot::get_pair` (vendor/lsm-tree and vendor/fjall, "Sluice
//! patch") answers what two `get`s at the same snapshot answer, wherever the versions of the
//! two keys lie: active or sealed memtable, disk tables, tombstones, keys between the two,
//! versions newer than the snapshot, with and without a hash index in the data blocks.

use fjall::{Database, Keyspace, KeyspaceCreateOptions, Readable, Snapshot};

/// Partitions whose header and row keys the test writes.
const PARTITIONS: u32 = 40;

/// A small deterministic generator (xorshift), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % u64::from(n)) as u32
    }
}

/// The header key, a key sorting between header and row, and the row key of partition `p`,
/// laid out as the table keyspaces lay them out (a prefix, then a kind byte).
fn keys(p: u32) -> [Vec<u8>; 3] {
    let prefix = format!("p{p:04}");
    let mut header = prefix.clone().into_bytes();
    header.push(0x00);
    let mut between = header.clone();
    between.push(b'x');
    let mut row = prefix.into_bytes();
    row.push(0x01);
    [header, between, row]
}

/// Checks `get_pair` against two `get`s for every partition at `snapshot`.
fn check(snapshot: &Snapshot, ks: &Keyspace, context: &str) {
    for p in 0..PARTITIONS {
        let [header, _, row] = keys(p);
        let pair = snapshot.get_pair(ks, &header, &row).unwrap();
        let gets = (
            snapshot.get(ks, &header).unwrap(),
            snapshot.get(ks, &row).unwrap(),
        );
        assert_eq!(pair, gets, "partition {p}, {context}");
    }
}

fn run(options: fn() -> KeyspaceCreateOptions, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::builder(dir.path()).open().unwrap();
    let ks = db.keyspace("data", options).unwrap();
    let mut rng = Rng(seed);
    let mut held: Vec<(Snapshot, usize)> = Vec::new();
    let mut answered = 0usize;
    for step in 0..3_000usize {
        let p = rng.below(PARTITIONS);
        let key = &keys(p)[rng.below(3) as usize];
        let mut batch = db.batch();
        if rng.below(5) == 0 {
            batch.remove(&ks, key.clone());
        } else {
            batch.insert(&ks, key.clone(), (step as u32).to_be_bytes());
        }
        batch.commit().unwrap();
        match rng.below(200) {
            // A flush, waited for: the versions so far go to a disk table.
            0 => ks.rotate_memtable_and_wait().unwrap(),
            // A rotation not waited for: reads may find a sealed memtable.
            1 => {
                ks.rotate_memtable().unwrap();
            }
            // A snapshot kept while later writes pile newer versions on top.
            2..=5 if held.len() < 8 => held.push((db.snapshot(), step)),
            _ => {}
        }
        if step % 100 == 0 {
            check(&db.snapshot(), &ks, &format!("step {step}"));
            answered += 1;
        }
    }
    for (snapshot, step) in &held {
        check(snapshot, &ks, &format!("snapshot of step {step}"));
    }
    check(&db.snapshot(), &ks, "the end");
    assert!(answered >= 30 && !held.is_empty());
}

fn plain() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default()
}

fn hashed() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default()
        .data_block_hash_ratio_policy(fjall::config::HashRatioPolicy::all(1.0))
}

#[test]
fn a_pair_read_answers_what_two_gets_answer() {
    for seed in [1, 7, 1234] {
        run(plain, seed);
    }
}

#[test]
fn a_pair_read_answers_what_two_gets_answer_with_hashed_blocks() {
    for seed in [3, 99] {
        run(hashed, seed);
    }
}

#[test]
fn a_pair_read_finds_a_row_behind_many_newer_versions() {
    // More versions newer than the snapshot than the memtable walk steps over.
    let dir = tempfile::tempdir().unwrap();
    let db = Database::builder(dir.path()).open().unwrap();
    let ks = db.keyspace("data", KeyspaceCreateOptions::default).unwrap();
    let [header, between, row] = keys(1);
    let mut batch = db.batch();
    batch.insert(&ks, header.clone(), *b"h1");
    batch.insert(&ks, row.clone(), *b"r1");
    batch.commit().unwrap();
    let snapshot = db.snapshot();
    for i in 0..50u32 {
        let mut batch = db.batch();
        batch.insert(&ks, row.clone(), i.to_be_bytes());
        batch.insert(&ks, between.clone(), i.to_be_bytes());
        batch.commit().unwrap();
    }
    let (h, r) = snapshot.get_pair(&ks, &header, &row).unwrap();
    assert_eq!(h.as_deref(), Some(&b"h1"[..]));
    assert_eq!(r.as_deref(), Some(&b"r1"[..]));
    let (h, r) = db.snapshot().get_pair(&ks, &header, &row).unwrap();
    assert_eq!(h.as_deref(), Some(&b"h1"[..]));
    assert_eq!(r.as_deref(), Some(&49u32.to_be_bytes()[..]));
}

mod narrow_reads {
    //! A table without clustering columns reads its partition's header and row in one
    //! pass: a partition deletion shadows the row wherever each of them lies.

    use crate::*;
    use bytes::Bytes;
    use std::time::Duration;

    const TABLE: TableId = [5; 16];

    fn layout() -> TableLayout {
        TableLayout {
            id: TABLE,
            clustering: vec![],
            regular: None,
            gc_grace_seconds: 864_000,
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

    /// A write to partition `token`: its row at `row` (a row marker), its deletion at
    /// `deletion`.
    fn write(s: &Storage, token: i64, row: Option<i64>, deletion: Option<i64>) {
        let rows = row
            .map(|timestamp| RowMutation {
                clustering: vec![],
                liveness: Some(Liveness {
                    timestamp,
                    expiry: None,
                }),
                ..Default::default()
            })
            .into_iter()
            .collect();
        let m = Mutation {
            table: TABLE,
            token,
            partition_key: Bytes::copy_from_slice(&token.to_be_bytes()),
            partition_deletion: deletion,
            range_deletions: vec![],
            static_row: None,
            rows,
        };
        s.apply(&[(&layout(), m)]).unwrap();
    }

    /// Whether partition `token` reads back its row.
    fn live(s: &Storage, token: i64) -> bool {
        let read = s
            .read_partition(
                &layout(),
                token,
                &token.to_be_bytes(),
                &ClusteringSlice::all(),
                None,
                10,
                0,
            )
            .unwrap();
        assert!(read.rows.len() <= 1 && read.static_row.is_none());
        read.rows.len() == 1
    }

    fn flush(s: &Storage) {
        s.flush_memtables(Duration::from_secs(30));
    }

    #[test]
    fn a_narrow_point_read_applies_the_partition_deletion_wherever_it_lies() {
        let dir = tempfile::tempdir().unwrap();
        let s = open(dir.path());
        // 1: row on disk, deletion in the memtable. 2: deletion on disk, an older row in
        // the memtable. 3: a row alone. 4: a deletion alone.
        write(&s, 1, Some(10), None);
        write(&s, 2, None, Some(20));
        write(&s, 3, Some(10), None);
        write(&s, 4, None, Some(10));
        flush(&s);
        write(&s, 1, None, Some(20));
        write(&s, 2, Some(15), None);
        let expect = [(1, false), (2, false), (3, true), (4, false)];
        for (token, is_live) in expect {
            assert_eq!(live(&s, token), is_live, "partition {token} before a flush");
        }
        flush(&s);
        for (token, is_live) in expect {
            assert_eq!(live(&s, token), is_live, "partition {token} after a flush");
        }
        // Newer rows than the deletions, in the memtable, then on disk after a restart.
        write(&s, 1, Some(30), None);
        write(&s, 2, Some(25), None);
        let expect = [(1, true), (2, true), (3, true), (4, false), (5, false)];
        for (token, is_live) in expect {
            assert_eq!(live(&s, token), is_live, "partition {token} rewritten");
        }
        flush(&s);
        drop(s);
        let s = open(dir.path());
        for (token, is_live) in expect {
            assert_eq!(
                live(&s, token),
                is_live,
                "partition {token} after a restart"
            );
        }
    }
}
