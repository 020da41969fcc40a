//! The raw client against the real `sluice` binary (2 shards, loopback, temporary data dir):
//! every write and read succeeds, every connection sits on the shard it was opened for, and
//! every EXECUTE reaches the shard that owns its partition (the server's own per-shard
//! counters agree, and it forwarded nothing). The runner's own path through the client
//! (queued tickets, one flush per burst) accounts for every request of a short step.
//!
//! The binary is `$SLUICE_BIN`, else `sluice` beside this test's target directory (build it
//! first with `cargo build -p sluice`, as scripts/test.sh does).

use sluice_bench::driver::{Connection, DriverOptions, RetryMode, KEYSPACE};
use sluice_bench::raw::RawTarget;
use sluice_bench::runner::{run_step, RunConfig, StreamSpec};
use sluice_bench::schedule::Arrival;
use sluice_bench::target::{populate, KeyDist, Op, OpKind, Reply, Target};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SHARDS: usize = 2;
const PER_SHARD: usize = 2;
const PARTITIONS: i64 = 1000;
const ROWS: i32 = 3;

#[path = "../../sluice/tests/common/ports.rs"]
mod ports;
mod support;
use ports::free_port;
use support::sluice_bin;

/// A running node, killed when dropped.
struct Node {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
    log: PathBuf,
}

impl Node {
    /// Starts a node; picks new ports and tries again (up to 5 times) if one was taken.
    fn start(dir: &Path, shard_aware: bool) -> Node {
        // Kept across tries unless it was the one taken: the cluster knows the node there.
        let mut internode_port = free_port();
        for _ in 0..5 {
            match Node::try_start(dir, shard_aware, internode_port) {
                Ok(node) => return node,
                Err(log) if log.contains("in use") => {
                    if log.contains("internode listener") {
                        internode_port = free_port();
                    }
                    continue;
                }
                Err(log) => panic!("sluice exited: {log}"),
            }
        }
        panic!("sluice could not bind free ports in 5 tries")
    }

    fn try_start(dir: &Path, shard_aware: bool, internode_port: u16) -> Result<Node, String> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = dir.join("sluice.log");
        let mut cmd = Command::new(sluice_bin());
        cmd.arg("serve")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--shards")
            .arg(SHARDS.to_string())
            .arg("--metrics-listen")
            .arg(metrics.to_string())
            .arg("--internode-listen")
            .arg(format!("127.0.0.1:{internode_port}"))
            // Correctness, not overload: a debug build sheds a closed loop of 128 otherwise.
            .arg("--admission")
            .arg("off")
            .arg("--log")
            .arg("warn");
        match shard_aware {
            true => cmd.arg("--shard-aware-port").arg(free_port().to_string()),
            false => cmd.arg("--shard-aware-port").arg("off"),
        };
        let child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start sluice");
        let mut node = Node {
            child,
            addr,
            metrics,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(st)) = node.child.try_wait() {
                return Err(format!("({st}) {}", node.log()));
            }
            let accepts =
                |a: &SocketAddr| TcpStream::connect_timeout(a, Duration::from_millis(200)).is_ok();
            if accepts(&addr) && accepts(&metrics) {
                // A port it failed to bind makes it exit right after binding the others.
                std::thread::sleep(Duration::from_millis(20));
                if let Ok(Some(st)) = node.child.try_wait() {
                    return Err(format!("({st}) {}", node.log()));
                }
                return Ok(node);
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not listen within 30 s: {}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Per shard, the sum of `name`'s samples carrying `label` (all samples if empty).
    fn per_shard(&self, name: &str, label: &str) -> Vec<u64> {
        let text = support::metrics_text(self.metrics);
        (0..SHARDS)
            .map(|shard| {
                let tag = format!("shard=\"{shard}\"");
                text.lines()
                    .filter(|l| l.starts_with(&format!("{name}{{")))
                    .filter(|l| l.contains(&tag) && l.contains(label))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>() as u64
            })
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes, reads and checks routing against a fresh two-shard node.
async fn exercise(shard_aware: bool) {
    let dir = tempfile::tempdir().expect("temp dir");
    let node = Node::start(dir.path(), shard_aware);
    let nodes = vec![node.addr.to_string()];
    let opts = DriverOptions {
        nodes: nodes.clone(),
        connections: 1,
        client_timeout: Duration::from_secs(10),
        retry: RetryMode::None,
        retries: 0,
        credentials: None,
        ..DriverOptions::new(Vec::new(), 1, Duration::from_secs(10))
    };
    // The driver's 5 s connect timeout can pass on a loaded 2-core machine: try again.
    let mut conn = Connection::open(&opts).await;
    for _ in 0..2 {
        if conn.is_ok() {
            break;
        }
        conn = Connection::open(&opts).await;
    }
    let conn = conn.unwrap_or_else(|e| panic!("driver session: {e:#}\n{}", node.log()));
    conn.create_table("kv", true).await.expect("table");

    let (target, notes) = RawTarget::connect(&nodes, PER_SHARD, "kv", None)
        .await
        .expect("raw client");
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(target.nr_shards() as usize, SHARDS);
    let conns = target.connections();
    assert_eq!(conns.len(), SHARDS * PER_SHARD);
    for c in conns {
        assert_eq!(c.reported, Some(c.meant), "{c:?}");
        if shard_aware {
            assert_eq!(c.local_port as usize % SHARDS, c.meant as usize, "{c:?}");
        }
    }
    for shard in 0..SHARDS as u32 {
        assert_eq!(conns.iter().filter(|c| c.meant == shard).count(), PER_SHARD);
    }
    let describe = target.describe();
    let how = if shard_aware {
        "shard-aware port"
    } else {
        "main port"
    };
    assert!(describe.contains(how), "{describe}");

    let executes = |n: &Node| n.per_shard("sluice_requests_total", "opcode=\"execute\"");
    let forwards = |n: &Node| n.per_shard("sluice_cross_shard_forwards_total", "");
    let (exec_before, fwd_before) = (executes(&node), forwards(&node));

    let target = Arc::new(target);
    let failed = populate(&target, 0..PARTITIONS, ROWS).await;
    assert_eq!(failed, 0, "writes failed");
    let mut reads = tokio::task::JoinSet::new();
    for pk in 0..PARTITIONS {
        let t = target.clone();
        reads.spawn(async move {
            t.execute(Op {
                kind: OpKind::Read,
                pk,
                ck: 0,
            })
            .await
        });
    }
    let mut replies = Vec::new();
    while let Some(r) = reads.join_next().await {
        replies.push(r.expect("read task"));
    }
    assert!(replies.iter().all(|r| *r == Reply::Ok), "a read failed");

    // Every op was counted once, on the shard that owns its partition...
    let total = (PARTITIONS as u64) * (ROWS as u64 + 1);
    assert_eq!(target.attempts(), Some(total));
    let mut want = vec![0u64; SHARDS];
    for pk in 0..PARTITIONS {
        want[target.shard_of(pk)] += ROWS as u64 + 1;
    }
    assert_eq!(target.routed(), want);
    assert!(want.iter().all(|n| *n > 0), "both shards own partitions");
    // ...and the server saw each EXECUTE on that shard, and forwarded none.
    let exec: Vec<u64> = executes(&node)
        .iter()
        .zip(&exec_before)
        .map(|(a, b)| a - b)
        .collect();
    assert_eq!(exec, want, "server-side EXECUTEs per shard");
    let fwd: u64 = forwards(&node)
        .iter()
        .zip(&fwd_before)
        .map(|(a, b)| a - b)
        .sum();
    assert_eq!(fwd, 0, "cross-shard forwards");

    // The bound values landed where they should: the driver reads them back.
    let rows = conn
        .session
        .query_unpaged(format!("SELECT ck, v FROM {KEYSPACE}.kv WHERE pk = 7"), ())
        .await
        .expect("select")
        .into_rows_result()
        .expect("rows");
    let rows: Vec<(i32, Vec<u8>)> = rows
        .rows::<(i32, Vec<u8>)>()
        .expect("typed rows")
        .collect::<Result<_, _>>()
        .expect("decode");
    assert_eq!(rows.len(), ROWS as usize);
    assert!(rows
        .iter()
        .enumerate()
        .all(|(i, (ck, v))| *ck == i as i32 && v.len() == sluice_bench::driver::VALUE_LEN));

    // One second of the runner at 2,000 requests/s, half reads, half writes: every request
    // goes out once and comes back a success (generous limits: this is not a speed test).
    let cfg = RunConfig {
        arrival: Arrival::Constant,
        deadline: Duration::from_secs(10),
        client_timeout: Duration::from_secs(10),
        lag_tolerance: Duration::from_secs(10),
        max_in_flight: 100_000,
        seed: 1,
        progress: false,
    };
    let stream = StreamSpec {
        rate: 2000.0,
        read_fraction: 0.5,
        keys: KeyDist::Uniform {
            partitions: PARTITIONS as u64,
        },
        rows: ROWS,
    };
    let run = run_step(&target, &[stream], Duration::from_secs(1), &cfg, 0).await;
    let c = run.totals[0].counts;
    assert_eq!((c.offered, c.sent, c.ok), (2000, 2000, 2000), "{c:?}");
    assert_eq!(c.completed(), 2000, "{c:?}");
    assert_eq!(run.attempts, Some(2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_client_routes_by_source_port_on_the_shard_aware_port() {
    tokio::time::timeout(Duration::from_secs(120), exercise(true))
        .await
        .expect("finished within 120 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_client_fills_every_shard_from_the_main_port() {
    tokio::time::timeout(Duration::from_secs(120), exercise(false))
        .await
        .expect("finished within 120 s");
}
