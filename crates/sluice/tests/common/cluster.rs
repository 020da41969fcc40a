//! Multi-node harness: `sluice serve` processes on 127.0.0.x (each node on its own loopback
//! IP, every node on the same ports), and the `sluice cluster` launcher.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};

/// Bound on one node's start (a debug build on a shared machine, a join through the seed).
pub const NODE_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound on a whole `sluice cluster` start (several starts and joins on a debug build).
pub const CLUSTER_START_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on a clean exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The loopback IP of node `index` (1-based).
pub fn ip(index: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, index))
}

/// A port free on 127.0.0.1 up to 127.0.0.`ips` (each node binds the same port on its own IP).
pub fn port_free_on_all_ips(ips: u8) -> u16 {
    for _ in 0..100 {
        let port = super::free_port();
        if (1..=ips).all(|k| TcpListener::bind((ip(k), port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on 127.0.0.1-{ips} in 100 tries")
}

/// The ports every node uses on its own IP.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    /// CQL port.
    pub cql: u16,
    /// Shard-aware CQL port.
    pub shard_aware: u16,
    /// Internode port.
    pub internode: u16,
}

impl Ports {
    /// Three ports free on 127.0.0.1 up to 127.0.0.`ips`.
    pub fn free_on(ips: u8) -> Ports {
        Ports {
            cql: port_free_on_all_ips(ips),
            shard_aware: port_free_on_all_ips(ips),
            internode: port_free_on_all_ips(ips),
        }
    }

    /// The CQL address of node `index`.
    pub fn cql_of(self, index: u8) -> SocketAddr {
        SocketAddr::new(ip(index), self.cql)
    }

    /// The internode address of node `index`.
    pub fn internode_of(self, index: u8) -> SocketAddr {
        SocketAddr::new(ip(index), self.internode)
    }
}

/// One `sluice serve` process on `dir/node<index>` (log `dir/node<index>.log`), one shard,
/// eight tokens, periodic durability; nodes after the first join through node 1. SIGKILL on
/// drop.
pub struct ServeNode {
    /// The node's number, which is also the last byte of its IP.
    pub index: u8,
    child: Option<Child>,
    data: PathBuf,
    log: PathBuf,
    ports: Ports,
    extra: Vec<String>,
}

impl ServeNode {
    /// Starts node `index` with `extra` flags and returns once its CQL port accepts, with the
    /// time that took.
    pub fn start(dir: &Path, index: u8, ports: Ports, extra: &[&str]) -> (ServeNode, Duration) {
        let mut node = ServeNode {
            index,
            child: None,
            data: dir.join(format!("node{index}")),
            log: dir.join(format!("node{index}.log")),
            ports,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
        };
        let took = node.restart();
        (node, took)
    }

    /// Starts the process again on the same directory and flags (after [`ServeNode::kill9`])
    /// and returns once its CQL port accepts, with the time that took.
    pub fn restart(&mut self) -> Duration {
        debug_assert!(self.child.is_none(), "node {} still runs", self.index);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice"));
        command
            .arg("serve")
            .args(["--listen", &self.cql().to_string()])
            .args(["--shard-aware-port", &self.ports.shard_aware.to_string()])
            .args([
                "--internode-listen",
                &self.ports.internode_of(self.index).to_string(),
            ])
            .args([
                "--metrics-listen",
                "off",
                "--shards",
                "1",
                "--num-tokens",
                "8",
            ])
            .args(["--durability", "periodic"])
            .args(&self.extra)
            .arg("--data-dir")
            .arg(&self.data);
        if self.index > 1 {
            command.args(["--seeds", &self.ports.internode_of(1).to_string()]);
        }
        let started = Instant::now();
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start sluice serve");
        self.child = Some(child);
        let addr = self.cql();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("node {} exited ({status}): {}", self.index, self.output());
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < NODE_START_TIMEOUT,
                "node {} did not open {addr} within {NODE_START_TIMEOUT:?}: {}",
                self.index,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The node's CQL address.
    pub fn cql(&self) -> SocketAddr {
        self.ports.cql_of(self.index)
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("the node runs");
        let status = terminate(&mut child, &format!("node {}", self.index));
        assert!(status.success(), "node {}: {status}", self.index);
    }

    /// SIGTERM, then waits for a clean exit; the node can be started again
    /// ([`ServeNode::restart`]).
    pub fn shutdown(&mut self) {
        let mut child = self.child.take().expect("the node runs");
        let status = terminate(&mut child, &format!("node {}", self.index));
        assert!(status.success(), "node {}: {status}", self.index);
    }

    /// Waits for the process to exit by itself (after a decommission, say) and returns its
    /// status; panics if it runs on past `within`.
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("the node runs");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not exit within {within:?}",
                self.index
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, no shutdown of any kind.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The node's stdout and stderr so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServeNode {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// SIGTERM to `child` and its exit status; panics naming `what` if it runs on past
/// [`STOP_TIMEOUT`].
fn terminate(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let pid = child.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not stop within {STOP_TIMEOUT:?} of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `sluice cluster` process (no metrics port, periodic durability); SIGKILL on drop,
/// which takes its nodes with it.
pub struct LocalCluster {
    /// The process.
    pub child: Child,
    out: PathBuf,
}

impl LocalCluster {
    /// Runs `sluice cluster --nodes nodes` on `dir` with `extra` flags, its stdout in
    /// `dir/out_name`, and waits until it says how to connect.
    pub fn start(
        dir: &Path,
        nodes: u8,
        ports: Ports,
        out_name: &str,
        extra: &[&str],
    ) -> LocalCluster {
        let out = dir.join(out_name);
        let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["cluster", "--nodes", &nodes.to_string(), "--dir"])
            .arg(dir)
            .args(["--cql-port", &ports.cql.to_string()])
            .args(["--shard-aware-port", &ports.shard_aware.to_string()])
            .args(["--internode-port", &ports.internode.to_string()])
            .args(["--metrics-port", "off"])
            .arg("--serve-arg=--durability=periodic")
            .args(extra)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice cluster");
        let mut cluster = LocalCluster { child, out };
        let started = Instant::now();
        while !std::fs::read_to_string(&cluster.out)
            .unwrap_or_default()
            .contains("connect with")
        {
            if let Ok(Some(status)) = cluster.child.try_wait() {
                panic!("sluice cluster exited ({status}): {}", cluster.output());
            }
            assert!(
                started.elapsed() < CLUSTER_START_TIMEOUT,
                "the cluster did not start within {CLUSTER_START_TIMEOUT:?}: {}",
                cluster.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// SIGTERM to `sluice cluster`: it exits 0 and no node accepts on `addrs` any more.
    pub fn stop(&mut self, addrs: &[SocketAddr]) {
        let status = terminate(&mut self.child, "sluice cluster");
        assert!(status.success(), "{status}: {}", self.output());
        for addr in addrs {
            assert!(
                TcpStream::connect_timeout(addr, Duration::from_millis(500)).is_err(),
                "{addr} still accepts after the cluster stopped"
            );
        }
    }

    /// What `sluice cluster` printed, then every node's log.
    pub fn output(&self) -> String {
        let mut text = std::fs::read_to_string(&self.out).unwrap_or_default();
        if let Ok(dir) = std::fs::read_dir(self.out.parent().unwrap()) {
            for entry in dir.flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let mut log = String::new();
                    if let Ok(mut f) = std::fs::File::open(&path) {
                        let _ = f.read_to_string(&mut log);
                    }
                    text += &format!("\n--- {}\n{log}", path.display());
                }
            }
        }
        text
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A session builder whose every statement goes to node `addr`, whatever hosts the driver
/// discovers.
fn pinned_to(addr: SocketAddr) -> SessionBuilder {
    let policy = SingleTargetLoadBalancingPolicy::new(NodeIdentifier::NodeAddress(addr), None);
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy)
        .build();
    SessionBuilder::new()
        .known_node(addr.to_string())
        .default_execution_profile_handle(profile.into_handle())
        .connection_timeout(Duration::from_secs(20))
}

/// Builds the session and waits until it knows the cluster as the nodes describe it.
///
/// When the driver's first read of `system.local` and `system.peers` fails (a node's admission
/// sheds it on a loaded machine), the Rust driver starts on placeholder metadata with made-up
/// host ids and replaces it on its next attempt a second later. A DDL statement sent before
/// that swap then waits for schema agreement with a coordinator whose host id no longer
/// exists, and fails with `RequiredHostAbsent` after the whole agreement timeout.
pub async fn build_with_metadata(builder: SessionBuilder) -> Session {
    let session = builder.build().await.expect("connect");
    let deadline = Instant::now() + LIVENESS_TIMEOUT;
    loop {
        let answered = session
            .query_unpaged("SELECT host_id FROM system.local WHERE key = 'local'", &[])
            .await
            .ok()
            .and_then(|r| r.into_rows_result().ok())
            .and_then(|r| r.single_row::<(uuid::Uuid,)>().ok());
        if let Some((host_id,)) = answered {
            let state = session.get_cluster_state();
            if state.get_nodes_info().iter().any(|n| n.host_id == host_id) {
                return session;
            }
            eprintln!("the driver's metadata lacks host {host_id}: its first read failed");
        }
        assert!(
            Instant::now() < deadline,
            "the driver did not read the cluster's metadata within {LIVENESS_TIMEOUT:?}"
        );
        // A failed refresh (shed again) is retried on the next round.
        let _ = session.refresh_metadata().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A session whose every statement goes to node `addr`, whatever hosts the driver discovers;
/// the driver still waits for schema agreement over every node it discovered.
pub async fn session_on(addr: SocketAddr) -> Session {
    build_with_metadata(
        pinned_to(addr)
            // Fail fast rather than wait the default 60 s if the versions never agree.
            .schema_agreement_timeout(Duration::from_secs(10)),
    )
    .await
}

/// A session pinned to `addr` that does not wait for schema agreement (for when a node is
/// down).
pub async fn session_on_without_agreement_wait(addr: SocketAddr) -> Session {
    build_with_metadata(pinned_to(addr).auto_await_schema_agreement(false)).await
}

/// `CREATE KEYSPACE ks` with SimpleStrategy and `rf` replicas.
pub async fn create_simple_keyspace(session: &Session, ks: &str, rf: u32) {
    session
        .query_unpaged(
            format!(
                "CREATE KEYSPACE {ks} WITH replication = \
                 {{'class': 'SimpleStrategy', 'replication_factor': {rf}}}"
            ),
            &[],
        )
        .await
        .unwrap();
}

/// Runs `sluice nodetool` with `args` against node `index`, bounded by `timeout_secs` on the
/// tool's side, and returns its output; panics on failure.
pub fn nodetool(index: u8, ports: Ports, timeout_secs: u32, args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("nodetool")
        .args([
            "--host",
            &ports.internode_of(index).to_string(),
            "--timeout",
            &timeout_secs.to_string(),
        ])
        .args(args)
        .output()
        .expect("run sluice nodetool");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "nodetool {args:?}: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A session whose every statement goes to `addr` and is never retried elsewhere, so that a
/// test sees each node's own answer.
pub async fn session_without_retries(addr: SocketAddr) -> Session {
    let policy = SingleTargetLoadBalancingPolicy::new(NodeIdentifier::NodeAddress(addr), None);
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy)
        .retry_policy(std::sync::Arc::new(
            scylla::policies::retry::FallthroughRetryPolicy::new(),
        ))
        .request_timeout(Some(Duration::from_secs(10)))
        .build();
    build_with_metadata(
        SessionBuilder::new()
            .known_node(addr.to_string())
            .default_execution_profile_handle(profile.into_handle())
            .connection_timeout(Duration::from_secs(20)),
    )
    .await
}

/// The replicas `session`'s node places `token` of keyspace `ks` on
/// (`system_views.token_replicas`).
pub async fn token_replicas(session: &Session, ks: &str, token: i64) -> Vec<IpAddr> {
    let rows = query_unless_shed(
        session,
        "SELECT replicas FROM system_views.token_replicas \
         WHERE keyspace_name = ? AND token_value = ?",
        (ks, token),
    )
    .await
    .unwrap()
    .into_rows_result()
    .unwrap();
    let (replicas,): (Vec<IpAddr>,) = rows.single_row().unwrap();
    replicas
}

/// How many times in a row a request may be shed by admission before the test fails.
pub const SHED_RETRIES: usize = 20;

/// Whether `e` is the admission's load shedding (not a refusal of the read itself).
pub fn shed(e: &scylla::errors::ExecutionError) -> bool {
    e.to_string().contains("Server is overloaded")
}

/// `session.query_unpaged(statement, values)`, asked again while admission sheds it (a shed
/// request was not run, so asking again is safe).
pub async fn query_unless_shed(
    session: &Session,
    statement: impl Into<scylla::statement::Statement> + Clone,
    values: impl scylla::serialize::row::SerializeRow + Clone,
) -> Result<scylla::response::query_result::QueryResult, scylla::errors::ExecutionError> {
    let mut tries = 0;
    loop {
        match session
            .query_unpaged(statement.clone(), values.clone())
            .await
        {
            Err(e) if shed(&e) && tries < SHED_RETRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// One page of `prepared`, asked again while admission sheds it.
pub async fn page_of(
    session: &Session,
    prepared: &scylla::statement::prepared::PreparedStatement,
    values: impl scylla::serialize::row::SerializeRow + Clone,
    state: &scylla::response::PagingState,
) -> Result<
    (
        scylla::response::query_result::QueryResult,
        scylla::response::PagingStateResponse,
    ),
    scylla::errors::ExecutionError,
> {
    let mut tries = 0;
    loop {
        match session
            .execute_single_page(prepared, values.clone(), state.clone())
            .await
        {
            Err(e) if shed(&e) && tries < SHED_RETRIES => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

/// How long [`eventually`] waits for a cluster to see a change (a peer up or down, a replay).
pub const LIVENESS_TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `check` every 200 ms until it holds, failing the test after [`LIVENESS_TIMEOUT`].
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + LIVENESS_TIMEOUT;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "{what} within {LIVENESS_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until `session`'s node lists `peers` other nodes in `system.peers` (a peer is listed
/// once it owns tokens), failing the test after [`LIVENESS_TIMEOUT`].
pub async fn wait_for_peers(session: &Session, peers: usize) {
    eventually(&format!("the node sees its {peers} peers"), || async {
        session
            .query_unpaged("SELECT peer FROM system.peers", &[])
            .await
            .ok()
            .and_then(|r| r.into_rows_result().ok())
            .is_some_and(|r| r.rows_num() == peers)
    })
    .await;
}

/// A session that sends each request to the next node in turn, whatever its token, and never
/// retries, so that every node's own answer is seen.
pub async fn round_robin_session(addrs: &[SocketAddr]) -> Session {
    let policy = scylla::policies::load_balancing::DefaultPolicy::builder()
        .token_aware(false)
        .build();
    let profile = ExecutionProfile::builder()
        .load_balancing_policy(policy)
        .retry_policy(std::sync::Arc::new(
            scylla::policies::retry::FallthroughRetryPolicy::new(),
        ))
        .request_timeout(Some(Duration::from_secs(10)))
        .build();
    build_with_metadata(
        SessionBuilder::new()
            .known_nodes(addrs.iter().map(ToString::to_string))
            .default_execution_profile_handle(profile.into_handle())
            .connection_timeout(Duration::from_secs(20)),
    )
    .await
}

/// What each node logs when its metadata group role or the leader it follows changes.
pub const LEADERSHIP_LINE: &str = "metadata group leadership changed";

/// `line` without its terminal colour sequences (ESC [ parameters m), as a node's log
/// prints its fields.
pub fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}
