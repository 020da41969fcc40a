//! Backpressure end to end (issue 4, step 1): with a tiny per-connection in-flight cap, a
//! client that pipelines far more requests than the cap gets every one answered; the
//! server stops reading its socket instead of rejecting (no `Overloaded`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use sluice_server::{Server, ServerConfig};

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

fn query(stream: i16, text: &str) -> Vec<u8> {
    let mut body = (text.len() as u32).to_be_bytes().to_vec();
    body.extend_from_slice(text.as_bytes());
    body.extend_from_slice(&[0, 1, 0]);
    frame(stream, 0x07, &body)
}

fn read_frame(s: &mut TcpStream) -> (i16, u8) {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize];
    s.read_exact(&mut body).unwrap();
    (i16::from_be_bytes([h[2], h[3]]), h[4])
}

#[test]
fn over_the_in_flight_cap_the_socket_waits_and_nothing_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let storage = sluice_storage::Storage::open(sluice_storage::StorageConfig {
        path: dir.path().join("db"),
        durability: sluice_storage::Durability::Periodic {
            interval: Duration::from_secs(1),
        },
        cache_bytes: 8 << 20,
    })
    .unwrap();
    let host = uuid::Uuid::new_v4();
    let info = sluice_engine::NodeInfo::single([127, 0, 0, 1].into(), 9042, host);
    let engine = sluice_engine::Engine::open(storage.clone(), info).unwrap();
    let mut config = ServerConfig::new("127.0.0.1:0".parse().unwrap(), 1, host.to_string());
    config.max_inflight_per_connection = 4;
    let server = Server::start(config, engine).unwrap();

    let mut s = TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut body = vec![0, 1];
    body.extend(string("CQL_VERSION"));
    body.extend(string("3.0.0"));
    s.write_all(&frame(0, 0x01, &body)).unwrap();
    assert_eq!(read_frame(&mut s), (0, 0x02), "READY");

    let mut batch = Vec::new();
    for stream in 1..=200i16 {
        batch.extend(query(stream, "SELECT * FROM system_schema.columns"));
    }
    s.write_all(&batch).unwrap();
    let mut answered = std::collections::HashSet::new();
    for _ in 0..200 {
        let (stream, opcode) = read_frame(&mut s);
        assert_eq!(opcode, 0x08, "stream {stream} answered with a result");
        answered.insert(stream);
    }
    assert_eq!(answered.len(), 200, "every stream answered exactly once");
    let m = &server.metrics()[0];
    assert!(
        m.backpressure_pauses.load(Relaxed) > 0,
        "the reader waited for in-flight slots"
    );
    assert_eq!(
        m.errors_with_code(0x1001),
        0,
        "backpressure, not Overloaded"
    );
    drop(s);
    server.shutdown();
    storage.close().unwrap();
}
