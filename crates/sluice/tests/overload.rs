//! Overload end to end against the real binary on one shard, with raw v4 frames so
//! that every stream's answer is observed exactly.
//!
//! "Slow work" is made real with the test-only knob `--test-only-service-delay`, which adds
//! service time to every execution after its deadline check; the execution concurrency
//! limit is pinned to 1, so requests queue in the shard's admission queue behind it.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{frame, query, read_frame, startup, Node};

const OVERLOADED: u32 = 0x1001;
const WRITE_TIMEOUT: u32 = 0x1100;

fn connect(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&startup()).unwrap();
    let (_, op, _, _) = read_frame(&mut s).expect("READY");
    assert_eq!(op, 0x02, "READY");
    s
}

/// Runs one statement and returns (opcode, error code).
fn run(s: &mut TcpStream, stream: i16, text: &str) -> (u8, Option<u32>, Vec<u8>) {
    s.write_all(&query(stream, text)).unwrap();
    loop {
        let (st, op, code, body) = read_frame(s).expect("answer");
        if st == stream {
            return (op, code, body);
        }
    }
}

/// Row count of a ROWS result body (kind 2): metadata flags, column count, [paging state],
/// [global table spec], column specs, then the row count. Only the simple cases used here.
fn row_count(s: &mut TcpStream, stream: i16, text: &str) -> i32 {
    let (op, code, body) = run(s, stream, text);
    assert_eq!((op, code), (0x08, None), "{text}");
    assert_eq!(&body[0..4], &2i32.to_be_bytes(), "ROWS");
    let flags = i32::from_be_bytes(body[4..8].try_into().unwrap());
    let cols = i32::from_be_bytes(body[8..12].try_into().unwrap());
    let mut p = 12;
    let short_str = |p: &mut usize| {
        let n = u16::from_be_bytes([body[*p], body[*p + 1]]) as usize;
        *p += 2 + n;
    };
    if flags & 0x02 != 0 {
        let n = i32::from_be_bytes(body[p..p + 4].try_into().unwrap());
        p += 4 + n.max(0) as usize;
    }
    let global = flags & 0x01 != 0;
    if flags & 0x04 == 0 {
        if global {
            short_str(&mut p);
            short_str(&mut p);
        }
        for _ in 0..cols {
            if !global {
                short_str(&mut p);
                short_str(&mut p);
            }
            short_str(&mut p);
            let ty = u16::from_be_bytes([body[p], body[p + 1]]);
            p += 2;
            assert!(ty < 0x20, "simple column types only in this helper");
        }
    }
    i32::from_be_bytes(body[p..p + 4].try_into().unwrap())
}

fn slow_node(dir: &std::path::Path, extra: &[&str]) -> Node {
    let mut args = vec![
        "--durability",
        "periodic",
        "--admission-min-concurrency",
        "1",
        "--admission-max-concurrency",
        "1",
        "--test-only-service-delay",
        "40ms",
    ];
    args.extend_from_slice(extra);
    Node::start(dir, 1, &args)
}

fn schema(s: &mut TcpStream) {
    let ks = "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}";
    assert_eq!(run(s, 2, ks).1, None);
    assert_eq!(
        run(s, 3, "CREATE TABLE ks.t (k int PRIMARY KEY, v int)").1,
        None
    );
}

#[test]
fn a_write_with_using_timeout_1ms_queued_behind_slow_work_times_out_and_is_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    // A long CoDel interval: queued requests are not shed, so only deadlines act here.
    let node = slow_node(&dir.path().join("db"), &["--admission-interval", "10s"]);
    let mut s = connect(node.addr);
    schema(&mut s);
    // Eight slow writes (8 × 40 ms, one at a time), then the 1 ms write and a normal one.
    let mut batch = Vec::new();
    for i in 0..8i16 {
        batch.extend(query(
            10 + i,
            format!("INSERT INTO ks.t (k, v) VALUES ({i}, {i})"),
        ));
    }
    batch.extend(query(
        30,
        "INSERT INTO ks.t (k, v) VALUES (99, 1) USING TIMEOUT 1ms",
    ));
    batch.extend(query(
        31,
        "INSERT INTO ks.t (k, v) VALUES (100, 1) USING TIMEOUT 10s",
    ));
    s.write_all(&batch).unwrap();
    let mut answers = std::collections::HashMap::new();
    while answers.len() < 10 {
        let (st, op, code, _) = read_frame(&mut s).expect("answer");
        answers.insert(st, (op, code));
    }
    for i in 0..8i16 {
        assert_eq!(answers[&(10 + i)], (0x08, None), "slow write {i} served");
    }
    assert_eq!(answers[&30], (0x00, Some(WRITE_TIMEOUT)), "typed timeout");
    assert_eq!(answers[&31], (0x08, None), "a generous deadline is served");
    assert_eq!(
        row_count(&mut s, 40, "SELECT * FROM ks.t WHERE k = 99"),
        0,
        "not applied"
    );
    assert_eq!(row_count(&mut s, 41, "SELECT * FROM ks.t WHERE k = 100"), 1);
    let expired = node.metric(
        "sluice_rejected_total",
        &[("reason", "expired_before_execution")],
    );
    assert!(
        expired >= 1.0,
        "counted as expired before execution: {expired}"
    );
    // An invalid duration is a clear Invalid error, not a timeout.
    let (op, code, _) = run(
        &mut s,
        42,
        "INSERT INTO ks.t (k, v) VALUES (1, 1) USING TIMEOUT -5ms",
    );
    assert_eq!(op, 0x00);
    assert!(
        matches!(code, Some(0x2000) | Some(0x2200)),
        "syntax/invalid: {code:?}"
    );
}

#[test]
fn queued_requests_of_a_disconnected_client_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let node = slow_node(&dir.path().join("db"), &["--admission-interval", "10s"]);
    let mut s = connect(node.addr);
    schema(&mut s);
    let mut gone = connect(node.addr);
    let mut batch = Vec::new();
    for i in 0..40i16 {
        batch.extend(query(
            10 + i,
            format!("INSERT INTO ks.t (k, v) VALUES ({i}, {i})"),
        ));
    }
    gone.write_all(&batch).unwrap();
    // Let them all reach the queue (one runs at a time, 40 ms each), then hang up.
    std::thread::sleep(Duration::from_millis(150));
    drop(gone);
    std::thread::sleep(Duration::from_millis(500));
    let dropped = node.metric(
        "sluice_rejected_total",
        &[("reason", "client_disconnected")],
    );
    assert!(
        dropped >= 20.0,
        "most queued requests dropped, got {dropped}"
    );
    let applied = row_count(&mut s, 60, "SELECT * FROM ks.t");
    assert!(
        applied < 10,
        "dropped requests were not executed: {applied} rows"
    );
    assert_eq!(node.metric("sluice_admission_queued", &[]), 0.0);
}

#[test]
fn a_flood_gets_overloaded_and_a_second_client_stays_responsive() {
    let dir = tempfile::tempdir().unwrap();
    let node = slow_node(&dir.path().join("db"), &["--admission-queue", "16"]);
    let mut setup = connect(node.addr);
    schema(&mut setup);
    let mut flood = connect(node.addr);
    let n = 600i16;
    let mut batch = Vec::new();
    for i in 0..n {
        batch.extend(query(
            100 + i,
            format!("INSERT INTO ks.t (k, v) VALUES ({i}, 1)"),
        ));
    }
    flood.write_all(&batch).unwrap();
    // A second client, meanwhile: OPTIONS (a driver heartbeat) is never queued, and a
    // query is answered (served or turned away) promptly rather than stuck.
    let mut other = connect(node.addr);
    let t = Instant::now();
    other.write_all(&frame(4, 5, 0x05, &[])).unwrap();
    let (st, op, _, _) = read_frame(&mut other).expect("SUPPORTED");
    assert_eq!((st, op), (5, 0x06));
    let (op, code, _) = run(&mut other, 6, "SELECT * FROM ks.t WHERE k = 1");
    assert!(op == 0x08 || code == Some(OVERLOADED), "{op} {code:?}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "second client waited {:?}",
        t.elapsed()
    );
    let (mut served, mut overloaded) = (0, 0);
    for _ in 0..n {
        let (_, op, code, _) = read_frame(&mut flood).expect("every request answered");
        match (op, code) {
            (0x08, None) => served += 1,
            (0x00, Some(OVERLOADED)) => overloaded += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert!(overloaded > n as i32 / 2, "flood shed: {overloaded} of {n}");
    assert!(served >= 1, "work still gets done: {served}");
    let m = node.metric("sluice_rejected_total", &[("reason", "overloaded")]);
    assert!(m >= overloaded as f64, "metric {m} >= {overloaded}");
    assert!(node
        .metrics_text()
        .contains("sluice_queue_delay_seconds_bucket"));
}

/// The same flood through the stock Rust driver: it surfaces `Overloaded` to the caller
/// (a single node leaves its retry policy nowhere else to go), every request completes, and
/// a second session keeps being served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_driver_receives_overloaded_under_a_flood() {
    let dir = tempfile::tempdir().unwrap();
    // A 1 s interval: the driver's own burst of metadata queries after each schema change
    // (about ten, 40 ms each here) is not shed; the flood overflows the 16-slot queue.
    let args = ["--admission-queue", "16", "--admission-interval", "1s"];
    let node = slow_node(&dir.path().join("db"), &args);
    let session = common::connect(&node).await;
    let ks = "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}";
    session.query_unpaged(ks, &[]).await.unwrap();
    session
        .query_unpaged("CREATE TABLE ks.t (k int PRIMARY KEY, v int)", &[])
        .await
        .unwrap();
    let ins = session
        .prepare("INSERT INTO ks.t (k, v) VALUES (?, ?)")
        .await
        .unwrap();
    let session = std::sync::Arc::new(session);
    let mut tasks = Vec::new();
    for i in 0..400i32 {
        let (s, ins) = (session.clone(), ins.clone());
        tasks.push(tokio::spawn(async move {
            s.execute_unpaged(&ins, (i, 1i32)).await
        }));
    }
    let other = common::connect(&node).await;
    let t = Instant::now();
    let r = other.query_unpaged("SELECT * FROM system.local", &[]).await;
    assert!(
        r.is_ok() || format!("{r:?}").contains("Overloaded"),
        "second client: {r:?}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "second client waited {:?}",
        t.elapsed()
    );
    let (mut ok, mut overloaded) = (0, 0);
    for t in tasks {
        match tokio::time::timeout(Duration::from_secs(30), t).await {
            Ok(Ok(Ok(_))) => ok += 1,
            Ok(Ok(Err(e))) => {
                let text = format!("{e:?}");
                assert!(text.contains("Overloaded"), "unexpected error {text}");
                overloaded += 1;
            }
            other => panic!("request did not complete: {other:?}"),
        }
    }
    assert!(overloaded > 0, "the driver saw Overloaded ({ok} served)");
    assert!(ok > 0, "work still gets done");
}

#[test]
fn over_the_bytes_in_flight_cap_the_socket_waits_and_nothing_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--max-inflight-bytes-per-connection",
        "1KiB",
        "--admission-interval",
        "10s",
    ];
    let node = slow_node(&dir.path().join("db"), &args);
    let mut s = connect(node.addr);
    schema(&mut s);
    let pause_before = node.metric("sluice_backpressure_pauses_total", &[]);
    // 20 writes of about 300 bytes each: at most 3 fit under the cap at once.
    let pad = "x".repeat(250);
    let mut batch = Vec::new();
    for i in 0..20i16 {
        let q = format!("INSERT INTO ks.t (k, v) VALUES ({i}, 1) /* {pad} */");
        batch.extend(query(10 + i, &q));
    }
    s.write_all(&batch).unwrap();
    for _ in 0..20 {
        let (_, op, code, _) = read_frame(&mut s).expect("answer");
        assert_eq!((op, code), (0x08, None), "served, not rejected");
    }
    let paused = node.metric("sluice_backpressure_pauses_total", &[]) - pause_before;
    assert!(
        paused >= 1.0,
        "the reader waited for bytes in flight: {paused}"
    );
    assert_eq!(
        node.metric("sluice_rejected_total", &[("reason", "overloaded")]),
        0.0
    );
    assert_eq!(row_count(&mut s, 40, "SELECT * FROM ks.t"), 20);
}

/// Answers of one flooding connection.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    sent: u64,
    served: u64,
    overloaded: u64,
    other_errors: u64,
    /// Answered after the client's timeout, or never.
    timed_out: u64,
}

/// Sends `frame` (its stream id patched) open-loop at `rate` per second for `load`, and
/// reads the answers on another thread. Latency counts from the intended send time, so a
/// server that stops reading the socket makes requests late even before they are sent.
fn flood(
    addr: SocketAddr,
    frame: Vec<u8>,
    rate: u32,
    load: Duration,
    timeout: Duration,
) -> std::thread::JoinHandle<Tally> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    use std::sync::Arc;
    std::thread::spawn(move || {
        let s = connect(addr);
        let mut reader = s.try_clone().unwrap();
        reader
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let n = (f64::from(rate) * load.as_secs_f64()) as usize;
        assert!(n < 32_000, "one stream id per request");
        // Intended send time of each stream, in µs after t0 (+1; 0 = not sent yet).
        let sent: Arc<Vec<AtomicU64>> = Arc::new((0..=n).map(|_| AtomicU64::new(0)).collect());
        let t0 = Instant::now();
        let answers = {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let mut t = Tally::default();
                let mut answered = vec![false; n + 1];
                let end = t0 + load + timeout;
                while Instant::now() < end {
                    let Some((stream, op, code, _)) = read_frame(&mut reader) else {
                        continue; // read timeout: poll the clock again
                    };
                    let i = stream as usize;
                    let at = sent.get(i).map_or(0, |a| a.load(Relaxed));
                    if at == 0 || answered[i] {
                        continue;
                    }
                    answered[i] = true;
                    let intended = t0 + Duration::from_micros(at - 1);
                    if intended.elapsed() > timeout {
                        t.timed_out += 1;
                    } else if op == 0x08 {
                        t.served += 1;
                    } else if code == Some(OVERLOADED) {
                        t.overloaded += 1;
                    } else {
                        t.other_errors += 1;
                    }
                }
                let never = (1..=n)
                    .filter(|&i| sent[i].load(Relaxed) != 0 && !answered[i])
                    .count();
                t.timed_out += never as u64;
                t
            })
        };
        let mut s = s;
        let mut f = frame;
        let gap = Duration::from_secs(1) / rate;
        let mut sent_count = 0u64;
        for i in 1..=n {
            let intended = gap * (i as u32 - 1);
            if let Some(wait) = intended.checked_sub(t0.elapsed()) {
                std::thread::sleep(wait);
            }
            sent[i].store(intended.as_micros() as u64 + 1, Relaxed);
            f[2..4].copy_from_slice(&(i as i16).to_be_bytes());
            if s.write_all(&f).is_err() {
                break;
            }
            sent_count += 1;
        }
        let mut t = answers.join().unwrap();
        t.sent = sent_count;
        t
    })
}

/// A second client polls the node while it is flooded: a heartbeat (OPTIONS) and a read,
/// every 100 ms. Returns (answers, the slowest answer, results among the reads).
fn poll_while_flooded(addr: SocketAddr, load: Duration) -> (u32, Duration, u32) {
    let mut s = connect(addr);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let (mut answers, mut slowest, mut results) = (0, Duration::ZERO, 0);
    let t0 = Instant::now();
    let mut stream = 10i16;
    while t0.elapsed() < load {
        stream += 2;
        let t = Instant::now();
        let mut both = frame(4, stream, 0x05, &[]);
        both.extend(query(stream + 1, "SELECT v FROM ks.t WHERE k = 1"));
        s.write_all(&both).unwrap();
        for _ in 0..2 {
            let (st, op, code, _) = read_frame(&mut s).expect("the second client is answered");
            if st == stream {
                assert_eq!(op, 0x06, "SUPPORTED");
            } else {
                assert!(op == 0x08 || code == Some(OVERLOADED), "{op} {code:?}");
                results += u32::from(op == 0x08);
            }
            answers += 1;
        }
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    (answers, slowest, results)
}

/// Closed-loop: how many of these requests the node serves per second, 6 in flight.
fn batches_per_second(s: &mut TcpStream, frame: &[u8]) -> f64 {
    let mut f = frame.to_vec();
    let send = |s: &mut TcpStream, f: &mut Vec<u8>, stream: i16| {
        f[2..4].copy_from_slice(&stream.to_be_bytes());
        s.write_all(f).unwrap();
    };
    for stream in 100..106 {
        send(s, &mut f, stream);
    }
    let t0 = Instant::now();
    let mut done = 0u32;
    while t0.elapsed() < Duration::from_secs(1) {
        let (stream, op, _, _) = read_frame(s).expect("answer");
        done += u32::from(op == 0x08);
        send(s, &mut f, stream);
    }
    for _ in 0..6 {
        read_frame(s).expect("answer");
    }
    f64::from(done) / t0.elapsed().as_secs_f64()
}

/// Past the CPU capacity of its one shard, with no artificial slowness: 100-row batches sent
/// open-loop on four connections at four times what the shard executes (measured first). The excess
/// must come back as fast `Overloaded` answers, not as client timeouts (requests left unread
/// in the socket, or read and queued where admission does not look), and a second client
/// keeps being answered.
#[test]
fn past_cpu_capacity_the_excess_gets_overloaded_not_client_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("db"), 1, &["--durability", "periodic"]);
    let mut setup = connect(node.addr);
    schema(&mut setup);
    let rows: String = (0..100)
        .map(|i| format!("INSERT INTO ks.t (k, v) VALUES ({i}, {i}); "))
        .collect();
    let text = format!("BEGIN UNLOGGED BATCH {rows}APPLY BATCH");
    // The statement cache prepares the text once; each request then writes 100 rows.
    assert_eq!(
        run(&mut setup, 5, &text).1,
        None,
        "the batch itself is valid"
    );
    let batch = query(0, &text);

    let capacity = batches_per_second(&mut setup, &batch);
    // Four connections offer four times that, open-loop (bounded by the stream ids).
    let rate = (capacity as u32).clamp(25, 5_000); // per connection
    let (load, timeout) = (Duration::from_secs(6), Duration::from_secs(2));
    let floods: Vec<_> = (0..4)
        .map(|_| flood(node.addr, batch.clone(), rate, load, timeout))
        .collect();
    let (answers, slowest, results) = poll_while_flooded(node.addr, load);
    let t = floods
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold(Tally::default(), |a, b| Tally {
            sent: a.sent + b.sent,
            served: a.served + b.served,
            overloaded: a.overloaded + b.overloaded,
            other_errors: a.other_errors + b.other_errors,
            timed_out: a.timed_out + b.timed_out,
        });
    eprintln!(
        "capacity {capacity:.0} batches/s, offered 4 x {rate}/s: {t:?}; second client: \
         {answers} answers, slowest {slowest:?}, {results} reads served"
    );
    assert!(
        t.sent >= 4 * 6 * u64::from(rate) * 9 / 10,
        "the clients could send: {t:?}"
    );
    assert!(t.served >= 50, "work still gets done: {t:?}");
    assert!(
        t.overloaded * 5 >= t.sent,
        "the excess is turned away: {t:?}"
    );
    assert!(
        t.timed_out * 20 <= t.sent,
        "client timeouts stay a small share: {t:?}"
    );
    assert!(slowest < timeout, "the second client waited {slowest:?}");
    assert!(answers >= 20, "{answers}");
    let m = node.metric("sluice_rejected_total", &[("reason", "overloaded")]);
    assert!(m >= t.overloaded as f64, "metric {m} >= {}", t.overloaded);
}
