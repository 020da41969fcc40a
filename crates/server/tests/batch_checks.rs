//! BATCH goes through the same checks as QUERY and EXECUTE: its `USING TIMEOUT` sets its
//! deadline, an expired batch is answered with a write timeout and is no latency sample for
//! the adaptive concurrency limit, and the rate limiter answers a limited batch with the
//! rate-limit error. Drives the real server over loopback with raw frames.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use sluice_server::{Server, ServerConfig};

const QUERY: u8 = 0x07;
const BATCH: u8 = 0x0D;
const RESULT: u8 = 0x08;
const ERROR: u8 = 0x00;

struct Node {
    server: Option<Server>,
    storage: sluice_storage::Storage,
    _dir: tempfile::TempDir,
}

impl Node {
    fn start() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let storage = sluice_storage::Storage::open(sluice_storage::StorageConfig {
            path: dir.path().join("db"),
            durability: sluice_storage::Durability::Periodic {
                interval: Duration::from_secs(1),
            },
            cache_bytes: 8 << 20,
            stores: 1,
        })
        .unwrap();
        let host = uuid::Uuid::new_v4();
        let info = sluice_engine::NodeInfo::single([127, 0, 0, 1].into(), 9042, host);
        let engine = sluice_engine::Engine::open(storage.clone(), info).unwrap();
        let config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 1, host.to_string());
        let server = Server::start(config, engine, storage.ack_barrier()).unwrap();
        Node {
            server: Some(server),
            storage,
            _dir: dir,
        }
    }

    fn server(&self) -> &Server {
        self.server.as_ref().unwrap()
    }

    fn connect(&self) -> TcpStream {
        let mut s = TcpStream::connect(self.server().local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut body = vec![0, 1];
        body.extend(string("CQL_VERSION"));
        body.extend(string("3.0.0"));
        s.write_all(&frame(0, 0x01, &body)).unwrap();
        assert_eq!(read_frame(&mut s).1, 0x02, "READY");
        s
    }

    fn latency_samples(&self) -> u64 {
        self.server().metrics()[0].latency_samples.load(Relaxed)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        let _ = self.storage.close();
    }
}

fn frame(stream: i16, opcode: u8, body: &[u8]) -> Vec<u8> {
    let mut f = vec![4, 0];
    f.extend_from_slice(&stream.to_be_bytes());
    f.push(opcode);
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(body);
    f
}

fn string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u16).to_be_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

fn long_string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

fn query(stream: i16, text: &str) -> Vec<u8> {
    let mut body = long_string(text);
    body.extend_from_slice(&[0, 1, 0]); // consistency ONE, no flags
    frame(stream, QUERY, &body)
}

/// An unlogged BATCH of text statements without values, at consistency ONE.
fn batch(stream: i16, statements: &[&str]) -> Vec<u8> {
    let mut body = vec![1];
    body.extend_from_slice(&(statements.len() as u16).to_be_bytes());
    for s in statements {
        body.push(0);
        body.extend(long_string(s));
        body.extend_from_slice(&0u16.to_be_bytes());
    }
    body.extend_from_slice(&[0, 1, 0]);
    frame(stream, BATCH, &body)
}

fn read_frame(s: &mut TcpStream) -> (i16, u8, Vec<u8>) {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize];
    s.read_exact(&mut body).unwrap();
    (i16::from_be_bytes([h[2], h[3]]), h[4], body)
}

/// Sends `request` and returns its answer's opcode and, for an error, its code.
fn ask(s: &mut TcpStream, request: &[u8]) -> (u8, Option<u32>) {
    s.write_all(request).unwrap();
    let (_, opcode, body) = read_frame(s);
    let code = (opcode == ERROR).then(|| u32::from_be_bytes([body[0], body[1], body[2], body[3]]));
    (opcode, code)
}

fn create(s: &mut TcpStream, ddl: &[&str]) {
    for (i, q) in ddl.iter().enumerate() {
        assert_eq!(ask(s, &query(i as i16 + 1, q)), (RESULT, None), "{q}");
    }
}

#[test]
fn an_expired_batch_is_a_write_timeout_and_no_latency_sample() {
    let node = Node::start();
    let mut s = node.connect();
    create(
        &mut s,
        &[
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ks.t (k int PRIMARY KEY, v int)",
        ],
    );
    let served = batch(
        20,
        &[
            "INSERT INTO ks.t (k, v) VALUES (1, 1)",
            "INSERT INTO ks.t (k, v) VALUES (2, 2)",
        ],
    );
    let samples = node.latency_samples();
    assert_eq!(ask(&mut s, &served), (RESULT, None), "a batch in time runs");
    assert_eq!(
        node.latency_samples(),
        samples + 1,
        "and is a latency sample"
    );

    // The smallest USING TIMEOUT among the statements is the batch's: zero has passed on
    // arrival.
    let expired = batch(
        21,
        &[
            "INSERT INTO ks.t (k, v) VALUES (3, 3) USING TIMEOUT 10s",
            "INSERT INTO ks.t (k, v) VALUES (4, 4) USING TIMEOUT 0ms",
        ],
    );
    let samples = node.latency_samples();
    for _ in 0..20 {
        assert_eq!(
            ask(&mut s, &expired),
            (ERROR, Some(0x1100)),
            "write timeout"
        );
    }
    assert_eq!(
        node.latency_samples(),
        samples,
        "an expired batch taught the concurrency limit a latency"
    );
    let m = &node.server().metrics()[0];
    assert_eq!(m.expired_before_execution.load(Relaxed), 20);
    assert_eq!(m.errors_with_code(0x1100), 20);
    // Nothing of the expired batches was written.
    let (opcode, _) = ask(&mut s, &query(30, "SELECT * FROM ks.t WHERE k = 4"));
    assert_eq!(opcode, RESULT);
}

#[test]
fn a_rate_limited_batch_is_answered_with_the_rate_limit_error() {
    let node = Node::start();
    let mut s = node.connect();
    create(
        &mut s,
        &[
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ks.t (k int PRIMARY KEY, v int) WITH per_partition_rate_limit = {'max_writes_per_second': 1}",
        ],
    );
    let limited = batch(40, &["INSERT INTO ks.t (k, v) VALUES (7, 1)"]);
    let samples = node.latency_samples();
    let mut answers = std::collections::HashMap::new();
    const N: usize = 50;
    for _ in 0..N {
        *answers.entry(ask(&mut s, &limited)).or_insert(0usize) += 1;
    }
    // Not negotiated at STARTUP: Config_error, which no default retry policy retries.
    let rejected = answers.get(&(ERROR, Some(0x2300))).copied().unwrap_or(0);
    let served = answers.get(&(RESULT, None)).copied().unwrap_or(0);
    assert_eq!(
        rejected + served,
        N,
        "only results and rate-limit errors: {answers:?}"
    );
    assert!(
        rejected >= N - 10,
        "the limiter turned batches away: {answers:?}"
    );
    let m = &node.server().metrics()[0];
    assert_eq!(m.rejected_rate_limited.load(Relaxed), rejected as u64);
    assert_eq!(
        node.latency_samples(),
        samples + served as u64,
        "only the batches that ran are latency samples"
    );
}
