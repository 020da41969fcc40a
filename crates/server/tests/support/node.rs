//! A node (real engine on a temp-dir storage, real server on loopback) for the integration
//! tests that drive it with frames from the protocol crate's request codec.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sluice_protocol::{Compression, Request};
use sluice_server::{Server, ServerConfig};

/// The RESULT opcode.
pub const RESULT: u8 = 0x08;
/// The ERROR opcode.
pub const ERROR: u8 = 0x00;
/// The READY opcode.
pub const READY: u8 = 0x02;

/// A one-store node whose server runs with the default configuration changed by `config`.
pub struct TestNode {
    server: Option<Server>,
    storage: sluice_storage::Storage,
    _dir: tempfile::TempDir,
}

impl TestNode {
    /// Starts a node; `config` adjusts the server's configuration first.
    pub fn start(config: impl FnOnce(&mut ServerConfig)) -> TestNode {
        let dir = tempfile::tempdir().expect("tempdir");
        let storage = sluice_storage::Storage::open(sluice_storage::StorageConfig {
            path: dir.path().join("db"),
            durability: sluice_storage::Durability::Periodic {
                interval: Duration::from_secs(1),
            },
            cache_bytes: 8 << 20,
            stores: 1,
        })
        .expect("storage");
        let host = uuid::Uuid::new_v4();
        let info = sluice_engine::NodeInfo::single([127, 0, 0, 1].into(), 9042, host);
        let engine = sluice_engine::Engine::open(storage.clone(), info).expect("engine");
        let mut c = ServerConfig::new("127.0.0.1:0".parse().expect("addr"), 1, host.to_string());
        config(&mut c);
        let server = Server::start(c, engine, storage.ack_barrier()).expect("server");
        TestNode {
            server: Some(server),
            storage,
            _dir: dir,
        }
    }

    /// The running server.
    pub fn server(&self) -> &Server {
        self.server.as_ref().expect("running")
    }

    /// A connection past STARTUP (uncompressed).
    pub fn connect(&self) -> TcpStream {
        let mut s = TcpStream::connect(self.server().local_addr()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        s.write_all(&Request::startup(Compression::None).to_frame(0))
            .expect("write");
        assert_eq!(read_frame(&mut s).1, READY, "READY");
        s
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
        let _ = self.storage.close();
    }
}

/// A QUERY of `text` at consistency ONE on `stream`.
pub fn query(stream: i16, text: &str) -> Vec<u8> {
    Request::query(text.to_owned()).to_frame(stream).to_vec()
}

/// An UNLOGGED BATCH of text `statements` at consistency ONE on `stream`.
pub fn batch(stream: i16, statements: &[&str]) -> Vec<u8> {
    Request::unlogged_batch(statements)
        .to_frame(stream)
        .to_vec()
}

/// Reads one frame: its stream, opcode and body.
pub fn read_frame(s: &mut TcpStream) -> (i16, u8, Vec<u8>) {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).expect("frame header");
    let mut body = vec![0u8; u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize];
    s.read_exact(&mut body).expect("frame body");
    (i16::from_be_bytes([h[2], h[3]]), h[4], body)
}

/// Sends `request` and returns its answer's opcode and, for an error, its code.
pub fn ask(s: &mut TcpStream, request: &[u8]) -> (u8, Option<u32>) {
    s.write_all(request).expect("write");
    let (_, opcode, body) = read_frame(s);
    let code = (opcode == ERROR).then(|| u32::from_be_bytes([body[0], body[1], body[2], body[3]]));
    (opcode, code)
}
