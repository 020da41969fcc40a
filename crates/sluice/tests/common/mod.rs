//! Shared harness of the integration tests: starts the real `sluice` binary on free local
//! ports with a temporary data directory and stops it (SIGKILL) when dropped, reads its
//! metrics, connects `scylla` sessions, and builds CQL v4 request frames (with the protocol
//! crate's codec, or from raw bytes for malformed input).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod certs;
pub mod cluster;
mod ports;

use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use sluice_protocol::{Compression, Request};

/// A running node.
pub struct Node {
    /// The process.
    pub child: Child,
    /// CQL address.
    pub addr: SocketAddr,
    /// Shard-aware port.
    pub shard_aware_port: u16,
    /// Metrics address.
    pub metrics: SocketAddr,
    /// Shards.
    pub shards: usize,
    /// Data directory (kept by the caller's TempDir).
    pub data_dir: PathBuf,
}

pub use ports::free_port;

impl Node {
    /// Starts a node on `data_dir` and waits until it accepts connections on every port; picks
    /// new ports and tries again (up to 5 times) if one was taken meanwhile.
    pub fn start(data_dir: &Path, shards: usize, extra: &[&str]) -> Node {
        for _ in 0..5 {
            let mut node = Node::spawn(data_dir, shards, extra);
            match node.wait_ready() {
                Ok(()) => return node,
                Err(log) if log.contains("in use") => {
                    if log.contains("internode listener") {
                        let _ = std::fs::remove_file(internode_port_file(data_dir));
                    }
                    continue;
                }
                Err(log) => panic!("sluice exited early: {log}"),
            }
        }
        panic!("sluice could not bind free ports in 5 tries")
    }

    fn spawn(data_dir: &Path, shards: usize, extra: &[&str]) -> Node {
        let mut cluster_args = Vec::new();
        if !extra.contains(&"--internode-listen") {
            cluster_args.push("--internode-listen".to_owned());
            cluster_args.push(format!("127.0.0.1:{}", internode_port(data_dir)));
        }
        let port = free_port();
        let sa_port = free_port();
        let m_port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{m_port}").parse().unwrap();
        let log = std::fs::File::create(data_dir.with_extension("log")).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--shards")
            .arg(shards.to_string())
            .arg("--shard-aware-port")
            .arg(sa_port.to_string())
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--log")
            .arg("warn")
            .args(&cluster_args)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sluice");
        Node {
            child,
            addr,
            shard_aware_port: sa_port,
            metrics,
            shards,
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// Ready once the CQL, shard-aware and metrics ports all accept; Err(log) if it exited.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let sa = SocketAddr::new(self.addr.ip(), self.shard_aware_port);
        let accepts =
            |a: &SocketAddr| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok();
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("({status}) {}", self.log()));
            }
            if [self.addr, sa, self.metrics].iter().all(accepts) {
                // A port it failed to bind makes it exit right after binding the others.
                std::thread::sleep(Duration::from_millis(20));
                if let Ok(Some(status)) = self.child.try_wait() {
                    return Err(format!("({status}) {}", self.log()));
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
        panic!("sluice did not listen within 30 s: {}", self.log());
    }

    /// The server's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.data_dir.with_extension("log")).unwrap_or_default()
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, no shutdown of any kind.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").arg("-TERM").arg(&pid).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
        panic!("sluice did not stop within 30 s of SIGTERM");
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics_text(&self) -> String {
        let mut s =
            TcpStream::connect_timeout(&self.metrics, Duration::from_secs(5)).expect("metrics");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Sum of a metric's samples whose labels contain every `label="value"` given.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_sum(&self.metrics_text(), name, labels)
    }

    /// The metric's value per shard.
    pub fn metric_per_shard(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let text = self.metrics_text();
        (0..self.shards)
            .map(|s| {
                let shard = s.to_string();
                let mut l = labels.to_vec();
                l.push(("shard", &shard));
                metric_sum(&text, name, &l)
            })
            .collect()
    }
}

/// Where a data directory's internode port is kept: a node restarted on its data directory
/// must come back on the internode address its cluster knows.
fn internode_port_file(data_dir: &Path) -> PathBuf {
    data_dir.with_extension("internode-port")
}

/// The internode port of the node on `data_dir`: the one it used before, or a new free one.
fn internode_port(data_dir: &Path) -> u16 {
    let file = internode_port_file(data_dir);
    if let Some(port) = std::fs::read_to_string(&file)
        .ok()
        .and_then(|text| text.trim().parse().ok())
    {
        return port;
    }
    let port = free_port();
    std::fs::write(&file, port.to_string()).expect("internode port file");
    port
}

/// Sums the samples of `name` that carry every label given.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A driver session to `node`, with a generous connection timeout for slow CI machines.
pub async fn connect(node: &Node) -> Session {
    cluster::build_with_metadata(
        SessionBuilder::new()
            .known_node(node.addr.to_string())
            .connection_timeout(Duration::from_secs(20)),
    )
    .await
}

/// `CREATE KEYSPACE IF NOT EXISTS ks` with SimpleStrategy and one replica.
pub async fn create_keyspace(session: &Session, ks: &str) {
    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = \
                 {{'class': 'SimpleStrategy', 'replication_factor': 1}}"
            ),
            &[],
        )
        .await
        .unwrap();
}

/// A frame with any header bytes followed by `body`, for the malformed input the protocol
/// codec cannot express (other versions, unknown or response opcodes, lying lengths).
pub fn frame(version: u8, stream: i16, opcode: u8, body: &[u8]) -> Vec<u8> {
    let mut f = vec![version, 0];
    f.extend_from_slice(&stream.to_be_bytes());
    f.push(opcode);
    f.extend_from_slice(&(body.len() as u32).to_be_bytes());
    f.extend_from_slice(body);
    f
}

/// A v4 STARTUP frame on stream 1 asking for CQL 3.0.0.
pub fn startup() -> Vec<u8> {
    Request::startup(Compression::None).to_frame(1).to_vec()
}

/// A v4 QUERY frame for `text` at consistency ONE (raw bytes, so that invalid UTF-8 can be
/// sent).
pub fn query(stream: i16, text: impl AsRef<[u8]>) -> Vec<u8> {
    Request::query(text.as_ref().to_vec())
        .to_frame(stream)
        .to_vec()
}

/// One answer: (stream, opcode, error code if ERROR, body); `None` once the socket fails.
pub fn read_frame(s: &mut TcpStream) -> Option<(i16, u8, Option<u32>, Vec<u8>)> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).ok()?;
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    let code =
        (h[4] == 0 && len >= 4).then(|| u32::from_be_bytes([body[0], body[1], body[2], body[3]]));
    Some((i16::from_be_bytes([h[2], h[3]]), h[4], code, body))
}
