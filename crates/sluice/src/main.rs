//! The `sluice` binary: `sluice serve` starts a node, `sluice cluster` a local cluster of
//! them. Other subcommands (`bench`, `demo`) are mounted from their crates as one `Command`
//! variant each.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod config;
mod identity;
mod local_cluster;
mod nodetool;
mod schema_link;
mod stream_link;
mod txn_link;

use std::net::IpAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tracing::{error, info, warn};

use config::{DurabilityArg, ResolvedConfig, ServeArgs};

/// mimalloc (its v2 line) rather than glibc's malloc: a served write costs 17% fewer instructions
/// (`scripts/insns.sh`), and a flushed 64 MiB memtable is freed in less CPU time. Called
/// without its aligned path for ordinary layouts (`sluice_alloc`).
#[global_allocator]
static ALLOC: sluice_alloc::Allocator = sluice_alloc::Allocator;

/// Sluice: a CQL (Cassandra/ScyllaDB protocol v4) database that keeps its goodput under
/// overload.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Subcommands. Adding one is one variant here and one arm in `main`.
#[derive(Debug, Subcommand)]
enum Command {
    /// Start a node: the CQL listener, its shards and the storage engine.
    Serve(Box<ServeArgs>),
    /// Start a local cluster of N nodes on 127.0.0.1 .. 127.0.0.N; Ctrl-C stops them all.
    Cluster(Box<local_cluster::ClusterArgs>),
    /// An operator's commands to a running node: status, decommission, removenode.
    Nodetool(Box<nodetool::NodetoolArgs>),
    /// Open-loop goodput benchmark against any CQL endpoint (Sluice, Cassandra, ...).
    Bench(Box<sluice_bench::BenchArgs>),
    /// A newcomer's first minute: start a node in a temporary directory, run a short ramp,
    /// write report.html.
    Demo(Box<sluice_bench::DemoArgs>),
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // A load generator stalled on a fresh huge page sends late, and the latency it then
        // measures from the intended send time is its own (`serve` has an option instead).
        let _ = sluice_alloc::set_transparent_huge_pages(false);
    }
    let code = match cli.command {
        Command::Serve(args) => report(serve(*args)),
        Command::Cluster(args) => report(
            std::env::current_exe()
                .context("locating the sluice executable")
                .and_then(|exe| local_cluster::run(*args, &exe)),
        ),
        Command::Nodetool(args) => report(run_tool(nodetool::run(*args))),
        Command::Bench(args) => report(
            args.runtime()
                .context("starting the generator's runtime")
                .and_then(|rt| rt.block_on(sluice_bench::run_bench(*args))),
        ),
        Command::Demo(args) => report(
            std::env::current_exe()
                .context("locating the sluice executable")
                .and_then(|exe| run_tool(sluice_bench::run_demo(*args, &exe))),
        ),
    };
    std::process::exit(code);
}

/// Exit code of a subcommand, printing its error.
fn report(result: Result<()>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            1
        }
    }
}

/// Runs a client-side tool (the demo) on a multi-threaded runtime of its own.
fn run_tool(fut: impl std::future::Future<Output = Result<()>>) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tool's runtime")?
        .block_on(fut)
}

fn init_logging(filter: Option<&str>) {
    use tracing_subscriber::EnvFilter;
    let filter = match filter {
        Some(f) => EnvFilter::new(f),
        // openraft narrates every election at info.
        None => EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn")),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}

fn serve(args: ServeArgs) -> Result<()> {
    let cfg = args.resolve()?;
    init_logging(cfg.log.as_deref());
    // Before the shards start, so that their heaps grow a 4 KiB page at a time.
    if let Err(e) = sluice_alloc::set_transparent_huge_pages(cfg.transparent_huge_pages) {
        warn!(
            "cannot set transparent huge pages to {}: {e}",
            cfg.transparent_huge_pages
        );
    }
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("cannot create data dir {}", cfg.data_dir.display()))?;
    let identity = identity::load_or_create(&cfg.data_dir, &cfg.cluster)?;
    let host_id = identity.host_id;

    let durability = match cfg.durability {
        DurabilityArg::Batch => sluice_storage::Durability::Batch,
        DurabilityArg::Periodic => sluice_storage::Durability::Periodic {
            interval: cfg.periodic_sync,
        },
    };
    let storage = sluice_storage::Storage::open(sluice_storage::StorageConfig {
        path: cfg.data_dir.join("db"),
        durability,
        cache_bytes: cfg.cache_bytes,
        stores: cfg.shards,
    })
    .map_err(|e| anyhow::anyhow!("cannot open storage in {}: {e:?}", cfg.data_dir.display()))?;
    storage.set_tombstone_failure_threshold(cfg.tombstone_failure_threshold);
    storage.set_write_limits(
        sluice_storage::WriteLimits::new(cfg.max_value_bytes, cfg.max_mutation_bytes)
            .with_max_partition_bytes(cfg.max_partition_bytes),
    );
    storage.set_min_free_disk_bytes(cfg.min_free_disk_bytes);

    let tls = match &cfg.tls {
        Some(files) => Some(Arc::new(
            sluice_server::tls::ReloadableTls::load(files.clone())
                .map_err(|e| anyhow::anyhow!("cannot load the TLS files: {e}"))?,
        )),
        None => None,
    };
    // The node is in the ring (a new cluster, a join through seeds, or a replayed restart)
    // before any client can reach it.
    let cluster_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("sluice-cluster")
        .enable_all()
        .build()
        .context("starting the cluster runtime")?;
    let cluster = cluster_runtime
        .block_on(sluice_cluster::ClusterNode::start(cluster_config(
            &cfg, &identity,
        )))
        .map_err(|e| anyhow::anyhow!("cannot start the cluster node: {e}"))?;
    info!(
        internode = %cluster.internode_addr(),
        seeds = ?cfg.cluster.seeds,
        nodes = cluster.ring().borrow().nodes().len(),
        "in the ring"
    );
    let engine = sluice_engine::Engine::open_with_auth(
        storage.clone(),
        node_info(&cfg, &identity, &cluster)?,
        cfg.auth,
    )
    .map_err(|e| anyhow::anyhow!("cannot open the engine: {e:?}"))?;
    engine.set_lwt_serialize_through_durability(cfg.lwt_serialize_through_durability);
    engine.set_hinted_handoff(cfg.hinted_handoff);
    // The schema is the group's before any client can reach this node; DDL goes through it.
    schema_link::connect(&engine, &cluster, cluster_runtime.handle())?;
    // Committed transactions (those replayed from the log included) reach this node's storage.
    txn_link::follow(&engine, &cluster, &cfg.data_dir);
    cluster
        .lifecycle()
        .attach(Arc::new(stream_link::EngineData::new(
            engine.clone(),
            storage.clone(),
            cfg.data_dir.join("db"),
        )));
    engine.transactions().set_limited(cfg.txn_adaptive_limit);
    engine.set_txn_prepare_under_lock(cfg.txn_prepare_under_lock);
    let coordination = if !cfg.test_only_fake_peers.is_empty() {
        warn!(peers = ?cfg.test_only_fake_peers, "TEST ONLY: pretending to have peers");
        engine.set_ring(Arc::new(fake_peer_ring(
            engine.node(),
            &cfg.test_only_fake_peers,
        )?));
        None
    } else {
        // Peers, tokens and events follow the topology group's ring from now on.
        cluster_runtime.spawn(sluice_engine::follow_ring(engine.clone(), cluster.ring()));
        // Statements of replicated keyspaces go to their replicas; peers' requests run here.
        let _runtime = cluster_runtime.enter();
        // Transactions and LWT of replicated tables go through the cluster's transaction log.
        txn_link::connect(&engine, &cluster, cluster_runtime.handle());
        // Hints a previous run left are replayed once their replicas are up (even with hinted
        // handoff now off, which only stops new ones).
        engine
            .open_hints(sluice_engine::hints::HintConfig::new(
                cfg.data_dir.join("hints"),
            ))
            .with_context(|| {
                format!(
                    "cannot open the hint directory in {}",
                    cfg.data_dir.display()
                )
            })?;
        Some(
            sluice_cluster::replica::Coordination::start(&cluster, engine.clone())
                .context("cannot start the coordinator")?,
        )
    };
    // A joining node serves once it has the data of its ranges.
    let streamed = cluster_runtime
        .block_on(cluster.lifecycle().finish_join())
        .map_err(|e| anyhow::anyhow!("cannot finish joining the ring: {e}"))?;
    if streamed.ranges > 0 {
        info!(
            ranges = streamed.ranges,
            records = streamed.records,
            bytes = streamed.bytes,
            "joined the ring with the data of its ranges"
        );
    }

    let mut config = server_config(&cfg, host_id);
    config.tls = tls.clone();
    let server = sluice_server::Server::start(config, engine.clone(), storage.ack_barrier())
        .context("cannot start the server")?;
    info!(
        listen = %server.local_addr(),
        shard_aware = ?server.shard_aware_addr(),
        metrics = ?server.metrics_addr(),
        shards = cfg.shards,
        durability = ?cfg.durability,
        data_dir = %cfg.data_dir.display(),
        "sluice serving"
    );

    let left = cluster.lifecycle().left();
    if wait_for_signal(tls.as_deref(), left)? == Stop::Decommissioned {
        info!("decommissioned: this node has left the ring; stopping");
        // The operator's answer is on its way out on the internode connection.
        std::thread::sleep(DECOMMISSION_ANSWER_GRACE);
    }
    info!("shutting down: no new connections, answering in-flight requests");
    server.shutdown();
    if let Err(e) = cluster_runtime.block_on(cluster.stop()) {
        warn!("the metadata group did not stop cleanly: {e}");
    }
    if let Some(coordination) = coordination {
        coordination.join();
    }
    // The hints queued since the last batch are written before the process ends.
    engine.close_hints();
    drop(engine);
    match storage.close() {
        Ok(()) => info!("storage flushed and closed"),
        Err(e) => {
            error!("storage close failed: {e:?}");
            anyhow::bail!("storage close failed: {e:?}");
        }
    }
    Ok(())
}

/// How long a decommissioned node waits before it stops, so that its answer to the operator
/// is written.
const DECOMMISSION_ANSWER_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Why a node stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGINT or SIGTERM.
    Signal,
    /// It left the ring (`nodetool decommission`).
    Decommissioned,
}

/// Blocks until SIGINT or SIGTERM, or until `left` turns true; with TLS on, a SIGHUP reloads
/// the certificate files (new connections use them; open ones keep theirs).
fn wait_for_signal(
    tls: Option<&sluice_server::tls::ReloadableTls>,
    mut left: tokio::sync::watch::Receiver<bool>,
) -> Result<Stop> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("signal runtime")?;
    rt.block_on(async {
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .context("cannot install the SIGTERM handler")?;
            // SIGHUP keeps its default (terminate) unless there is something to reload.
            let mut hup = match tls {
                Some(_) => Some(
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                        .context("cannot install the SIGHUP handler")?,
                ),
                None => None,
            };
            loop {
                let reload = async {
                    match hup.as_mut() {
                        Some(h) => h.recv().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    r = tokio::signal::ctrl_c() => { r.context("cannot wait for SIGINT")?; break; }
                    _ = term.recv() => break,
                    Ok(_) = left.wait_for(|gone| *gone) => return Ok(Stop::Decommissioned),
                    _ = reload => {
                        if let Some(tls) = tls {
                            match tls.reload() {
                                Ok(()) => info!(cert = %tls.files().cert.display(), "TLS certificates reloaded"),
                                Err(e) => warn!(error = %e, "TLS reload failed; the previous certificates stay in use"),
                            }
                        }
                    }
                }
            }
        }
        #[cfg(not(unix))]
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("cannot wait for Ctrl-C")?,
            Ok(_) = left.wait_for(|gone| *gone) => return Ok(Stop::Decommissioned),
        }
        Ok(Stop::Signal)
    })
}

fn server_config(cfg: &ResolvedConfig, host_id: uuid::Uuid) -> sluice_server::ServerConfig {
    let mut s = sluice_server::ServerConfig::new(cfg.listen, cfg.shards, host_id.to_string());
    s.shard_aware_port = cfg.shard_aware_port;
    s.max_frame_bytes = cfg.max_frame_bytes as u32;
    s.metrics_listen = cfg.metrics_listen;
    s.timeouts = sluice_server::DeadlineDefaults {
        read: cfg.read_timeout,
        write: cfg.write_timeout,
        range: cfg.range_timeout,
        other: cfg.other_timeout,
    };
    s.max_inflight_per_connection = cfg.max_inflight_per_connection;
    s.max_inflight_per_shard = cfg.max_inflight_per_shard;
    s.max_inflight_bytes_per_connection = cfg.max_inflight_bytes_per_connection;
    s.max_inflight_bytes_per_shard = cfg.max_inflight_bytes_per_shard;
    s.rate_limiter.table_bits = cfg.rate_limiter_slots.trailing_zeros() as u8;
    s.admission = cfg.admission.map(|a| a.to_config());
    s.test_only_service_delay = cfg.test_only_service_delay;
    s
}

/// TEST ONLY: this node plus a normal node at each of `peers` (this node's data center,
/// rack, CQL port and token count; tokens allocated as for a joining node; host id from
/// the address), so that drivers see a multi-node ring.
fn fake_peer_ring(
    node: &sluice_engine::NodeInfo,
    peers: &[IpAddr],
) -> Result<sluice_ring::TokenMetadata> {
    let mut nodes = vec![node.ring_node()];
    for (i, &ip) in peers.iter().enumerate() {
        if nodes.iter().any(|n| n.cql_address.ip() == ip) {
            anyhow::bail!("fake peer {ip} repeats an address of the ring");
        }
        let ring = sluice_ring::TokenMetadata::new(nodes.clone())?;
        let tokens = sluice_ring::allocate_tokens(&ring, node.tokens.len(), i as u64 + 1)
            .map_err(|e| anyhow::anyhow!("cannot allocate fake peer tokens: {e}"))?;
        let host_bits = match ip {
            IpAddr::V4(v4) => u128::from(u32::from(v4)),
            IpAddr::V6(v6) => u128::from(v6),
        };
        nodes.push(sluice_ring::Node {
            host_id: uuid::Uuid::from_u128(host_bits),
            cql_address: std::net::SocketAddr::new(ip, node.port),
            internode_address: std::net::SocketAddr::new(ip, node.internode_address.port()),
            dc: node.data_center.clone(),
            rack: node.rack.clone(),
            tokens,
            state: sluice_ring::NodeState::Normal,
        });
    }
    Ok(sluice_ring::TokenMetadata::new(nodes)?)
}

/// The address drivers are told to reach this node at (never 0.0.0.0).
fn rpc_address(cfg: &ResolvedConfig) -> IpAddr {
    if cfg.listen.ip().is_unspecified() {
        IpAddr::from([127, 0, 0, 1])
    } else {
        cfg.listen.ip()
    }
}

fn cluster_config(
    cfg: &ResolvedConfig,
    id: &identity::NodeIdentity,
) -> sluice_cluster::ClusterConfig {
    let cql_addr = std::net::SocketAddr::new(rpc_address(cfg), cfg.listen.port());
    let mut config = sluice_cluster::ClusterConfig::new(
        &id.cluster_name,
        id.host_id,
        cql_addr,
        cfg.cluster.internode_listen,
        &cfg.data_dir,
    );
    config.seeds = cfg.cluster.seeds.clone();
    config.dc = id.dc.clone();
    config.rack = id.rack.clone();
    // The configuration accepts at most 1024 tokens.
    config.num_tokens = u16::try_from(cfg.cluster.num_tokens).unwrap_or(u16::MAX);
    // A node that joins serves once it has streamed the data of its ranges.
    config.stream_on_join = true;
    config
}

fn node_info(
    cfg: &ResolvedConfig,
    id: &identity::NodeIdentity,
    cluster: &sluice_cluster::ClusterNode,
) -> Result<sluice_engine::NodeInfo> {
    if cfg.listen.ip().is_unspecified() {
        warn!("listening on an unspecified address; advertising 127.0.0.1 to drivers");
    }
    let mut node = sluice_engine::NodeInfo::single(rpc_address(cfg), cfg.listen.port(), id.host_id);
    node.cluster_name = id.cluster_name.clone();
    node.data_center = id.dc.clone();
    node.rack = id.rack.clone();
    // The topology group allocated the tokens; it is the truth for them.
    node.tokens = cluster.tokens().iter().map(|t| t.0).collect();
    node.internode_address = cluster.internode_addr();
    // The engine starts from the ring of this node alone, then follows the group's ring;
    // checked here for a clear message.
    node.single_node_ring()
        .map_err(|e| anyhow::anyhow!("invalid tokens from the topology group: {e}"))?;
    // Cassandra's names and formats, so that a benchmark can check both sides' durability.
    let sync = match cfg.durability {
        DurabilityArg::Batch => "batch",
        DurabilityArg::Periodic => "periodic",
    };
    node.settings = vec![
        ("commitlog_sync".into(), sync.into()),
        (
            "commitlog_sync_period".into(),
            format!("{}ms", cfg.periodic_sync.as_millis()),
        ),
        (
            "native_transport_port".into(),
            cfg.listen.port().to_string(),
        ),
        ("shards".into(), cfg.shards.to_string()),
        (
            "authenticator".into(),
            match cfg.auth.authenticator {
                sluice_engine::auth::AuthenticatorKind::AllowAll => "AllowAllAuthenticator",
                sluice_engine::auth::AuthenticatorKind::Password => "PasswordAuthenticator",
            }
            .into(),
        ),
        (
            "authorizer".into(),
            match cfg.auth.authorizer {
                sluice_engine::auth::AuthorizerKind::AllowAll => "AllowAllAuthorizer",
                sluice_engine::auth::AuthorizerKind::Cassandra => "CassandraAuthorizer",
            }
            .into(),
        ),
        (
            "client_encryption_options_enabled".into(),
            cfg.tls.is_some().to_string(),
        ),
    ];
    Ok(node)
}
