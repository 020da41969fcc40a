//! Aggregates and unpaged reads over more rows than one read call examines: every row
//! counts, the answer agrees with a full paged scan, a long read yields to the shard's
//! other tasks, and one that cannot finish before its deadline answers a timeout.

use super::*;
use std::cell::Cell;
use std::collections::BTreeMap;

/// The `v` column of row (`pk`, `ck`): spread over -1000..=1000.
fn v_of(pk: i32, ck: i32) -> i32 {
    ((pk as i64 * 7919 + ck as i64 * 104_729).rem_euclid(2001) - 1000) as i32
}

/// The `f` column: an exact binary fraction, so double sums are exact in any order.
fn f_of(pk: i32, ck: i32) -> f64 {
    v_of(pk, ck) as f64 / 4.0
}

fn cdouble(b: &Option<Bytes>) -> f64 {
    f64::from_be_bytes(b.as_ref().expect("a value").as_ref().try_into().unwrap())
}

/// Creates `ks.big (pk, ck, v, f)` and writes `partitions` partitions of `rows` rows.
async fn load_big(h: &mut H, partitions: i32, rows: i32) {
    h.ok("CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}").await;
    h.ok("CREATE TABLE ks.big (pk int, ck int, v int, f double, PRIMARY KEY (pk, ck))")
        .await;
    let p = h
        .engine
        .prepare(
            None,
            "INSERT INTO ks.big (pk, ck, v, f) VALUES (?, ?, ?, ?)",
        )
        .unwrap();
    let ctx = RequestContext::now();
    for pk in 0..partitions {
        for ck in 0..rows {
            let params = QueryParameters {
                values: vec![
                    int(pk),
                    int(ck),
                    int(v_of(pk, ck)),
                    Value::Set(Bytes::copy_from_slice(&f_of(pk, ck).to_be_bytes())),
                ],
                ..QueryParameters::default()
            };
            h.engine
                .execute(&mut h.session, &p, &params, &ctx)
                .await
                .unwrap();
        }
    }
}

/// What a full paged scan of `ks.big` sees, per partition: (rows, sum of v, min v, max v).
async fn paged_truth(h: &mut H) -> BTreeMap<i32, (i64, i64, i32, i32)> {
    let (rows, pages) = page_through(h, "SELECT pk, ck, v, f FROM ks.big", vec![], 5000).await;
    assert!(pages > 1);
    let mut per: BTreeMap<i32, (i64, i64, i32, i32)> = BTreeMap::new();
    for r in &rows {
        let (pk, ck, v) = (cint(&r[0]), cint(&r[1]), cint(&r[2]));
        assert_eq!(v, v_of(pk, ck), "the scan reads back what was written");
        assert_eq!(cdouble(&r[3]), f_of(pk, ck));
        let e = per.entry(pk).or_insert((0, 0, i32::MAX, i32::MIN));
        e.0 += 1;
        e.1 += v as i64;
        e.2 = e.2.min(v);
        e.3 = e.3.max(v);
    }
    per
}

/// Runs `q` unpaged and with a page size a driver would send (ignored by an aggregate):
/// both answer the same single page.
async fn both_ways(h: &mut H, q: &str) -> Vec<Vec<Option<Bytes>>> {
    let unpaged = h.select(q, vec![]).await;
    let params = QueryParameters {
        page_size: Some(100),
        ..QueryParameters::default()
    };
    let r = match h.exec_params(q, params).await.unwrap() {
        ResultMessage::Rows(r) => r,
        other => panic!("{other:?}"),
    };
    assert!(r.metadata.paging_state.is_none(), "{q}: one page");
    assert_eq!(cells(&r), unpaged, "{q}: paged and unpaged agree");
    unpaged
}

/// Aggregates over `partitions` x `rows` rows agree with a full paged scan and with the
/// values written.
async fn aggregates_agree_with_a_paged_scan(partitions: i32, rows: i32) {
    let mut h = H::new();
    load_big(&mut h, partitions, rows).await;
    let total = partitions as i64 * rows as i64;
    let truth = paged_truth(&mut h).await;
    assert_eq!(truth.len(), partitions as usize);
    let count: i64 = truth.values().map(|t| t.0).sum();
    let sum: i64 = truth.values().map(|t| t.1).sum();
    let min = truth.values().map(|t| t.2).min().unwrap();
    let max = truth.values().map(|t| t.3).max().unwrap();
    assert_eq!(count, total, "the paged scan sees every row");

    let r = both_ways(
        &mut h,
        "SELECT count(*), count(v), sum(v), avg(v), min(v), max(v), sum(f), avg(f) FROM ks.big",
    )
    .await;
    let r = &r[0];
    assert_eq!(cbig(&r[0]), count, "count(*)");
    assert_eq!(cbig(&r[1]), count, "count(v)");
    // sum(int) is an int that wraps, as in Cassandra; these sums fit.
    assert_eq!(cint(&r[2]) as i64, sum, "sum(v)");
    assert_eq!(cint(&r[3]) as i64, sum / count, "avg(v)");
    assert_eq!((cint(&r[4]), cint(&r[5])), (min, max), "min/max(v)");
    assert_eq!(cdouble(&r[6]), sum as f64 / 4.0, "sum(f)");
    assert_eq!(cdouble(&r[7]), sum as f64 / 4.0 / count as f64, "avg(f)");

    // GROUP BY: one row per partition, each agreeing with the scan.
    let r = both_ways(
        &mut h,
        "SELECT pk, count(*), sum(v), min(v), max(v) FROM ks.big GROUP BY pk",
    )
    .await;
    let got: BTreeMap<i32, (i64, i64, i32, i32)> = r
        .iter()
        .map(|r| {
            let g = (cbig(&r[1]), cint(&r[2]) as i64, cint(&r[3]), cint(&r[4]));
            (cint(&r[0]), g)
        })
        .collect();
    assert_eq!(r.len(), partitions as usize, "one row per group");
    assert_eq!(got, truth);
    // LIMIT counts groups.
    let r = h
        .select(
            "SELECT pk, count(*) FROM ks.big GROUP BY pk LIMIT 7",
            vec![],
        )
        .await;
    assert_eq!(r.len(), 7);
    assert!(r.iter().all(|r| cbig(&r[1]) == rows as i64));

    // A filtered aggregate examines every row too.
    let expected: Vec<i32> = (0..partitions)
        .flat_map(|pk| (0..rows).map(move |ck| v_of(pk, ck)))
        .filter(|&v| v > 500)
        .collect();
    let r = both_ways(
        &mut h,
        "SELECT count(*), sum(v), min(v) FROM ks.big WHERE v > 500 ALLOW FILTERING",
    )
    .await;
    assert_eq!(cbig(&r[0][0]), expected.len() as i64, "filtered count(*)");
    assert_eq!(
        cint(&r[0][1]) as i64,
        expected.iter().map(|&v| v as i64).sum::<i64>(),
        "filtered sum(v)"
    );
    assert_eq!(cint(&r[0][2]), *expected.iter().min().unwrap());

    // PER PARTITION LIMIT holds in every partition, however the read is sliced; with GROUP
    // BY it counts groups, and a plain aggregate rejects it, as Cassandra does.
    let r = h
        .select("SELECT pk, ck FROM ks.big PER PARTITION LIMIT 3", vec![])
        .await;
    assert_eq!(r.len(), partitions as usize * 3);
    assert!(r.iter().all(|r| cint(&r[1]) < 3));
    let r = h
        .select(
            "SELECT pk, count(*) FROM ks.big GROUP BY pk PER PARTITION LIMIT 2",
            vec![],
        )
        .await;
    assert_eq!(r.len(), partitions as usize);
    assert!(r.iter().all(|r| cbig(&r[1]) == rows as i64));
    let e = h
        .err("SELECT count(*) FROM ks.big PER PARTITION LIMIT 3", vec![])
        .await;
    assert_eq!(e.code(), ErrorCode::Invalid);
}

#[tokio::test]
async fn aggregates_over_three_times_the_examination_cap_count_every_row() {
    // 60,000 rows: three times what one read call used to examine.
    aggregates_agree_with_a_paged_scan(300, 200).await;
}

/// The same at a million rows (run in release: `cargo test --release -p sluice-engine --
/// --ignored aggregates_over_a_million_rows`).
#[tokio::test]
#[ignore = "a million rows: run in release"]
async fn aggregates_over_a_million_rows_count_every_row() {
    aggregates_agree_with_a_paged_scan(5000, 200).await;
}

#[tokio::test]
async fn unpaged_and_filtered_reads_are_never_cut_short() {
    let mut h = H::new();
    load_big(&mut h, 130, 200).await;
    // 26,000 rows: past one read call's examination cap.
    let all = h.select("SELECT pk, ck FROM ks.big", vec![]).await;
    assert_eq!(all.len(), 26_000, "an unpaged scan returns every row");
    let q = "SELECT pk, ck, v FROM ks.big WHERE v > 900 ALLOW FILTERING";
    let expected = (0..130)
        .flat_map(|pk| (0..200).map(move |ck| v_of(pk, ck)))
        .filter(|&v| v > 900)
        .count();
    assert_eq!(
        h.select(q, vec![]).await.len(),
        expected,
        "an unpaged filtered scan returns every match"
    );
    // Paged: short pages are allowed, but only with a paging state; the pages cover all.
    let (rows, _) = page_through(&mut h, q, vec![], 1000).await;
    assert_eq!(rows.len(), expected);

    // One partition bigger than the cap: partition reads are sliced the same way.
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.big (pk, ck, v) VALUES (-1, ?, ?)")
        .unwrap();
    let ctx = RequestContext::now();
    for ck in 0..25_000 {
        let params = QueryParameters {
            values: vec![int(ck), int(v_of(-1, ck))],
            ..QueryParameters::default()
        };
        h.engine
            .execute(&mut h.session, &p, &params, &ctx)
            .await
            .unwrap();
    }
    let vs: Vec<i64> = (0..25_000).map(|ck| v_of(-1, ck) as i64).collect();
    let r = both_ways(
        &mut h,
        "SELECT count(*), min(ck), max(ck), avg(v), sum(v) FROM ks.big WHERE pk = -1",
    )
    .await;
    let sum: i64 = vs.iter().sum();
    assert_eq!(cbig(&r[0][0]), 25_000);
    assert_eq!((cint(&r[0][1]), cint(&r[0][2])), (0, 24_999));
    assert_eq!(cint(&r[0][3]) as i64, sum / 25_000);
    assert_eq!(cint(&r[0][4]) as i64, sum);
    let q = "SELECT ck FROM ks.big WHERE pk = -1 AND v > 990 ALLOW FILTERING";
    let expected = vs.iter().filter(|&&v| v > 990).count();
    assert_eq!(h.select(q, vec![]).await.len(), expected);
    let (rows, pages) = page_through(&mut h, q, vec![], 1000).await;
    assert_eq!(rows.len(), expected);
    assert!(pages >= 2, "a filtered partition read pages after its cap");
    assert_eq!(
        h.select("SELECT ck FROM ks.big WHERE pk = -1", vec![])
            .await
            .len(),
        25_000
    );
}

#[tokio::test]
async fn a_per_partition_limit_holds_across_page_and_slice_boundaries() {
    let mut h = H::new();
    load_big(&mut h, 40, 10).await;
    // Pages of 3 rows under PER PARTITION LIMIT 3 end exactly at partition ends; a filter
    // makes storage return several partitions per call.
    for q in [
        "SELECT pk, ck FROM ks.big PER PARTITION LIMIT 3",
        "SELECT pk, ck FROM ks.big WHERE v > -2000 PER PARTITION LIMIT 3 ALLOW FILTERING",
    ] {
        for page in [3, 6, 7] {
            let (rows, _) = page_through(&mut h, q, vec![], page).await;
            assert_eq!(rows.len(), 40 * 3, "{q}: page size {page}");
            assert!(
                rows.iter().all(|r| cint(&r[1]) < 3),
                "{q}: page size {page}"
            );
        }
    }
    // With GROUP BY, PER PARTITION LIMIT counts groups: two (pk, ck) groups per partition.
    let r = h
        .select(
            "SELECT pk, ck, count(*) FROM ks.big GROUP BY pk, ck PER PARTITION LIMIT 2",
            vec![],
        )
        .await;
    assert_eq!(r.len(), 40 * 2);
    assert!(r.iter().all(|r| cint(&r[1]) < 2 && cbig(&r[2]) == 1));
}

#[tokio::test(flavor = "current_thread")]
async fn a_long_aggregate_yields_and_times_out_at_its_deadline() {
    let mut h = H::new();
    load_big(&mut h, 150, 200).await;
    let p = h
        .engine
        .prepare(None, "SELECT count(*) FROM ks.big")
        .unwrap();
    let params = QueryParameters::default();

    // Other tasks of the same thread run while the aggregate scans.
    let done = Cell::new(false);
    let ticks = Cell::new(0u32);
    let ctx = RequestContext::now();
    let count = async {
        let r = h.engine.execute(&mut h.session, &p, &params, &ctx).await;
        done.set(true);
        r
    };
    let ticker = async {
        while !done.get() {
            ticks.set(ticks.get() + 1);
            tokio::task::yield_now().await;
        }
    };
    let (r, ()) = tokio::join!(count, ticker);
    let ResultMessage::Rows(r) = r.unwrap() else {
        panic!("rows expected")
    };
    assert_eq!(cbig(&cells(&r)[0][0]), 30_000);
    assert!(
        ticks.get() >= 10,
        "the aggregate let other tasks run only {} times",
        ticks.get()
    );

    // The deadline passes while the aggregate waits between slices (another task holds the
    // thread): it answers Read_timeout, not the rows counted so far.
    let done = Cell::new(false);
    let ctx = RequestContext {
        deadline: Some(std::time::Instant::now() + Duration::from_millis(300)),
        ..RequestContext::now()
    };
    let count = async {
        let r = h.engine.execute(&mut h.session, &p, &params, &ctx).await;
        done.set(true);
        r
    };
    let busy_neighbour = async {
        tokio::task::yield_now().await;
        if !done.get() {
            std::thread::sleep(Duration::from_millis(400));
        }
    };
    let (r, ()) = tokio::join!(count, busy_neighbour);
    let e = r.expect_err("a timeout, not a partial count");
    assert_eq!(e.code(), ErrorCode::ReadTimeout);
    assert!(matches!(
        e.error,
        DbError::ReadTimeout {
            received: 0,
            block_for: 1,
            data_present: false,
            ..
        }
    ));
    // The same with GROUP BY and a filter.
    let p = h
        .engine
        .prepare(
            None,
            "SELECT pk, count(*) FROM ks.big WHERE v > 0 GROUP BY pk ALLOW FILTERING",
        )
        .unwrap();
    let done = Cell::new(false);
    let ctx = RequestContext {
        deadline: Some(std::time::Instant::now() + Duration::from_millis(300)),
        ..RequestContext::now()
    };
    let grouped = async {
        let r = h.engine.execute(&mut h.session, &p, &params, &ctx).await;
        done.set(true);
        r
    };
    let busy_neighbour = async {
        tokio::task::yield_now().await;
        if !done.get() {
            std::thread::sleep(Duration::from_millis(400));
        }
    };
    let (r, ()) = tokio::join!(grouped, busy_neighbour);
    assert_eq!(r.unwrap_err().code(), ErrorCode::ReadTimeout);
}

#[tokio::test]
async fn an_unpaged_result_too_big_for_a_frame_is_an_error_not_a_short_result() {
    let mut h = H::new();
    h.setup_kv().await;
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.t (pk, ck, v) VALUES (?, ?, ?)")
        .unwrap();
    let ctx = RequestContext::now();
    let big = "x".repeat(1000);
    // 3,000 rows of 1 KB: over the unit tests' 1 MiB bound on an unpaged result.
    for i in 0..3000 {
        let params = QueryParameters {
            values: vec![int(i % 7), int(i), text(&big)],
            ..QueryParameters::default()
        };
        h.engine
            .execute(&mut h.session, &p, &params, &ctx)
            .await
            .unwrap();
    }
    let Err(e) = h.exec("SELECT v FROM ks.t", vec![]).await else {
        panic!("an unpaged result over the bound must be an error");
    };
    assert_eq!(e.code(), ErrorCode::Invalid);
    assert!(e.message.contains("page it"), "{}", e.message);
    // Paged, the same read returns every row; small unpaged results are unaffected.
    let (rows, _) = page_through(&mut h, "SELECT v FROM ks.t", vec![], 500).await;
    assert_eq!(rows.len(), 3000);
    assert_eq!(h.select("SELECT ck FROM ks.t", vec![]).await.len(), 3000);
    let r = h.select("SELECT count(*) FROM ks.t", vec![]).await;
    assert_eq!(cbig(&r[0][0]), 3000);
}

#[tokio::test]
async fn float_sums_are_compensated_as_cassandras_are() {
    let mut h = H::new();
    h.setup_kv().await;
    h.ok("CREATE TABLE ks.fl (k int, c int, d double, PRIMARY KEY (k, c))")
        .await;
    let p = h
        .engine
        .prepare(None, "INSERT INTO ks.fl (k, c, d) VALUES (1, ?, ?)")
        .unwrap();
    let ctx = RequestContext::now();
    // 1.0, then 10,000 values of 1e-16: each is lost in a plain f64 sum, which stays 1.0.
    for c in 0..=10_000 {
        let d: f64 = if c == 0 { 1.0 } else { 1e-16 };
        let params = QueryParameters {
            values: vec![int(c), Value::Set(Bytes::copy_from_slice(&d.to_be_bytes()))],
            ..QueryParameters::default()
        };
        h.engine
            .execute(&mut h.session, &p, &params, &ctx)
            .await
            .unwrap();
    }
    let r = h
        .select("SELECT sum(d), avg(d) FROM ks.fl WHERE k = 1", vec![])
        .await;
    let (sum, avg) = (cdouble(&r[0][0]), cdouble(&r[0][1]));
    assert!((sum - (1.0 + 1e-12)).abs() < 1e-15, "sum(d) = {sum}");
    assert!(
        (avg - (1.0 + 1e-12) / 10_001.0).abs() < 1e-18,
        "avg(d) = {avg}"
    );
}
