//! `sluice cluster --nodes N`: a local cluster in one command. Node k runs as a child
//! `sluice serve` on 127.0.0.k with the same ports on every IP (as ccm lays out Cassandra),
//! node 1 starts the cluster and the others join through it. Ctrl-C or SIGTERM stops them
//! all; a child also dies with this process (`PR_SET_PDEATHSIG`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

/// Most nodes one command starts (127.0.0.1 ..= 127.0.0.MAX_NODES).
const MAX_NODES: u8 = 32;
/// Bound on one node's start, including its join.
const NODE_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on one node's orderly stop before it is killed.
const NODE_STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Options of `sluice cluster`.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Number of nodes, on 127.0.0.1 .. 127.0.0.N.
    #[arg(long, default_value_t = 3)]
    pub nodes: u8,
    /// Directory of the nodes' data and logs (node1/, node1.log, ...); a new temporary
    /// directory, removed on exit, by default.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Shards of each node.
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    /// CQL port of every node.
    #[arg(long, default_value_t = 9042)]
    pub cql_port: u16,
    /// Shard-aware port of every node.
    #[arg(long, default_value_t = 19042)]
    pub shard_aware_port: u16,
    /// Internode port of every node.
    #[arg(long, default_value_t = 7000)]
    pub internode_port: u16,
    /// Metrics port of every node, or "off".
    #[arg(long, default_value = "9180")]
    pub metrics_port: String,
    /// Tokens of each node.
    #[arg(long, default_value_t = 16)]
    pub num_tokens: usize,
    /// Extra options passed to every `sluice serve` (e.g. `--serve-arg=--durability=periodic`).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
}

/// One child node.
struct LocalNode {
    ip: IpAddr,
    child: Child,
}

/// The address of node `index` (1-based).
fn node_ip(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, index))
}

/// Starts the nodes one after another, prints how to connect, and stops them on a signal
/// or when one of them exits.
pub fn run(args: ClusterArgs, exe: &Path) -> Result<()> {
    if !(1..=MAX_NODES).contains(&args.nodes) {
        bail!("--nodes must be between 1 and {MAX_NODES}");
    }
    let (dir, temporary) = match &args.dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("sluice-cluster-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut nodes: Vec<LocalNode> = Vec::with_capacity(usize::from(args.nodes));
    let started = start_all(&args, exe, &dir, &mut nodes);
    let outcome = started.and_then(|()| {
        let first = node_ip(1);
        println!(
            "{} nodes up on 127.0.0.1 .. 127.0.0.{} (data and logs in {})",
            args.nodes,
            args.nodes,
            dir.display()
        );
        println!("connect with: cqlsh {first} {}", args.cql_port);
        println!("Ctrl-C stops the cluster");
        wait_for_signal_or_exit(&mut nodes)
    });
    stop_all(&mut nodes);
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome
}

/// Starts the nodes whose data directories exist all at once (a restarted group needs a
/// quorum of them before any can serve), then the new ones one after another (each joins
/// through node 1 once the one before it serves).
fn start_all(args: &ClusterArgs, exe: &Path, dir: &Path, nodes: &mut Vec<LocalNode>) -> Result<()> {
    let (existing, new): (Vec<u8>, Vec<u8>) =
        (1..=args.nodes).partition(|index| dir.join(format!("node{index}")).exists());
    for index in &existing {
        nodes.push(spawn_node(args, exe, dir, *index)?);
    }
    for (node, index) in nodes.iter_mut().zip(&existing) {
        wait_until_serving(node, args.cql_port).with_context(|| {
            format!(
                "node {index} did not restart; see {}",
                log_path(dir, *index).display()
            )
        })?;
    }
    for index in new {
        nodes.push(spawn_node(args, exe, dir, index)?);
        let node = nodes.last_mut().context("just pushed")?;
        wait_until_serving(node, args.cql_port).with_context(|| {
            format!(
                "node {index} did not start; see {}",
                log_path(dir, index).display()
            )
        })?;
    }
    Ok(())
}

fn log_path(dir: &Path, index: u8) -> PathBuf {
    dir.join(format!("node{index}.log"))
}

/// Spawns node `index` (1-based): on 127.0.0.index, joining through node 1 unless it is node 1.
fn spawn_node(args: &ClusterArgs, exe: &Path, dir: &Path, index: u8) -> Result<LocalNode> {
    let seed = SocketAddr::new(node_ip(1), args.internode_port);
    let ip = node_ip(index);
    let data_dir = dir.join(format!("node{index}"));
    let log_path = log_path(dir, index);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let mut command = Command::new(exe);
    command
        .arg("serve")
        .arg("--listen")
        .arg(SocketAddr::new(ip, args.cql_port).to_string())
        .arg("--shard-aware-port")
        .arg(args.shard_aware_port.to_string())
        .arg("--internode-listen")
        .arg(SocketAddr::new(ip, args.internode_port).to_string())
        .arg("--metrics-listen")
        .arg(match args.metrics_port.as_str() {
            "off" => "off".to_owned(),
            port => format!("{ip}:{port}"),
        })
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--shards")
        .arg(args.shards.to_string())
        .arg("--num-tokens")
        .arg(args.num_tokens.to_string());
    if index > 1 {
        command.arg("--seeds").arg(seed.to_string());
    }
    command
        .args(&args.serve_args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("log file")?)
        .stderr(log);
    die_with_parent(&mut command);
    let child = command
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    eprintln!(
        "node {index}: starting on {ip} (log {})",
        log_path.display()
    );
    Ok(LocalNode { ip, child })
}

/// Children get SIGTERM when this process dies, however it dies.
#[cfg(target_os = "linux")]
fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the forked child.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_command: &mut Command) {}

/// Waits until the node accepts CQL connections, or fails if it exits or takes too long.
fn wait_until_serving(node: &mut LocalNode, cql_port: u16) -> Result<()> {
    let deadline = Instant::now() + NODE_START_TIMEOUT;
    let addr = SocketAddr::new(node.ip, cql_port);
    while Instant::now() < deadline {
        if let Some(status) = node.child.try_wait()? {
            bail!("it exited ({status})");
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("its CQL port {addr} was not open within {NODE_START_TIMEOUT:?}")
}

/// Returns on SIGINT or SIGTERM (Ok) or when a node exits on its own (Err).
fn wait_for_signal_or_exit(nodes: &mut [LocalNode]) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot install the SIGTERM handler")?;
        let mut poll = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                r = tokio::signal::ctrl_c() => {
                    r.context("cannot wait for SIGINT")?;
                    return Ok(());
                }
                _ = term.recv() => return Ok(()),
                _ = poll.tick() => {
                    for node in nodes.iter_mut() {
                        if let Some(status) = node.child.try_wait()? {
                            bail!("the node on {} exited ({status}); stopping the others", node.ip);
                        }
                    }
                }
            }
        }
    })
}

/// SIGTERM to every node still running, then waits for each; kills one that overstays.
fn stop_all(nodes: &mut [LocalNode]) {
    for node in nodes.iter_mut() {
        if matches!(node.child.try_wait(), Ok(None)) {
            if let Ok(pid) = libc::pid_t::try_from(node.child.id()) {
                // SAFETY: kill(2) on our own child's pid has no memory effects.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
        }
    }
    let deadline = Instant::now() + NODE_STOP_TIMEOUT;
    for node in nodes.iter_mut() {
        loop {
            match node.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    eprintln!("the node on {} did not stop in time; killing it", node.ip);
                    let _ = node.child.kill();
                    let _ = node.child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}
