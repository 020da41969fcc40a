//! Multi-partition transactions (`BEGIN TRANSACTION ... COMMIT TRANSACTION`) end to end.

use super::*;

/// Two account ids whose partitions live in different stores of a two-store storage.
fn ids_in_two_stores() -> (i32, i32) {
    let store = |id: i32| {
        let token = sluice_types::token::murmur3_token(&id.to_be_bytes());
        sluice_types::token::shard_of(token, 2, sluice_types::token::SHARDING_IGNORE_MSB)
    };
    let a = 1;
    let b = (2..1000)
        .find(|b| store(*b) != store(a))
        .expect("an id in the other store");
    (a, b)
}

const TRANSFER: &str = "BEGIN TRANSACTION
      LET src = (SELECT balance FROM ks.acct WHERE id = ?);
      LET dst = (SELECT balance FROM ks.acct WHERE id = ?);
      SELECT src.balance, dst.balance;
      IF src.balance >= ? AND dst IS NOT NULL THEN
        UPDATE ks.acct SET balance = balance - ? WHERE id = ?;
        UPDATE ks.acct SET balance = balance + ? WHERE id = ?;
        INSERT INTO ks.log (id, src, dst, amount) VALUES (?, ?, ?, ?);
      END IF
    COMMIT TRANSACTION";

fn transfer_values(log: i32, from: i32, to: i32, amount: i64) -> Vec<Value> {
    vec![
        int(from),
        int(to),
        bigint(amount),
        bigint(amount),
        int(from),
        bigint(amount),
        int(to),
        int(log),
        int(from),
        int(to),
        bigint(amount),
    ]
}

async fn setup(h: &mut H, a: i32, b: i32) {
    h.ok("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
    h.ok("CREATE TABLE ks.acct (id int PRIMARY KEY, balance bigint)")
        .await;
    h.ok("CREATE TABLE ks.log (id int PRIMARY KEY, src int, dst int, amount bigint)")
        .await;
    h.exec(
        "INSERT INTO ks.acct (id, balance) VALUES (?, 100)",
        vec![int(a)],
    )
    .await
    .unwrap();
    h.exec(
        "INSERT INTO ks.acct (id, balance) VALUES (?, 100)",
        vec![int(b)],
    )
    .await
    .unwrap();
}

async fn balance(h: &mut H, id: i32) -> Option<i64> {
    let rows = h
        .select("SELECT balance FROM ks.acct WHERE id = ?", vec![int(id)])
        .await;
    rows.first().map(|r| cbig(&r[0]))
}

#[tokio::test]
async fn a_transfer_across_stores_commits_both_writes_and_returns_the_values_before() {
    let (a, b) = ids_in_two_stores();
    let mut h = H::new();
    setup(&mut h, a, b).await;
    let p = h.engine.prepare(None, TRANSFER).unwrap();
    assert_eq!(p.bind_specs.len(), 11);
    let r = h.rows_of(TRANSFER, transfer_values(1, a, b, 30)).await;
    assert_eq!(names(&r), vec!["src.balance", "dst.balance"]);
    // The values as they were before the transaction wrote.
    let row = &cells(&r)[0];
    assert_eq!((cbig(&row[0]), cbig(&row[1])), (100, 100));
    assert_eq!(balance(&mut h, a).await, Some(70));
    assert_eq!(balance(&mut h, b).await, Some(130));
    let log = h
        .select("SELECT src, dst, amount FROM ks.log WHERE id = 1", vec![])
        .await;
    assert_eq!(
        (cint(&log[0][0]), cint(&log[0][1]), cbig(&log[0][2])),
        (a, b, 30)
    );
    let m = h.engine.transactions().metrics();
    assert_eq!(m.committed.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(m.critical_section.count(), 1);
}

#[tokio::test]
async fn a_false_if_writes_nothing_and_a_failed_write_leaves_both_partitions_unchanged() {
    let (a, b) = ids_in_two_stores();
    let mut h = H::new();
    setup(&mut h, a, b).await;
    // Not enough money: the IF is false, nothing is written, the answer is still the rows.
    let r = h.rows_of(TRANSFER, transfer_values(1, a, b, 500)).await;
    assert_eq!(cells(&r).len(), 1);
    assert_eq!(balance(&mut h, a).await, Some(100));
    assert_eq!(balance(&mut h, b).await, Some(100));
    assert!(h
        .select("SELECT * FROM ks.log WHERE id = 1", vec![])
        .await
        .is_empty());
    let m = h.engine.transactions().metrics();
    assert_eq!(
        m.committed_without_writes
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // The credit overflows under the locks: the debit in the other store is not written either.
    h.exec(
        "INSERT INTO ks.acct (id, balance) VALUES (?, ?)",
        vec![int(b), bigint(i64::MAX)],
    )
    .await
    .unwrap();
    let e = h.err(TRANSFER, transfer_values(2, a, b, 10)).await;
    assert_eq!(e.code(), ErrorCode::Invalid, "{e:?}");
    assert!(e.message.contains("overflow"), "{}", e.message);
    assert_eq!(balance(&mut h, a).await, Some(100));
    assert_eq!(balance(&mut h, b).await, Some(i64::MAX));
    assert!(h
        .select("SELECT * FROM ks.log WHERE id = 2", vec![])
        .await
        .is_empty());
}

#[tokio::test]
async fn a_let_of_a_missing_row_is_null_and_else_branches_run() {
    let mut h = H::new();
    setup(&mut h, 1, 2).await;
    let q = "BEGIN TRANSACTION
          LET x = (SELECT balance FROM ks.acct WHERE id = 99);
          SELECT x.balance;
          IF x IS NOT NULL THEN
            UPDATE ks.acct SET balance = 0 WHERE id = 1;
          ELSE IF x.balance IS NULL THEN
            INSERT INTO ks.acct (id, balance) VALUES (99, 7);
          ELSE
            UPDATE ks.acct SET balance = 1 WHERE id = 2;
          END IF
        COMMIT TRANSACTION";
    let r = h.rows_of(q, vec![]).await;
    assert_eq!(cells(&r), vec![vec![None]]);
    assert_eq!(balance(&mut h, 99).await, Some(7));
    assert_eq!(balance(&mut h, 1).await, Some(100));
    assert_eq!(balance(&mut h, 2).await, Some(100));
    // Now the row exists: the first branch runs; a comparison with a missing row is false.
    let q = "BEGIN TRANSACTION
          LET x = (SELECT balance FROM ks.acct WHERE id = 99);
          LET gone = (SELECT balance FROM ks.acct WHERE id = 1000);
          IF x IS NOT NULL AND x.balance = 7 THEN
            UPDATE ks.acct SET balance = x.balance WHERE id = 1;
          END IF
          IF gone.balance < 1 THEN UPDATE ks.acct SET balance = 0 WHERE id = 2; END IF
        COMMIT TRANSACTION";
    // Two IF blocks are not the grammar.
    assert_eq!(h.err(q, vec![]).await.code(), ErrorCode::SyntaxError);
    let q = "BEGIN TRANSACTION
          LET x = (SELECT balance FROM ks.acct WHERE id = 99);
          LET gone = (SELECT balance FROM ks.acct WHERE id = 1000);
          IF x IS NOT NULL AND x.balance = 7 THEN
            UPDATE ks.acct SET balance = x.balance WHERE id = 1;
          END IF
        COMMIT TRANSACTION";
    assert!(matches!(h.exec(q, vec![]).await, Ok(ResultMessage::Void)));
    assert_eq!(balance(&mut h, 1).await, Some(7));
    let q = "BEGIN TRANSACTION
          LET gone = (SELECT balance FROM ks.acct WHERE id = 1000);
          IF gone.balance < 1 THEN UPDATE ks.acct SET balance = 0 WHERE id = 2; END IF
        COMMIT TRANSACTION";
    assert!(matches!(h.exec(q, vec![]).await, Ok(ResultMessage::Void)));
    assert_eq!(balance(&mut h, 2).await, Some(100));
}

#[tokio::test]
async fn a_returning_select_shows_the_rows_before_the_writes() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (1, 1, 'a')")
        .await;
    h.ok("INSERT INTO ks.t (pk, ck, v) VALUES (1, 2, 'b')")
        .await;
    let q = "BEGIN TRANSACTION
          LET first = (SELECT v FROM ks.t WHERE pk = 1 LIMIT 1);
          SELECT ck, v FROM ks.t WHERE pk = 1;
          IF first.v = 'a' THEN
            UPDATE ks.t SET v = 'changed' WHERE pk = 1 AND ck = 2;
            DELETE FROM ks.t WHERE pk = 1 AND ck = 1;
          END IF
        COMMIT TRANSACTION";
    let r = h.rows_of(q, vec![]).await;
    assert_eq!(names(&r), vec!["ck", "v"]);
    let rows = cells(&r);
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (cint(&rows[0][0]), ctext(&rows[0][1])),
        (1, "a".to_string())
    );
    assert_eq!(
        (cint(&rows[1][0]), ctext(&rows[1][1])),
        (2, "b".to_string())
    );
    let after = h
        .select("SELECT ck, v FROM ks.t WHERE pk = 1", vec![])
        .await;
    assert_eq!(after.len(), 1);
    assert_eq!(ctext(&after[0][1]), "changed");
}

#[tokio::test]
async fn unsupported_forms_are_invalid_and_name_what_is_unsupported() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.c (k int PRIMARY KEY, n counter)")
        .await;
    let cases = [
        ("BEGIN TRANSACTION LET a = (SELECT v FROM ks.t WHERE pk = 1); COMMIT TRANSACTION", "LIMIT 1"),
        ("BEGIN TRANSACTION LET a = (SELECT v FROM ks.t WHERE pk = 1 AND ck = 1); LET a = (SELECT v FROM ks.t WHERE pk = 2 AND ck = 1); COMMIT TRANSACTION", "already been used"),
        ("BEGIN TRANSACTION LET a = (SELECT v FROM ks.t WHERE ck = 1 LIMIT 1 ALLOW FILTERING); COMMIT TRANSACTION", "single partition"),
        ("BEGIN TRANSACTION UPDATE ks.t USING TIMESTAMP 5 SET v = 'x' WHERE pk = 1 AND ck = 1; COMMIT TRANSACTION", "USING TIMESTAMP"),
        ("BEGIN TRANSACTION UPDATE ks.t SET v = 'x' WHERE pk = 1 AND ck = 1 IF EXISTS; COMMIT TRANSACTION", "Conditional statements"),
        ("BEGIN TRANSACTION DELETE FROM ks.t WHERE pk = 1; COMMIT TRANSACTION", "full primary key"),
        ("BEGIN TRANSACTION UPDATE ks.c SET n = n + 1 WHERE k = 1; COMMIT TRANSACTION", "Counter tables"),
        ("BEGIN TRANSACTION UPDATE ks.t SET v = nope.v WHERE pk = 1 AND ck = 1; COMMIT TRANSACTION", "Undefined LET reference 'nope'"),
        ("BEGIN TRANSACTION LET a = (SELECT v FROM ks.t WHERE pk = 1 AND ck = 1); UPDATE ks.t SET s = a.v WHERE pk = 1; COMMIT TRANSACTION", "another type"),
        ("BEGIN TRANSACTION LET a = (SELECT count(*) FROM ks.t WHERE pk = 1 AND ck = 1); COMMIT TRANSACTION", "Aggregates"),
        ("BEGIN TRANSACTION COMMIT TRANSACTION", "no reads or writes"),
    ];
    for (q, named) in cases {
        let e = h.err(q, vec![]).await;
        assert_eq!(e.code(), ErrorCode::Invalid, "{q}: {e:?}");
        assert!(e.message.contains(named), "{q}: {}", e.message);
    }
}

#[tokio::test]
async fn an_expired_transaction_never_runs_and_times_out_as_cas() {
    let mut h = H::new();
    setup(&mut h, 1, 2).await;
    let p = h.engine.prepare(None, TRANSFER).unwrap();
    let ctx = RequestContext {
        deadline: Some(std::time::Instant::now() - Duration::from_millis(1)),
        now_micros: crate::now_micros(),
        ack_barrier: None,
    };
    let params = QueryParameters {
        values: transfer_values(1, 1, 2, 10),
        ..QueryParameters::default()
    };
    let e = h
        .engine
        .execute(&mut h.session, &p, &params, &ctx)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e.error,
            DbError::WriteTimeout {
                received: 0,
                write_type: sluice_protocol::WriteType::Cas,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(balance(&mut h, 1).await, Some(100));
    // Without writes, Read_timeout (Accord's shape for reads).
    let read_only = h
        .engine
        .prepare(
            None,
            "BEGIN TRANSACTION LET a = (SELECT balance FROM ks.acct WHERE id = 1); SELECT a.balance; COMMIT TRANSACTION",
        )
        .unwrap();
    let e = h
        .engine
        .execute(
            &mut h.session,
            &read_only,
            &QueryParameters::default(),
            &ctx,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e.error, DbError::ReadTimeout { received: 0, .. }),
        "{e:?}"
    );
    let m = h.engine.transactions().metrics();
    assert_eq!(
        m.aborted_deadline
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_transfers_keep_the_total_and_log_each_transfer_once() {
    let (a, b) = ids_in_two_stores();
    let mut h = H::new();
    setup(&mut h, a, b).await;
    let p = h.engine.prepare(None, TRANSFER).unwrap();
    let tasks: Vec<_> = (0..8)
        .map(|client| {
            let engine = h.engine.clone();
            let p = p.clone();
            tokio::spawn(async move {
                let mut session = Session::default();
                for n in 0..40 {
                    let (from, to) = if (client + n) % 2 == 0 {
                        (a, b)
                    } else {
                        (b, a)
                    };
                    let params = QueryParameters {
                        values: transfer_values(client * 1000 + n, from, to, 7),
                        ..QueryParameters::default()
                    };
                    engine
                        .execute(&mut session, &p, &params, &RequestContext::now())
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let (ba, bb) = (
        balance(&mut h, a).await.unwrap(),
        balance(&mut h, b).await.unwrap(),
    );
    assert_eq!(ba + bb, 200);
    // Every logged transfer explains the balances exactly.
    let log = h
        .select("SELECT src, dst, amount FROM ks.log", vec![])
        .await;
    let mut expect_a = 100;
    for row in &log {
        let (src, amount) = (cint(&row[0]), cbig(&row[2]));
        expect_a += if src == a { -amount } else { amount };
    }
    assert_eq!(ba, expect_a);
    assert!(!log.is_empty());
}
