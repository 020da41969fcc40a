//! Per-partition rate limiting end to end with the Rust `scylla` driver against
//! the real binary: the typed `RateLimitReached` error, no retry, no data from rejected
//! writes, neighbours unaffected, per-table metrics, option validation, DESCRIBE, restart,
//! ALTER removing the limit, and reads (including `IN`) limited per partition.

mod common;

use std::collections::BTreeSet;
use std::time::Instant;

use common::{connect, Node};
use scylla::client::session::Session;
use scylla::errors::{DbError, ExecutionError, OperationType, RequestAttemptError};
use scylla::statement::prepared::PreparedStatement;

const LIMIT: usize = 10;

/// The server-side error of a failed request, if it was one.
fn db_error(e: &ExecutionError) -> Option<&DbError> {
    match e {
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(db, _)) => Some(db),
        _ => None,
    }
}

/// Whether a write was accepted (true) or rejected by the rate limit with ScyllaDB's typed
/// error from the coordinator (false); any other error panics with `what` and the error.
fn write_accepted<T>(result: Result<T, ExecutionError>, what: std::fmt::Arguments) -> bool {
    match result {
        Ok(_) => true,
        Err(e) => match db_error(&e) {
            Some(DbError::RateLimitReached {
                op_type: OperationType::Write,
                rejected_by_coordinator: true,
            }) => false,
            _ => panic!("{what} {e:?}"),
        },
    }
}

async fn ddl(session: &Session, q: &str) -> Result<(), ExecutionError> {
    session.query_unpaged(q, &[]).await.map(|_| ())
}

/// Connects and creates `rl.t` with a write limit of [`LIMIT`] per second.
async fn create_rl_table(node: &Node) -> Session {
    let session = connect(node).await;
    ddl(
        &session,
        "CREATE KEYSPACE rl WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
    )
    .await
    .unwrap();
    ddl(
        &session,
        "CREATE TABLE rl.t (pk int, ck int, v int, PRIMARY KEY (pk, ck)) \
         WITH per_partition_rate_limit = {'max_writes_per_second': 10}",
    )
    .await
    .unwrap();
    session
}

async fn describe(session: &Session) -> String {
    let r = session
        .query_unpaged("DESCRIBE TABLE rl.t", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (_, _, _, stmt): (String, String, String, String) = r.single_row().unwrap();
    stmt
}

async fn stored_cks(session: &Session, pk: i32) -> BTreeSet<i32> {
    session
        .query_unpaged("SELECT ck FROM rl.t WHERE pk = ?", (pk,))
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows::<(i32,)>()
        .unwrap()
        .map(|r| r.unwrap().0)
        .collect()
}

/// Writes `n` rows to partition `pk` as fast as possible; returns (accepted, rejected) cks.
async fn hammer(
    session: &Session,
    ins: &PreparedStatement,
    pk: i32,
    cks: std::ops::Range<i32>,
) -> (BTreeSet<i32>, BTreeSet<i32>) {
    let (mut ok, mut rejected) = (BTreeSet::new(), BTreeSet::new());
    for ck in cks {
        let result = session.execute_unpaged(ins, (pk, ck, ck)).await;
        let accepted = write_accepted(result, format_args!("write {pk}/{ck}: unexpected error"));
        (if accepted { &mut ok } else { &mut rejected }).insert(ck);
    }
    (ok, rejected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_partition_is_limited_and_rejected_writes_leave_no_data() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start(&data, 2, &["--durability", "periodic"]);
    let session = create_rl_table(&node).await;
    session.refresh_metadata().await.unwrap();
    let ins = session
        .prepare("INSERT INTO rl.t (pk, ck, v) VALUES (?, ?, ?)")
        .await
        .unwrap();

    // A tight loop on one partition: mostly rejected, with the typed error, never retried.
    let executes_before = node.metric("sluice_requests_total", &[("opcode", "execute")]);
    let started = Instant::now();
    let (ok, rejected) = hammer(&session, &ins, 1, 0..400).await;
    let elapsed = started.elapsed().as_secs_f64();
    let executes = node.metric("sluice_requests_total", &[("opcode", "execute")]) - executes_before;
    assert_eq!(executes, 400.0, "a rate-limited write must not be retried");
    assert!(
        !rejected.is_empty(),
        "400 writes in {elapsed:.2}s: none rejected"
    );
    assert!(
        ok.len() >= LIMIT,
        "the first {LIMIT} writes are within the limit: {ok:?}"
    );
    // Cold start admits at most L per second plus a burst of L (see sluice-overload).
    let bound = LIMIT as f64 * (elapsed.ceil() + 2.0);
    assert!(
        (ok.len() as f64) <= bound,
        "{} accepted in {elapsed:.2}s, bound {bound}",
        ok.len()
    );
    // Exactly the accepted rows exist: no rejected write left data behind.
    assert_eq!(stored_cks(&session, 1).await, ok);

    // Other partitions are unaffected by the hot one.
    for pk in 2..60 {
        session.execute_unpaged(&ins, (pk, 0, 0)).await.unwrap();
    }

    // Per-table counters on the metrics endpoint.
    let labels = |op| [("keyspace", "rl"), ("table", "t"), ("op", op)];
    assert_eq!(
        node.metric("sluice_rate_limit_rejected_total", &labels("write")),
        rejected.len() as f64
    );
    assert_eq!(
        node.metric("sluice_rate_limit_accepted_total", &labels("write")),
        (ok.len() + 58) as f64
    );
    assert_eq!(
        node.metric("sluice_rate_limit_accepted_total", &labels("read")),
        0.0,
        "reads have no limit here and are not accounted"
    );

    // Invalid values are configuration errors, and change nothing.
    for bad in [
        "{'max_writes_per_second': -1}",
        "{'max_writes_per_second': 1.5}",
        "{'max_writes_per_second': 'ten'}",
        "{'max_writes_per_second': 4294967296}",
        "{'max_write_per_second': 5}",
    ] {
        let e = ddl(
            &session,
            &format!("ALTER TABLE rl.t WITH per_partition_rate_limit = {bad}"),
        )
        .await
        .expect_err(bad);
        assert!(
            matches!(db_error(&e), Some(DbError::ConfigError)),
            "{bad}: {e:?}"
        );
    }
    // system_schema.tables shows it as ScyllaDB's schema extension.
    let (ext,): (std::collections::HashMap<String, Vec<u8>>,) = session
        .query_unpaged(
            "SELECT extensions FROM system_schema.tables \
             WHERE keyspace_name = 'rl' AND table_name = 't'",
            &[],
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    let blob = &ext["per_partition_rate_limit"];
    assert!(
        blob.windows(21).any(|w| w == b"max_writes_per_second"),
        "{blob:?}"
    );
    let described = describe(&session).await;
    assert!(
        described.contains("AND per_partition_rate_limit = {'max_writes_per_second': 10}"),
        "{described}"
    );

    // Restart: the option persists and is enforced again.
    drop(session);
    assert!(node.terminate().success());
    let node = Node::start(&data, 2, &["--durability", "periodic"]);
    let session = connect(&node).await;
    session.refresh_metadata().await.unwrap();
    assert!(describe(&session)
        .await
        .contains("per_partition_rate_limit = {'max_writes_per_second': 10}"));
    let ins = session
        .prepare("INSERT INTO rl.t (pk, ck, v) VALUES (?, ?, ?)")
        .await
        .unwrap();
    let (ok2, rejected2) = hammer(&session, &ins, 100, 0..200).await;
    assert!(!rejected2.is_empty() && ok2.len() >= LIMIT);
    assert_eq!(stored_cks(&session, 100).await, ok2);

    // A read limit, changed without restart; writes become unlimited. Each partition of
    // an IN read is counted on its own token.
    ddl(
        &session,
        "ALTER TABLE rl.t WITH per_partition_rate_limit = {'max_reads_per_second': 5}",
    )
    .await
    .unwrap();
    let (ok3, rejected3) = hammer(&session, &ins, 100, 1000..1300).await;
    assert!(rejected3.is_empty(), "writes still limited: {rejected3:?}");
    assert_eq!(ok3.len(), 300);
    let sel_in = session
        .prepare("SELECT ck FROM rl.t WHERE pk IN (?, ?)")
        .await
        .unwrap();
    let mut read_rejects = 0;
    let started = Instant::now();
    for i in 0..100 {
        match session.execute_unpaged(&sel_in, (200 + i, 100)).await {
            Ok(_) => {}
            Err(e) => match db_error(&e) {
                Some(DbError::RateLimitReached {
                    op_type: OperationType::Read,
                    ..
                }) => read_rejects += 1,
                _ => panic!("unexpected {e:?}"),
            },
        }
    }
    // Partition 100 is in every read: it alone trips the limit.
    // Each partition of an IN read is accounted on its owner, whichever shard received the
    // read: one counter for partition 100, admitting about L/s plus a burst of L.
    let bound = 5.0 * (started.elapsed().as_secs_f64().ceil() + 2.0);
    assert!(
        read_rejects > 0 && (100 - read_rejects) as f64 <= bound,
        "{read_rejects} of 100 IN reads rejected, at most {bound} may pass"
    );
    for pk in 300..320 {
        session
            .query_unpaged("SELECT ck FROM rl.t WHERE pk = ?", (pk,))
            .await
            .expect("a fresh partition is under its read limit");
    }

    // `{}` removes the limit: every write and read then succeeds.
    ddl(
        &session,
        "ALTER TABLE rl.t WITH per_partition_rate_limit = {}",
    )
    .await
    .unwrap();
    assert!(!describe(&session)
        .await
        .contains("per_partition_rate_limit"));
    let (ok4, rejected4) = hammer(&session, &ins, 1, 10_000..10_300).await;
    assert!(rejected4.is_empty() && ok4.len() == 300);
    for _ in 0..50 {
        session.execute_unpaged(&sel_in, (1, 100)).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_counts_each_partition_it_touches() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), 2, &["--durability", "periodic"]);
    let session = create_rl_table(&node).await;
    let ins = session
        .prepare("INSERT INTO rl.t (pk, ck, v) VALUES (?, ?, ?)")
        .await
        .unwrap();
    // Each batch writes a fresh partition and the hot partition 7: the hot one trips.
    let mut rejected = Vec::new();
    let started = Instant::now();
    for i in 0..200 {
        let mut batch =
            scylla::statement::batch::Batch::new(scylla::statement::batch::BatchType::Unlogged);
        batch.append_statement(ins.clone());
        batch.append_statement(ins.clone());
        match session.batch(&batch, ((1000 + i, 0, 0), (7, i, i))).await {
            Ok(_) => {}
            Err(e) => match db_error(&e) {
                Some(DbError::RateLimitReached {
                    op_type: OperationType::Write,
                    ..
                }) => rejected.push(i),
                _ => panic!("unexpected {e:?}"),
            },
        }
    }
    // Batches arrive on the owner of their first statement's partition (all shards here),
    // but the hot partition is accounted on its owner only: one counter.
    let bound = LIMIT as f64 * (started.elapsed().as_secs_f64().ceil() + 2.0);
    assert!(
        !rejected.is_empty() && (200 - rejected.len()) as f64 <= bound,
        "{} of 200 batches rejected, at most {bound} may pass",
        rejected.len()
    );
    // A rejected batch applied nothing, on either partition.
    for i in &rejected {
        assert!(stored_cks(&session, 1000 + i).await.is_empty());
    }
    let hot = stored_cks(&session, 7).await;
    assert_eq!(hot.len(), 200 - rejected.len());
    assert!(rejected.iter().all(|i| !hot.contains(i)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_statements_are_counted_once_on_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), 2, &["--durability", "periodic"]);
    let session = create_rl_table(&node).await;
    // Unprepared statements without values carry no routing information: the driver
    // spreads them over its per-shard connections, so about half are forwarded.
    let forwards_before = node.metric("sluice_cross_shard_forwards_total", &[]);
    let (mut ok, mut rejected) = (BTreeSet::new(), BTreeSet::new());
    let started = Instant::now();
    for ck in 0..300 {
        let q = format!("INSERT INTO rl.t (pk, ck, v) VALUES (5, {ck}, 0)");
        let accepted = write_accepted(
            session.query_unpaged(q, &[]).await,
            format_args!("unexpected"),
        );
        (if accepted { &mut ok } else { &mut rejected }).insert(ck);
    }
    let forwards = node.metric("sluice_cross_shard_forwards_total", &[]) - forwards_before;
    assert!(forwards > 0.0, "no statement was forwarded");
    assert!(!rejected.is_empty() && ok.len() >= LIMIT);
    // A single counter: counting on both shards would admit about twice as much.
    let bound = LIMIT as f64 * (started.elapsed().as_secs_f64().ceil() + 2.0);
    assert!(
        (ok.len() as f64) <= bound,
        "{} accepted, bound {bound}",
        ok.len()
    );
    // One counter for the partition (on its owner), each operation counted exactly once.
    let labels = |op| [("keyspace", "rl"), ("table", "t"), ("op", op)];
    let counted = node.metric("sluice_rate_limit_accepted_total", &labels("write"))
        + node.metric("sluice_rate_limit_rejected_total", &labels("write"));
    assert_eq!(counted, 300.0);
    assert_eq!(stored_cks(&session, 5).await, ok);
}
