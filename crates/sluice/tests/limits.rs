//! Big values and big partitions against the real binary: a 10 MB blob round-trips, writes
//! over `--max-value-bytes`, `--max-mutation-bytes` and `--max-partition-bytes` are answered
//! Invalid naming the limit,
//! and a big partition is paged through with bounded memory (peak RSS, `VmHWM`).

mod common;

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use common::{connect, create_keyspace, Node};
use scylla::client::session::Session;
use scylla::response::PagingState;
use scylla::statement::batch::Batch;
use scylla::statement::prepared::PreparedStatement;

/// The process's peak resident set (`VmHWM`) in bytes.
fn peak_rss(node: &Node) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.child.id())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib << 10
}

/// Creates keyspace `ks` and its table `table` (pk int, ck int, v blob, PRIMARY KEY (pk, ck));
/// returns the prepared insert of all three columns.
async fn create_blob_table(session: &Session, ks: &str, table: &str) -> PreparedStatement {
    create_keyspace(session, ks).await;
    session
        .query_unpaged(
            format!("CREATE TABLE {ks}.{table} (pk int, ck int, v blob, PRIMARY KEY (pk, ck))"),
            &[],
        )
        .await
        .unwrap();
    session
        .prepare(format!(
            "INSERT INTO {ks}.{table} (pk, ck, v) VALUES (?, ?, ?)"
        ))
        .await
        .unwrap()
}

/// The number of rows `select` returns.
async fn count_rows(session: &Session, select: &str) -> usize {
    session
        .query_unpaged(select, &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .rows_num()
}

/// The message of a failed execution, whatever the driver's error type.
fn message<T, E: std::fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => panic!("the write was accepted"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_megabyte_blob_round_trips_and_writes_over_the_limits_are_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        1,
        &[
            "--durability",
            "periodic",
            "--max-value-bytes",
            "11MiB",
            "--max-mutation-bytes",
            "12MiB",
        ],
    );
    let session = connect(&node).await;
    let ins = create_blob_table(&session, "lim", "blobs").await;
    let blob: Vec<u8> = (0..10_000_000u32).map(|i| (i % 251) as u8).collect();
    session
        .execute_unpaged(&ins, (1i32, 1i32, blob.clone()))
        .await
        .unwrap();
    let (back,): (Vec<u8>,) = session
        .query_unpaged("SELECT v FROM lim.blobs WHERE pk = 1 AND ck = 1", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap()
        .single_row()
        .unwrap();
    assert!(back == blob, "the 10 MB blob came back changed");

    // One value over the cell limit.
    let over = vec![7u8; (11 << 20) + 1];
    let e = message(session.execute_unpaged(&ins, (1i32, 2i32, over)).await);
    assert!(
        e.contains("max-value-bytes (11534336 bytes)"),
        "unexpected error: {e}"
    );
    // Two values under it, over the mutation limit together (one partition, one batch).
    let mut batch = Batch::default();
    batch.append_statement(ins.clone());
    batch.append_statement(ins.clone());
    let seven = vec![1u8; 7 << 20];
    let e = message(
        session
            .batch(&batch, ((2i32, 1i32, seven.clone()), (2i32, 2i32, seven)))
            .await,
    );
    assert!(
        e.contains("max-mutation-bytes (12582912 bytes)"),
        "unexpected error: {e}"
    );
    let rows = count_rows(&session, "SELECT ck FROM lim.blobs WHERE pk = 2").await;
    assert_eq!(rows, 0, "nothing of the refused batch was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_would_take_a_partition_over_the_limit_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        2,
        &[
            "--durability",
            "periodic",
            "--max-value-bytes",
            "1MiB",
            "--max-mutation-bytes",
            "1MiB",
            "--max-partition-bytes",
            "4MiB",
        ],
    );
    let session = connect(&node).await;
    let ins = create_blob_table(&session, "plim", "t").await;
    let value = vec![3u8; 500_000];
    // 4 MiB is 8 rows of 500 kB and some: the ninth is refused, naming the limit.
    for ck in 0..8i32 {
        session
            .execute_unpaged(&ins, (1i32, ck, value.clone()))
            .await
            .unwrap();
    }
    let e = message(
        session
            .execute_unpaged(&ins, (1i32, 8i32, value.clone()))
            .await,
    );
    assert!(
        e.contains("max-partition-bytes (4194304 bytes)"),
        "unexpected error: {e}"
    );
    assert!(
        e.contains("Invalid") || e.contains("invalid"),
        "not Invalid: {e}"
    );
    // Other partitions are not affected; small writes to the full one still fit until the limit.
    for pk in 2..5i32 {
        session
            .execute_unpaged(&ins, (pk, 0i32, value.clone()))
            .await
            .unwrap();
    }
    let rows = count_rows(&session, "SELECT ck FROM plim.t WHERE pk = 1").await;
    assert_eq!(rows, 8, "the refused row was not written");
    // Deleting the partition starts it again.
    session
        .query_unpaged("DELETE FROM plim.t WHERE pk = 1", &[])
        .await
        .unwrap();
    session
        .execute_unpaged(&ins, (1i32, 8i32, value.clone()))
        .await
        .unwrap();
    // TRUNCATE forgets the estimates too.
    for ck in 9..16i32 {
        session
            .execute_unpaged(&ins, (1i32, ck, value.clone()))
            .await
            .unwrap();
    }
    let e = message(
        session
            .execute_unpaged(&ins, (1i32, 16i32, value.clone()))
            .await,
    );
    assert!(e.contains("max-partition-bytes"), "unexpected error: {e}");
    session.query_unpaged("TRUNCATE plim.t", &[]).await.unwrap();
    session
        .execute_unpaged(&ins, (1i32, 16i32, value.clone()))
        .await
        .unwrap();
}

/// Writes `rows` rows of `row_bytes` into partition 1 of `lim.big`.
async fn write_partition(session: &Session, rows: i32, row_bytes: usize) {
    let ins = create_blob_table(session, "lim", "big").await;
    for ck in 0..rows {
        session
            .execute_unpaged(&ins, (1i32, ck, vec![(ck % 256) as u8; row_bytes]))
            .await
            .unwrap();
    }
}

/// Pages through partition 1 at the drivers' usual fetch size of 5000; returns the rows, the
/// pages, and the largest page in bytes of values.
async fn page_partition(session: &Session, row_bytes: usize) -> (i32, usize, usize) {
    let mut sel = session
        .prepare("SELECT ck, v FROM lim.big WHERE pk = 1")
        .await
        .unwrap();
    sel.set_page_size(5000);
    let mut state = PagingState::start();
    let (mut rows, mut pages, mut largest) = (0i32, 0usize, 0usize);
    loop {
        let (result, next) = session.execute_single_page(&sel, (), state).await.unwrap();
        pages += 1;
        let result = result.into_rows_result().unwrap();
        let mut bytes = 0;
        for row in result.rows::<(i32, Vec<u8>)>().unwrap() {
            let (ck, v) = row.unwrap();
            assert_eq!(ck, rows, "rows in clustering order, none missing");
            assert_eq!(v.len(), row_bytes);
            assert!(v.iter().all(|&b| b == (ck % 256) as u8));
            bytes += v.len();
            rows += 1;
        }
        largest = largest.max(bytes);
        match next.into_paging_control_flow() {
            ControlFlow::Break(()) => return (rows, pages, largest),
            ControlFlow::Continue(s) => state = s,
        }
    }
}

/// Writes a partition of `rows` rows of 100 KB, restarts the node (a clean shutdown flushes
/// the memtables, so the write path's memory is gone), pages through it and checks that the
/// peak RSS grew by less than `most_growth` while reading.
async fn big_partition_paged_with_bounded_memory(rows: i32, most_growth: u64) {
    const ROW_BYTES: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let args = ["--durability", "periodic", "--cache-bytes", "8MiB"];
    let mut node = Node::start(&data, 1, &args);
    let session = connect(&node).await;
    let started = Instant::now();
    write_partition(&session, rows, ROW_BYTES).await;
    let wrote = started.elapsed();
    drop(session);
    assert!(node.terminate().success());
    let node = Node::start(&data, 1, &args);
    let session = connect(&node).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = peak_rss(&node);
    let started = Instant::now();
    let (read, pages, largest) = page_partition(&session, ROW_BYTES).await;
    let paged = started.elapsed();
    let after = peak_rss(&node);
    let partition = rows as u64 * ROW_BYTES as u64;
    eprintln!(
        "partition {partition} bytes ({rows} rows): written in {wrote:?}, paged in {paged:?} \
         over {pages} pages (largest {largest} bytes); peak RSS {before} before paging, \
         {after} after (+{})",
        after - before
    );
    assert_eq!(read, rows);
    assert!(
        pages > 1,
        "a partition of {partition} bytes came in one page"
    );
    assert!(
        after - before < most_growth,
        "peak RSS grew by {} bytes paging through a {partition}-byte partition",
        after - before
    );
}

/// 20 MB: always on, the same property as the 200 MB test below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twenty_megabyte_partition_is_paged_with_bounded_memory() {
    big_partition_paged_with_bounded_memory(200, 64 << 20).await;
}

/// 200 MB (2,000 rows of 100 KB): `cargo test --release -p sluice --test limits -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes 200 MB; run on demand"]
async fn a_two_hundred_megabyte_partition_is_paged_with_bounded_memory() {
    big_partition_paged_with_bounded_memory(2000, 64 << 20).await;
}
