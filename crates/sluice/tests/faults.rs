//! `sluice bench faults` against `sluice cluster --nodes 3`, with the SIGSTOP fault only and a
//! few seconds per phase: the tool's mechanics, not the cluster's performance. The phases are
//! present and contiguous, every scheduled request is counted in exactly one place, the stop
//! shows in the stopped phase, and with no node killed no acknowledged write is lost.
//!
//! The keyspace has replication factor 1 and the driver is token-aware, so that every key has
//! one owner whichever node coordinates; the test holds both before and after coordinators
//! replicate.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::{LocalCluster, Ports};

const NODES: u8 = 3;
/// Bound on the bench run: 2 s before, 2 s stopped, 2 s after, the set-up and the final reads.
const BENCH_TIMEOUT: Duration = Duration::from_secs(120);

/// Kills the process on drop (the cluster takes its nodes with it).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pid of the process whose command line has `--data-dir data_dir`.
fn pid_of_node(data_dir: &Path) -> Option<u32> {
    let want = data_dir.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        if argv
            .windows(2)
            .any(|w| w[0] == "--data-dir" && w[1] == want)
        {
            return Some(pid);
        }
    }
    None
}

fn logs(dir: &Path) -> String {
    let mut text = String::new();
    for name in [
        "cluster.out",
        "node1.log",
        "node2.log",
        "node3.log",
        "bench.err",
    ] {
        text += &format!(
            "\n--- {name}\n{}",
            std::fs::read_to_string(dir.join(name)).unwrap_or_default()
        );
    }
    text
}

fn num(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn bench_faults_counts_every_request_through_a_sigstop() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ports = Ports::free_on(NODES);
    let cluster = LocalCluster::start(dir.path(), NODES, ports, "cluster.out", &[]);
    let node2 = dir.path().join("node2");
    let pid = pid_of_node(&node2).expect("the pid of node 2");
    let nodes: Vec<String> = (1..=NODES).map(|k| ports.cql_of(k).to_string()).collect();
    let json: PathBuf = dir.path().join("faults.json");
    let mut bench = Command::new(env!("CARGO_BIN_EXE_sluice"));
    bench
        .args(["bench", "faults", "--nodes", &nodes.join(",")])
        .args(["--fault-pid", &pid.to_string(), "--faults", "stop"])
        .args([
            "--fault-warm-up",
            "1s",
            "--fault-hold",
            "2s",
            "--phase",
            "2s",
        ])
        .args(["--rate", "200", "--partitions", "200"])
        .args(["--replication-factor", "1", "--connections", "1"])
        .arg("--json")
        .arg(&json)
        .arg("--quiet")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.path().join("bench.err")).unwrap());
    let child = bench.spawn().expect("start sluice bench");
    let mut child = Killed(child);
    let ran = Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st;
        }
        if ran.elapsed() > BENCH_TIMEOUT {
            // A node left stopped would hang the cluster's stop.
            sigcont(pid);
            panic!(
                "sluice bench faults ran over {BENCH_TIMEOUT:?}: {}",
                logs(dir.path())
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut stdout = String::new();
    use std::io::Read;
    let _ = child.0.stdout.take().unwrap().read_to_string(&mut stdout);
    assert!(status.success(), "{status}: {stdout}{}", logs(dir.path()));
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).unwrap();

    let phases = r["phases"].as_array().expect("phases");
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["warm-up", "before", "stop: stopped", "stop: after"],
        "{stdout}"
    );
    let spans = r["spans"].as_array().expect("spans");
    for w in spans.windows(2) {
        assert_eq!(num(&w[0], "end_us"), num(&w[1], "start_us"), "contiguous");
    }
    let stopped_us = num(&spans[2], "end_us") - num(&spans[2], "start_us");
    assert!(stopped_us >= 2_000_000, "stopped for {stopped_us} us");

    let mut offered = 0;
    for p in phases {
        let errors: u64 = p["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[1].as_u64().unwrap())
            .sum();
        assert_eq!(
            num(p, "ok") + num(p, "late") + errors,
            num(p, "offered"),
            "{p}"
        );
        assert!(num(p, "reads_ok") <= num(p, "ok") + num(p, "late"));
        offered += num(p, "offered");
    }
    assert_eq!(
        offered + num(&r, "outside_phases"),
        num(&r, "scheduled"),
        "every scheduled request is in exactly one place"
    );
    // 200/s over 1 s of warm-up and three phases of at least 2 s.
    assert!(num(&r, "scheduled") >= 1350, "{}", r["scheduled"]);
    assert!(num(&phases[1], "ok") > 0, "{stdout}");
    // About a third of the keys live on the stopped node: their requests cannot succeed in time.
    assert!(
        num(&phases[2], "ok") < num(&phases[2], "offered"),
        "the stop did not show: {stdout}"
    );
    assert_eq!(
        r["goodput_per_second"].as_array().unwrap().len() as u64,
        num(&spans[3], "end_us").div_ceil(1_000_000)
    );

    let finals = r["finals"].as_array().expect("finals");
    assert_eq!(finals.len(), 2);
    for f in finals {
        assert!(num(f, "keys") > 0, "{f}");
        assert_eq!(num(f, "lost"), 0, "no node was killed: {stdout}");
        assert_eq!(num(f, "unreadable"), 0, "{stdout}");
    }
    assert_eq!(r["node_restarted"], false);
    assert_eq!(num(&r, "node_pid_at_end"), u64::from(pid));
    assert!(
        stdout.contains("PASS no acknowledged write lost"),
        "{stdout}"
    );
    drop(child);
    drop(cluster);
}

/// SIGCONT, so that a node the bench left stopped can be killed.
fn sigcont(pid: u32) {
    let _ = Command::new("kill")
        .args(["-CONT", &pid.to_string()])
        .status();
}
