use super::*;

fn part(n: u8) -> PartitionRef {
    PartitionRef {
        table: [7; 16],
        token: i64::from(n) * 1000,
        key_hash: u64::from(n),
    }
}

fn txn(read_at: u64, reads: &[u8], writes: &[u8], provisional: i64) -> TxnProposal {
    TxnProposal {
        read_at,
        provisional,
        reads: reads.iter().map(|&n| part(n)).collect(),
        writes: writes.iter().map(|&n| part(n)).collect(),
        mutations: writes.to_vec(),
        keeps_timestamps: false,
    }
}

fn batch(transactions: Vec<TxnProposal>) -> Vec<u8> {
    TxnBatch { transactions }.encode().expect("within bounds")
}

fn outcomes(response: TxnResponse) -> Vec<TxnOutcome> {
    match response {
        TxnResponse::Outcomes(o) => o,
        other => panic!("refused: {other:?}"),
    }
}

/// Records what the follower was handed.
#[derive(Default)]
struct Recorder {
    commits: Mutex<Vec<(u64, i64, Vec<u8>)>>,
    durable_calls: Mutex<usize>,
    skipped: Mutex<Vec<u64>>,
}

impl TxnFollower for Recorder {
    fn commit(&self, commit: &TxnCommit<'_>) {
        self.commits.lock().unwrap().push((
            commit.index,
            commit.timestamp,
            commit.mutations.to_vec(),
        ));
    }
    fn make_durable(&self) {
        *self.durable_calls.lock().unwrap() += 1;
    }
    fn skipped(&self, index: u64) {
        self.skipped.lock().unwrap().push(index);
    }
}

#[test]
fn a_read_overtaken_by_a_committed_write_is_a_conflict() {
    let mut state = TxnState::default();
    // Transfer 1 -> 2 read at 5, committed at 10.
    let first = outcomes(state.apply(10, &batch(vec![txn(5, &[1, 2], &[1, 2], 100)])));
    assert_eq!(first, vec![TxnOutcome::Committed { timestamp: 100 }]);
    // Another read partition 2 at 7 (before 10): conflict, nothing recorded.
    let second = outcomes(state.apply(11, &batch(vec![txn(7, &[2, 3], &[2, 3], 101)])));
    assert_eq!(second, vec![TxnOutcome::Conflict]);
    assert_eq!(state.table().partitions(), 2);
    // The same read at 10 (after the write) commits; one that read only 3 at 7 too.
    let third = outcomes(state.apply(
        12,
        &batch(vec![txn(10, &[2, 3], &[2, 3], 50), txn(7, &[3], &[4], 50)]),
    ));
    // The second transaction in the batch read 3 at 7, and the first wrote 3 at 12: conflict.
    assert_eq!(
        third,
        vec![
            TxnOutcome::Committed { timestamp: 101 },
            TxnOutcome::Conflict
        ]
    );
    // A read at or after the batch's own index cannot be right.
    let fourth = outcomes(state.apply(13, &batch(vec![txn(13, &[9], &[9], 1)])));
    assert_eq!(fourth, vec![TxnOutcome::Conflict]);
    assert_eq!(
        state.counts(),
        TxnCounts {
            commits: 2,
            conflicts: 3
        }
    );
}

#[test]
fn timestamps_come_from_the_log_and_only_grow() {
    let mut state = TxnState::default();
    let mut last = i64::MIN;
    // Provisional timestamps from nodes with skewed clocks, some going back.
    for (i, provisional) in [500, 100, 100, 900, 200, 901].into_iter().enumerate() {
        let index = 10 + i as u64;
        let o = outcomes(state.apply(index, &batch(vec![txn(index - 1, &[], &[1], provisional)])));
        let [TxnOutcome::Committed { timestamp }] = o[..] else {
            panic!("{o:?}")
        };
        assert!(timestamp > last && timestamp >= provisional);
        last = timestamp;
    }
    assert_eq!(last, 902);
}

#[test]
fn a_logged_batch_keeps_its_timestamps_and_leaves_the_clock_alone() {
    let mut state = TxnState::default();
    let recorder = Arc::new(Recorder::default());
    state.attach(recorder.clone());
    let o = outcomes(state.apply(10, &batch(vec![txn(9, &[], &[1], 500)])));
    assert_eq!(o, vec![TxnOutcome::Committed { timestamp: 500 }]);
    // A batch with a timestamp far ahead, and one far behind: both kept as they are.
    let ahead = TxnProposal {
        keeps_timestamps: true,
        ..txn(10, &[], &[2], 1 << 60)
    };
    let behind = TxnProposal {
        keeps_timestamps: true,
        ..txn(10, &[], &[3], 7)
    };
    let o = outcomes(state.apply(11, &batch(vec![ahead, behind])));
    assert_eq!(
        o,
        vec![
            TxnOutcome::Committed { timestamp: 1 << 60 },
            TxnOutcome::Committed { timestamp: 7 }
        ]
    );
    // The follower is handed the kept timestamps, so nothing moves.
    let handed: Vec<i64> = recorder
        .commits
        .lock()
        .unwrap()
        .iter()
        .map(|c| c.1)
        .collect();
    assert_eq!(handed, vec![500, 1 << 60, 7]);
    // The next transaction's timestamp follows the log's clock, not the batch's.
    let o = outcomes(state.apply(12, &batch(vec![txn(11, &[], &[4], 0)])));
    assert_eq!(o, vec![TxnOutcome::Committed { timestamp: 501 }]);
    // Its writes count for validation: a read of partition 2 from before it conflicts.
    let o = outcomes(state.apply(13, &batch(vec![txn(10, &[2], &[5], 0)])));
    assert_eq!(o, vec![TxnOutcome::Conflict]);
}

#[test]
fn commands_without_a_logged_batch_keep_the_first_encoding() {
    let plain = TxnBatch {
        transactions: vec![txn(1, &[1], &[2], 3), txn(2, &[], &[4], 5)],
    };
    let bytes = plain.encode().unwrap();
    assert_eq!(bytes[1], TXN_VERSION);
    assert_eq!(bytes.len(), plain.encoded_len());
    // The per-transaction bound the committer adds up covers either encoding.
    assert!(
        bytes.len()
            <= 4 + plain
                .transactions
                .iter()
                .map(TxnProposal::encoded_len)
                .sum::<usize>()
    );
    let mut flagged = plain.clone();
    flagged.transactions[1].keeps_timestamps = true;
    let bytes = flagged.encode().unwrap();
    assert_eq!(bytes[1], TXN_FLAGS_VERSION);
    assert_eq!(bytes.len(), flagged.encoded_len());
    assert_eq!(
        bytes.len(),
        4 + flagged
            .transactions
            .iter()
            .map(TxnProposal::encoded_len)
            .sum::<usize>()
    );
    assert_eq!(TxnBatch::decode(&bytes).unwrap(), flagged);
    assert_eq!(TxnBatch::decode(&plain.encode().unwrap()).unwrap(), plain);
    // An unknown flag, and every cut, are refused.
    let mut unknown = bytes.clone();
    unknown[4 + 16] = 0x80;
    assert_eq!(TxnBatch::decode(&unknown), Err(TxnLogError::Malformed));
    for cut in 0..bytes.len() {
        assert!(TxnBatch::decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
}

#[test]
fn eviction_is_deterministic_raises_the_low_water_mark_and_keeps_the_budget() {
    let budget = 10 * WRITE_TABLE_ENTRY_BYTES;
    let mut a = TxnState::new(budget);
    let mut b = TxnState::new(budget);
    for i in 0..40u64 {
        let index = 100 + i;
        let command = batch(vec![txn(index - 1, &[], &[(i % 25) as u8], 0)]);
        assert_eq!(a.apply(index, &command), b.apply(index, &command));
        assert!(
            a.table().bytes() <= budget,
            "{} > {budget}",
            a.table().bytes()
        );
    }
    assert_eq!(a.table().bytes(), budget);
    assert_eq!(a.snapshot(), b.snapshot());
    // The ten newest writes are kept (indexes 130..140); everything up to 129 is forgotten.
    assert_eq!(a.table().low_water(), 129);
    // A read before the mark conflicts even on a partition nobody wrote.
    let o = outcomes(a.apply(200, &batch(vec![txn(128, &[200], &[200], 0)])));
    assert_eq!(o, vec![TxnOutcome::Conflict]);
    // A read at the mark on a partition written before it commits.
    let o = outcomes(a.apply(201, &batch(vec![txn(129, &[1], &[1], 0)])));
    assert!(matches!(o[..], [TxnOutcome::Committed { .. }]));
    // A read at the mark on a partition written after it conflicts (14 was written at 139).
    let o = outcomes(a.apply(202, &batch(vec![txn(129, &[14], &[14], 0)])));
    assert_eq!(o, vec![TxnOutcome::Conflict]);
}

#[test]
fn the_follower_gets_commits_and_replayed_ones_wait_for_it() {
    let mut state = TxnState::default();
    // Applied before any follower (a replay at start-up).
    state.apply(3, &batch(vec![txn(2, &[], &[1], 10)]));
    let recorder = Arc::new(Recorder::default());
    state.attach(recorder.clone());
    state.apply(
        4,
        &batch(vec![txn(3, &[1], &[2], 10), txn(1, &[1], &[3], 10)]),
    );
    assert_eq!(
        *recorder.commits.lock().unwrap(),
        vec![(3, 10, vec![1]), (4, 11, vec![2])]
    );
    // A snapshot makes the follower's commits durable first.
    let snapshot = state.snapshot();
    assert_eq!(*recorder.durable_calls.lock().unwrap(), 1);
    // Restoring it on a state that already applied is a snapshot from elsewhere.
    let mut other = TxnState::default();
    other.apply(1, &batch(vec![txn(0, &[], &[5], 1)]));
    let other_recorder = Arc::new(Recorder::default());
    other.attach(other_recorder.clone());
    other.install(TxnState::decode_snapshot(&snapshot).unwrap());
    assert_eq!(*other_recorder.skipped.lock().unwrap(), vec![4]);
    assert_eq!(other.snapshot(), state.snapshot());
}

#[test]
fn a_snapshot_carries_commits_no_follower_took_and_goes_on_identically() {
    let mut state = TxnState::default();
    state.note_applied();
    state.apply(2, &batch(vec![txn(1, &[], &[1, 2], 10)]));
    let snapshot = state.snapshot();
    // A fresh state restoring its own stored snapshot: no gap, the pending commit is handed
    // over at attach.
    let mut restored = TxnState::default();
    restored.install(TxnState::decode_snapshot(&snapshot).unwrap());
    assert_eq!(restored.snapshot(), snapshot);
    let recorder = Arc::new(Recorder::default());
    restored.attach(recorder.clone());
    assert!(recorder.skipped.lock().unwrap().is_empty());
    assert_eq!(*recorder.commits.lock().unwrap(), vec![(2, 10, vec![1, 2])]);
    let next = batch(vec![txn(1, &[2], &[2], 5), txn(3, &[2], &[2], 5)]);
    assert_eq!(state.apply(4, &next), restored.apply(4, &next));
}

#[test]
fn malformed_commands_and_snapshots_are_refused() {
    let mut state = TxnState::default();
    let good = batch(vec![txn(1, &[1], &[2], 3)]);
    let mut cut = good.clone();
    cut.pop();
    let mut long = good.clone();
    long.push(0);
    let mut many = good.clone();
    many[2..4].copy_from_slice(&u16::MAX.to_be_bytes());
    for bad in [&b""[..], b"\x03", b"\x03\x01\x00\x00", &cut, &long, &many] {
        assert_eq!(
            state.apply(5, bad),
            TxnResponse::Rejected(TxnLogError::Malformed),
            "{bad:?}"
        );
    }
    assert_eq!(state.counts(), TxnCounts::default());
    let snapshot = state.snapshot();
    for n in 0..snapshot.len() {
        assert!(TxnState::decode_snapshot(&snapshot[..n]).is_err());
    }
    assert!(TxnState::decode_snapshot(&snapshot).is_ok());
}

#[test]
fn batches_and_answers_round_trip() {
    let b = TxnBatch {
        transactions: vec![txn(1, &[1, 2], &[3], -5), txn(9, &[], &[], 7)],
    };
    let bytes = b.encode().unwrap();
    assert_eq!(bytes.len(), b.encoded_len());
    assert_eq!(TxnBatch::decode(&bytes), Ok(b));
    let answer = TxnResponse::Outcomes(vec![
        TxnOutcome::Committed { timestamp: -3 },
        TxnOutcome::Conflict,
    ]);
    assert_eq!(TxnResponse::decode(&answer.encode()), Ok(answer));
    let refused = TxnResponse::Rejected(TxnLogError::Malformed);
    assert_eq!(TxnResponse::decode(&refused.encode()), Ok(refused));
}

#[test]
fn arbitrary_bytes_never_panic() {
    // A fixed xorshift sequence: deterministic, many shapes of garbage.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut state = TxnState::default();
    for round in 0..2000 {
        let len = (round % 300) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut command = vec![TXN_TAG, TXN_VERSION];
        command.extend_from_slice(&bytes);
        let _ = state.apply(1 + round, &command);
        let _ = TxnState::decode_snapshot(&bytes);
        let _ = TxnResponse::decode(&bytes);
    }
}
