//! Starts the real `sluice` binary on free local ports with a temporary data directory and
//! stops it (SIGKILL) when dropped.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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

/// A free TCP port on 127.0.0.1 (racy by nature, good enough for tests).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

impl Node {
    /// Starts a node on `data_dir` and waits until it accepts connections.
    pub fn start(data_dir: &Path, shards: usize, extra: &[&str]) -> Node {
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
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sluice");
        let mut node = Node {
            child,
            addr,
            shard_aware_port: sa_port,
            metrics,
            shards,
            data_dir: data_dir.to_path_buf(),
        };
        node.wait_ready();
        node
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sluice exited early ({status}): {}", self.log());
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
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
