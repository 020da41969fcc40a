//! The patched engine drops the versions a write supersedes from the active memtable
//! (vendor/lsm-tree and vendor/fjall, "Sluice patch"), and only when no read can need them.

use fjall::{Database, Keyspace, KeyspaceCreateOptions, Readable};

fn open() -> (tempfile::TempDir, Database, Keyspace) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::builder(dir.path()).open().unwrap();
    let ks = db.keyspace("data", KeyspaceCreateOptions::default).unwrap();
    (dir, db, ks)
}

fn put(db: &Database, ks: &Keyspace, key: &str, value: u32) {
    let mut batch = db.batch();
    batch.insert(ks, key, value.to_be_bytes());
    batch.commit().unwrap();
}

fn value(v: Option<fjall::UserValue>) -> Option<u32> {
    v.map(|v| u32::from_be_bytes(v[..].try_into().unwrap()))
}

/// The values an iterator yields, in order.
fn values(iter: fjall::Iter) -> Vec<u32> {
    iter.map(|kv| value(Some(kv.value().unwrap())).unwrap())
        .collect()
}

#[test]
fn overwrites_keep_the_memtable_at_two_versions_of_a_key() {
    let (_dir, db, ks) = open();
    put(&db, &ks, "other", 0);
    for i in 0..1000 {
        put(&db, &ks, "k", i);
    }
    // The newest version, the one before it, and the other key.
    assert_eq!(ks.approximate_len(), 3);
    assert_eq!(value(ks.get("k").unwrap()), Some(999));
    assert_eq!(ks.range::<&str, _>(..).count(), 2);
    // What the memtable dropped is no longer counted in the write buffer either.
    assert!(
        db.write_buffer_size() < 3 * 200,
        "{}",
        db.write_buffer_size()
    );
}

#[test]
fn an_open_snapshot_keeps_the_versions_it_sees() {
    let (_dir, db, ks) = open();
    put(&db, &ks, "k", 1);
    put(&db, &ks, "k", 2);
    let snapshot = db.snapshot();
    let iter = snapshot.range::<&str, _>(&ks, ..);
    for i in 3..100 {
        put(&db, &ks, "k", i);
    }
    assert_eq!(value(snapshot.get(&ks, "k").unwrap()), Some(2));
    assert_eq!(
        values(iter),
        vec![2],
        "the snapshot's iterator reads at its instant"
    );
    assert!(
        ks.approximate_len() >= 98,
        "versions kept while a snapshot is open"
    );
    // A keyspace iterator reads the newest version, which is always kept.
    let latest = ks.range::<&str, _>(..);
    put(&db, &ks, "k", 100);
    assert_eq!(values(latest), vec![100]);
    drop(snapshot);
    put(&db, &ks, "k", 101);
    assert_eq!(ks.approximate_len(), 2);
    assert_eq!(value(ks.get("k").unwrap()), Some(101));
}

#[test]
fn deletes_supersede_and_survive_a_flush_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = Database::builder(dir.path()).open().unwrap();
        let ks = db.keyspace("data", KeyspaceCreateOptions::default).unwrap();
        put(&db, &ks, "k", 1);
        ks.rotate_memtable_and_wait().unwrap();
        // An older version on disk: the memtable keeps the tombstone that shadows it.
        for i in 2..10 {
            put(&db, &ks, "k", i);
        }
        let mut batch = db.batch();
        batch.remove(&ks, "k");
        batch.commit().unwrap();
        put(&db, &ks, "j", 7);
        put(&db, &ks, "j", 8);
        assert_eq!(ks.get("k").unwrap(), None);
        ks.rotate_memtable_and_wait().unwrap();
        assert_eq!(ks.get("k").unwrap(), None);
        put(&db, &ks, "j", 9);
        db.persist(fjall::PersistMode::SyncAll).unwrap();
    }
    let db = Database::builder(dir.path()).open().unwrap();
    let ks = db.keyspace("data", KeyspaceCreateOptions::default).unwrap();
    assert_eq!(ks.get("k").unwrap(), None);
    assert_eq!(value(ks.get("j").unwrap()), Some(9));
}
