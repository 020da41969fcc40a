//! `sluice cluster --nodes 3` on 127.0.0.1-3: the nodes get distinct tokens from the
//! topology group (their `system.local`), each places the tokens of the nodes it knows on
//! those nodes (`system_views.token_replicas`, for keyspaces created through node 1 alone),
//! SIGTERM to the parent stops every node, and a restart on the same directories (all nodes at
//! once) keeps every node's tokens.

mod common;

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use common::cluster::{session_on, token_replicas, LocalCluster, Ports};
use scylla::client::session::Session;

const NODES: u8 = 3;
const NUM_TOKENS: usize = 16;

async fn local_tokens(session: &Session) -> Vec<i64> {
    let rows = session
        .query_unpaged("SELECT tokens FROM system.local", &[])
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    let (tokens,): (Vec<String>,) = rows.single_row().unwrap();
    tokens.iter().map(|t| t.parse().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_local_nodes_share_one_ring() {
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::free_on(NODES);
    let tokens_flag = ["--num-tokens", &NUM_TOKENS.to_string()];
    let mut cluster = LocalCluster::start(dir.path(), NODES, ports, "cluster.out", &tokens_flag);

    let addrs: Vec<SocketAddr> = (1..=NODES).map(|k| ports.cql_of(k)).collect();
    let mut sessions = Vec::new();
    for addr in &addrs {
        sessions.push(session_on(*addr).await);
    }
    let mut tokens_of = Vec::new();
    for session in &sessions {
        let tokens = local_tokens(session).await;
        assert_eq!(tokens.len(), NUM_TOKENS, "{}", cluster.output());
        tokens_of.push(tokens);
    }
    let all: BTreeSet<i64> = tokens_of.iter().flatten().copied().collect();
    assert_eq!(
        all.len(),
        usize::from(NODES) * NUM_TOKENS,
        "the nodes' tokens are distinct"
    );

    // The keyspaces are created through node 1 alone; the metadata group takes them to the
    // other nodes.
    for (ks, rf) in [("ring_one", 1), ("ring_three", 3)] {
        sessions[0]
            .query_unpaged(
                format!(
                    "CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = \
                     {{'class': 'SimpleStrategy', 'replication_factor': {rf}}}"
                ),
                &[],
            )
            .await
            .unwrap();
    }
    // Every node follows the topology group's ring: each sees the whole ring.
    let everyone: BTreeSet<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    let mut compared = 0;
    for session in &sessions {
        for (owner, tokens) in tokens_of.iter().enumerate() {
            let owner_ip = addrs[owner].ip();
            for token in tokens {
                // With one replica, a node's own token is placed on that node alone.
                assert_eq!(
                    token_replicas(session, "ring_one", *token).await,
                    vec![owner_ip]
                );
                // With three, every node holds it, the owner first.
                let three = token_replicas(session, "ring_three", *token).await;
                assert_eq!(three.first(), Some(&owner_ip));
                assert_eq!(three.iter().copied().collect::<BTreeSet<_>>(), everyone);
                compared += 1;
            }
        }
    }
    assert_eq!(
        compared,
        NUM_TOKENS * usize::from(NODES) * usize::from(NODES)
    );
    for session in sessions {
        drop(session);
    }

    cluster.stop(&addrs);

    // A restart on the same directories: the group is replayed and every node keeps its tokens.
    let mut cluster = LocalCluster::start(dir.path(), NODES, ports, "restart.out", &tokens_flag);
    for (addr, before) in addrs.iter().zip(&tokens_of) {
        let session = session_on(*addr).await;
        assert_eq!(&local_tokens(&session).await, before, "{addr}");
    }
    cluster.stop(&addrs);
}
