//! Accepting connections and handing each to a shard.
//!
//! The main port spreads connections round-robin over the shards. The optional shard-aware
//! port (ScyllaDB's) gives a connection from source port `p` to shard `p % N`, which is how
//! shard-aware drivers pick the shard they connect to.

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::shard::ShardHandle;
use crate::{ServerConfig, SharedMetrics};

/// The bound (not yet serving) listeners.
pub struct Listeners {
    main: StdListener,
    shard_aware: Option<StdListener>,
    metrics: Option<StdListener>,
}

impl Listeners {
    /// Binds every configured listener; errors surface at start-up.
    pub fn bind(config: &ServerConfig) -> io::Result<Listeners> {
        let bind = |addr: SocketAddr| -> io::Result<StdListener> {
            let l = StdListener::bind(addr)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
            l.set_nonblocking(true)?;
            Ok(l)
        };
        let main = bind(config.listen)?;
        let shard_aware = match config.shard_aware_port {
            Some(port) => Some(bind(SocketAddr::new(config.listen.ip(), port))?),
            None => None,
        };
        let metrics = match config.metrics_listen {
            Some(addr) => Some(bind(addr)?),
            None => None,
        };
        Ok(Listeners {
            main,
            shard_aware,
            metrics,
        })
    }

    /// The bound main address.
    pub fn main_addr(&self) -> io::Result<SocketAddr> {
        self.main.local_addr()
    }

    /// The bound shard-aware address.
    pub fn shard_aware_addr(&self) -> io::Result<Option<SocketAddr>> {
        self.shard_aware
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()
    }

    /// The bound metrics address.
    pub fn metrics_addr(&self) -> io::Result<Option<SocketAddr>> {
        self.metrics.as_ref().map(|l| l.local_addr()).transpose()
    }

    /// Starts the listener thread: accept loops and the metrics endpoint.
    pub fn spawn(
        self,
        config: Arc<ServerConfig>,
        shards: Arc<Vec<ShardHandle>>,
        metrics: SharedMetrics,
        extra: crate::metrics::ExtraMetrics,
        mut shutdown: watch::Receiver<bool>,
    ) -> io::Result<JoinHandle<()>> {
        let _ = config;
        std::thread::Builder::new()
            .name("sluice-listener".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        warn!("cannot build the listener runtime: {e}");
                        return;
                    }
                };
                rt.block_on(async move {
                    let main = match TcpListener::from_std(self.main) {
                        Ok(l) => l,
                        Err(e) => {
                            warn!("cannot register the listener: {e}");
                            return;
                        }
                    };
                    let mut tasks = tokio::task::JoinSet::new();
                    tasks.spawn(accept_loop(main, shards.clone(), Pick::RoundRobin));
                    if let Some(l) = self.shard_aware.and_then(|l| TcpListener::from_std(l).ok()) {
                        tasks.spawn(accept_loop(l, shards.clone(), Pick::SourcePort));
                    }
                    if let Some(l) = self.metrics.and_then(|l| TcpListener::from_std(l).ok()) {
                        tasks.spawn(crate::metrics::serve(l, metrics, extra));
                    }
                    let _ = shutdown.changed().await;
                    tasks.abort_all();
                    info!("listeners closed");
                });
            })
    }
}

/// How a listener chooses the shard of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// Next shard in turn.
    RoundRobin,
    /// `source_port % shards` (the shard-aware port).
    SourcePort,
}

/// The shard for the `nth` connection from `peer`.
pub fn pick_shard(pick: Pick, nth: usize, peer: SocketAddr, shards: usize) -> usize {
    match pick {
        Pick::RoundRobin => nth % shards,
        Pick::SourcePort => peer.port() as usize % shards,
    }
}

async fn accept_loop(listener: TcpListener, shards: Arc<Vec<ShardHandle>>, pick: Pick) {
    let mut nth = 0usize;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shard = pick_shard(pick, nth, peer, shards.len());
        nth = nth.wrapping_add(1);
        let Ok(std_stream) = stream.into_std() else {
            continue;
        };
        // Bounded: when a shard's queue is full the acceptor waits (accept backpressure).
        if shards[shard].connections.send(std_stream).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_choice() {
        let peer: SocketAddr = "127.0.0.1:50003".parse().unwrap();
        assert_eq!(pick_shard(Pick::SourcePort, 0, peer, 4), 50003 % 4);
        assert_eq!(pick_shard(Pick::SourcePort, 7, peer, 4), 3);
        assert_eq!(pick_shard(Pick::RoundRobin, 5, peer, 4), 1);
        assert_eq!(pick_shard(Pick::RoundRobin, 8, peer, 4), 0);
    }
}
